"""AMPD sessions in the live world: a two-round conversation through `pdserve serve`."""

from __future__ import annotations

import json
import os
import signal
import threading

import httpx
import torch
from server_helpers import running_server

from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.live.sessions import LiveSessions
from pdserve.types import Request


def fresh_greedy(prompt_ids: list[int], tokens: int) -> str:
    """The request on one in-process engine, from scratch."""
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny", seed=0)
    engine = Engine(model, tokenizer, 64)
    engine.add(0, prompt_ids, SamplingParams(max_tokens=tokens, temperature=0.0))
    engine.run([], [(0, len(prompt_ids))])
    while not engine.sequences[0].finish_reason:
        engine.run([0], [])
    return engine.text_of(0)



def record_submissions(driver) -> list:
    """The driver's LiveRequests, in submission order, as the server submits them."""
    submitted = []
    submit = driver.submit

    def recording_submit(*args, **kwargs):
        live = submit(*args, **kwargs)
        submitted.append(live)
        return live
    driver.submit = recording_submit
    return submitted


def session_round(base: str, session: str, prompt: list[int], max_tokens: int) -> str:
    """One greedy round of session `session`; its text."""
    reply = httpx.post(f"{base}/v1/completions", headers={"X-Session-Id": session},
                       timeout=60, json={"model": "tiny", "prompt": prompt,
                                         "max_tokens": max_tokens, "temperature": 0})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def test_second_round_prefills_only_new_tokens_on_the_bound_worker(tmp_path):
    # 1 prefill + 1 decode worker. A TTFT SLO nobody meets and an ITL SLO everybody meets
    # make Alg. 1 run round 2 locally on the session's decode worker (line 4); round 1,
    # before any TTFT sample, goes to the prefill worker (line 2).
    tokenizer = TextTokenizer.shipped()
    # (the workers' prefix cache is off: the third request checks a from-scratch prefill)
    with running_server(tmp_path, {
            "cluster.instances": 2, "policy.name": "ampd", "cluster.prefill": 1,
            "cluster.decode": 1, "slo.ttft_s": 1e-6, "slo.tpot_s": 100.0,
            "instance.prefix_block_tokens": 0
    }) as (base, driver):
        submitted = record_submissions(driver)
        headers = {"X-Session-Id": "conversation-1"}
        first = tokenizer.encode("The quick brown fox")
        reply = httpx.post(f"{base}/v1/completions", headers=headers, timeout=60, json={
            "model": "tiny", "prompt": first, "max_tokens": 8, "temperature": 0})
        assert reply.status_code == 200, reply.text
        answer = list(submitted[0].token_ids)
        assert submitted[0].request.decode_instance == 1  # bound to the decode worker
        assert submitted[0].request.prefill_instance == 0  # round 1: remote
        before = driver.engine_counters[1]
        second = first + answer + tokenizer.encode(" jumps over the lazy dog")
        reply = httpx.post(f"{base}/v1/completions", headers=headers, timeout=60, json={
            "model": "tiny", "prompt": second, "max_tokens": 8, "temperature": 0})
        assert reply.status_code == 200, reply.text
        request = submitted[1].request
        assert request.prefill_instance == request.decode_instance == 1  # local, bound
        after = driver.engine_counters[1]
        history = len(first) + len(answer) - 1  # the last answer token was never fed back
        assert after[1] - before[1] == history  # reused from the kept KV
        assert after[0] - before[0] == len(second) - history  # only the new tokens computed
        assert reply.json()["choices"][0]["text"] == fresh_greedy(second, 8)
        # without the header the same prompt is prefilled from scratch
        counters = dict(driver.engine_counters)
        httpx.post(f"{base}/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": second, "max_tokens": 2, "temperature": 0})
        third = submitted[2].request
        instance = third.prefill_instance
        computed = driver.engine_counters[instance][0] - counters.get(instance, (0, 0))[0]
        assert computed == len(second)
        bad = httpx.post(f"{base}/v1/completions", headers={"X-Session-Id": "x" * 300},
                         timeout=60, json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert bad.status_code == 400 and "X-Session-Id" in bad.text


def test_remote_round_reads_the_history_and_hands_back_only_new_kv(tmp_path):
    # a TTFT SLO everybody meets: Alg. 1 line 2 sends every round to the prefill worker,
    # which reads the session's history from the decode worker instead of recomputing it
    tokenizer = TextTokenizer.shipped()
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "ampd",
                                   "cluster.prefill": 1, "cluster.decode": 1, "slo.ttft_s": 100.0,
                                   "slo.tpot_s": 100.0}) as (base, driver):
        submitted = record_submissions(driver)
        first = tokenizer.encode("Search the web for the capital of France")
        session_round(base, "agent-7", first, 6)
        answer = list(submitted[0].token_ids)
        prefill_before, decode_before = driver.engine_counters[0], driver.engine_counters[1]
        second = first + answer + tokenizer.encode(" Tool result: Paris.")
        text = session_round(base, "agent-7", second, 6)
        request = submitted[1].request
        assert (request.prefill_instance, request.decode_instance) == (0, 1)  # remote
        history = len(first) + len(answer) - 1
        prefill_after, decode_after = driver.engine_counters[0], driver.engine_counters[1]
        assert prefill_after[1] - prefill_before[1] == history  # read, not recomputed
        assert prefill_after[0] - prefill_before[0] == len(second) - history
        assert decode_after[1] - decode_before[1] == history  # merged onto the kept KV
        assert decode_after[0] == decode_before[0]  # the decode worker computed no prefill
        assert text == fresh_greedy(second, 6)


def test_a_round_whose_worker_dies_is_rerun_in_its_session(tmp_path):
    """The decode worker holding a session's history dies mid-stream: the round is re-run
    (its history recomputed) in the same session, with the text a fresh engine gives, and
    the next round of the session is served as usual."""
    tokenizer = TextTokenizer.shipped()
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "ampd",
                                   "cluster.prefill": 1, "cluster.decode": 1, "slo.ttft_s": 100.0,
                                   "slo.tpot_s": 100.0}) as (base, driver):
        submitted = record_submissions(driver)
        headers = {"X-Session-Id": "agent-9"}
        first = tokenizer.encode("Search the web for the capital of France")
        session_round(base, "agent-9", first, 6)
        second = first + list(submitted[0].token_ids) + tokenizer.encode(" Tool: Paris.")
        session_id = submitted[0].request.session_id
        streamed: dict = {}
        started = threading.Event()

        def stream() -> None:
            text, errors = [], []
            with httpx.stream("POST", f"{base}/v1/completions", headers=headers,
                              timeout=120, json={"model": "tiny", "prompt": second,
                                                 "max_tokens": 120, "temperature": 0,
                                                 "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if "error" in chunk:
                            errors.append(chunk["error"]["message"])
                        elif chunk["choices"]:
                            text.append(chunk["choices"][0]["text"])
                            started.set()
            streamed.update(text="".join(text), errors=errors)

        thread = threading.Thread(target=stream)
        thread.start()
        assert started.wait(60)
        os.kill(driver.workers.pid(1), signal.SIGKILL)  # the session's decode worker
        thread.join(120)
        assert streamed["errors"] == [] and streamed["text"] == fresh_greedy(second, 120)
        rerun = submitted[1]
        assert rerun.retries == 1 and rerun.request.session_id == session_id
        third = second + list(rerun.token_ids) + tokenizer.encode(" Done?")
        assert session_round(base, "agent-9", third, 6) == fresh_greedy(third, 6)
        assert submitted[2].request.session_id == session_id


def test_a_dead_workers_sessions_are_unbound():
    sessions = LiveSessions()
    first = Request(1, 0.0, 40, 6)
    sessions.attach(first, "agent")
    first.generated_tokens = 6
    sessions.finished(first, 1)
    bound = Request(2, 1.0, 60, 6)
    sessions.attach(bound, "agent")
    assert (bound.home_instance, bound.history_tokens) == (1, 45)
    sessions.instance_lost(0)  # another worker: nothing changes
    sessions.instance_lost(1)
    later = Request(3, 2.0, 80, 6)
    sessions.attach(later, "agent")
    assert (later.home_instance, later.history_tokens, later.cached_prefix_tokens) == (-1, 0, 0)
    assert later.session_id == first.session_id  # still the same conversation
