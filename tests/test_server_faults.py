"""Worker failures on a live server: a request that breaks the engine fails alone, a worker
that dies is restarted and serves again, the cluster keeps serving while a phase's last
worker is down, and a re-run resumes after exactly the tokens the client has seen.

Faults are injected with the test-only hooks of `pdserve/worker/faults.py` (environment
variables read by the worker processes) and by SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace

import httpx
import pytest
from engine_helpers import tiny_greedy_engine
from server_helpers import metric, running_server
from test_server import PROMPT, local_greedy

from pdserve.engine.tokenizer import TextTokenizer
from pdserve.perf.step_log import read_role_log
from pdserve.types import Role
from pdserve.worker.faults import EXIT_TOKEN_ENV, RAISE_TOKEN_ENV

FAULT_TOKEN = 2047  # the tiny model's last token id; asserted absent from normal outputs


def greedy_ids(prompt: str, tokens: int) -> list[int]:
    engine, ids = tiny_greedy_engine(prompt, tokens)
    return [*ids, *engine.sequences[0].generated]


def stream_text(base: str, max_tokens: int, started: threading.Event, out: dict,
                prompt: str = PROMPT) -> None:
    text, error, chunks = [], None, 0
    with httpx.stream("POST", f"{base}/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                error = chunk["error"]["message"]
                continue
            if chunk.get("usage"):
                out["completion_tokens"] = chunk["usage"]["completion_tokens"]
            if chunk["choices"]:
                text.append(chunk["choices"][0]["text"])
                chunks += 1
                started.set()
    out.update(text="".join(text), error=error)


def kill_worker(driver, instance: int) -> None:
    os.kill(driver.workers.pid(instance), signal.SIGKILL)


def complete(base: str, prompt: str | list[int], max_tokens: int = 5) -> httpx.Response:
    return httpx.post(f"{base}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


def wait_for(condition, timeout_s: float = 90, poll_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(poll_s)


def pids(driver) -> list[int]:
    return [driver.workers.pid(i) for i in range(driver.workers.count)]


def test_a_request_that_breaks_the_engine_fails_alone_and_workers_stay_up(
        tmp_path, monkeypatch):
    tokenizer = TextTokenizer.shipped()
    ids = greedy_ids(PROMPT, 120)
    assert FAULT_TOKEN not in ids
    expected = tokenizer.decode(ids[len(tokenizer.encode(PROMPT)):])
    monkeypatch.setenv(RAISE_TOKEN_ENV, str(FAULT_TOKEN))
    # one worker: the poison's prefill shares a batch with the neighbour's decodes
    with running_server(tmp_path, {"cluster.instances": 1,
                                   "policy.name": "colocated"}) as (base, driver):
        before = pids(driver)
        started, out = threading.Event(), {}
        neighbour = threading.Thread(target=stream_text, args=(base, 120, started, out))
        neighbour.start()
        assert started.wait(60)
        poison = complete(base, [5, 17, FAULT_TOKEN, 42])
        assert poison.status_code == 400
        error = poison.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert "injected fault" in error["message"]
        assert neighbour.is_alive()  # it was decoding in the batch that failed
        neighbour.join(60)
        assert out["error"] is None and out["text"] == expected
        for bad_ids in ([999999], [-1], [5000]):  # outside the vocabulary of 2048
            refused = complete(base, bad_ids)
            assert refused.status_code == 400, refused.text
            assert refused.json()["error"]["type"] == "invalid_request_error"
        for odd in ({"temperature": 1e-300}, {"temperature": 1.0, "top_p": 5e-324}):
            answer = httpx.post(f"{base}/v1/completions", timeout=120, json={
                "model": "tiny", "prompt": PROMPT, "max_tokens": 4, **odd})
            assert answer.status_code < 500, answer.text
        assert pids(driver) == before and driver.failed == set()
        assert complete(base, PROMPT).status_code == 200
        metrics = httpx.get(f"{base}/metrics").text
        assert metric(metrics, "pdserve:worker_failures_total") == 0
        # the poison (the door may stop others)
        assert metric(metrics, "pdserve:requests_failed_total", reason="invalid_request") >= 1


@pytest.mark.slow
def test_a_request_that_crashes_its_worker_is_not_retried_and_the_worker_restarts(
        tmp_path, monkeypatch):
    monkeypatch.setenv(EXIT_TOKEN_ENV, str(FAULT_TOKEN))
    with running_server(tmp_path, {"cluster.instances": 2,
                                   "policy.name": "colocated"}) as (base, driver):
        before = pids(driver)
        crash = complete(base, [5, 17, FAULT_TOKEN, 42])
        assert crash.status_code == 500
        assert "died with exit code 70" in crash.json()["error"]["message"]
        crashed = next(i for i in range(2) if driver.workers.pid(i) != before[i]
                       or i in driver.failed)
        other = 1 - crashed
        assert driver.workers.pid(other) == before[other]  # never tried elsewhere
        wait_for(lambda: httpx.get(f"{base}/health").json()["live"] == [0, 1])
        assert driver.workers.pid(crashed) != before[crashed]
        assert complete(base, PROMPT).status_code == 200
        metrics = httpx.get(f"{base}/metrics").text
        assert metric(metrics, "pdserve:requests_failed_total", reason="worker_crash") == 1
        assert metric(metrics, "pdserve:retries_total") == 0


def test_a_killed_worker_is_restarted_and_takes_requests_again(tmp_path):
    with running_server(tmp_path, {"cluster.instances": 1,
                                   "policy.name": "colocated"}) as (base, driver):
        old = driver.workers.pid(0)
        kill_worker(driver, 0)
        wait_for(lambda: driver.failed == {0}, 10)
        health = httpx.get(f"{base}/health")
        assert health.status_code == 503  # nothing can serve a request now
        assert health.json()["restarting"] == [0] and health.json()["status"] == "unavailable"
        wait_for(lambda: httpx.get(f"{base}/health").status_code == 200)
        assert driver.workers.pid(0) != old
        assert httpx.get(f"{base}/health").json()["pids"] == {"0": driver.workers.pid(0)}
        result = complete(base, PROMPT, 12)  # the only worker is the restarted one
        assert result.status_code == 200
        assert result.json()["choices"][0]["text"] == local_greedy(PROMPT, 12)
        metrics = httpx.get(f"{base}/metrics").text
        assert metric(metrics, "pdserve:worker_restarts_total") == 1
        assert metric(metrics, "pdserve:instance_state", engine="0", state="up") == 1


def test_with_the_last_prefill_worker_dead_the_cluster_still_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_STEP_LOG", str(tmp_path / "logs"))  # the role log, checked last
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "arrow",
                                   "cluster.prefill": 1, "cluster.decode": 1}) as (base, driver):
        # first, healthy: metrics are typed, and an idle worker's freed KV shows
        assert complete(base, PROMPT, 8).status_code == 200
        wait_for(lambda: all(s.used_blocks == 0 for s in driver.view.instances), 10)
        text = httpx.get(f"{base}/metrics").text
        assert metric(text, "pdserve:kv_used_blocks", engine="0") == 0  # freed after hand-off
        assert metric(text, "vllm:kv_cache_usage_perc", engine="0") == 0
        assert metric(text, "pdserve:kv_capacity_blocks", engine="0") == 512
        families = {line.split()[2] for line in text.splitlines()
                    if line.startswith("# TYPE")}
        helped = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP")}
        assert families == helped
        assert "# TYPE vllm:num_preemptions_total counter" in text
        assert metric(text, "vllm:generation_tokens_total") == 8
        prompt_tokens = len(TextTokenizer.shipped().encode(PROMPT))
        assert metric(text, "vllm:prompt_tokens_total") == prompt_tokens
        assert metric(text, "pdserve:pool_size", role="prefill") == 1
        assert metric(text, "pdserve:kv_handoffs_total") == 1
        assert metric(text, "pdserve:kv_transfer_bytes_total", kind="handoff") > 0

        driver.workers.settings = replace(driver.workers.settings, max_restarts=0)
        kill_worker(driver, 0)
        wait_for(lambda: driver.failed == {0}, 10)
        health = httpx.get(f"{base}/health")
        assert health.status_code == 200
        body = health.json()
        assert body["dead"] == [0] and body["live"] == [1]
        assert body["roles"][1] == "mixed"
        assert "instance 0 failed" in body["role_changes"][-1]["reason"]
        result = complete(base, PROMPT, 16)
        assert result.status_code == 200
        assert result.json()["choices"][0]["text"] == local_greedy(PROMPT, 16)
        metrics = httpx.get(f"{base}/metrics").text
        assert metric(metrics, "pdserve:pool_size", role="prefill") == 0  # live members only
        assert metric(metrics, "pdserve:pool_size", role="mixed") == 1
        assert metric(metrics, "pdserve:instance_state", engine="0", state="dead") == 1
        assert metric(metrics, "pdserve:instance_state", engine="0", state="up") == 0
        assert metric(metrics, "pdserve:role_flips_total", role="mixed") == 1
    roles = read_role_log(tmp_path / "logs")  # the fidelity runs' per-role fit reads it
    assert [role for _, role in roles[1]] == [Role.DECODE, Role.MIXED]
    assert [role for _, role in roles[0]][0] is Role.PREFILL


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["prefill", "decode"])
def test_failover_under_concurrent_streams_loses_and_repeats_nothing(tmp_path, victim):
    prompts = [f"{PROMPT} {word}" for word in (
        "jumps", "runs", "sleeps", "eats", "reads", "sings", "waits", "flies", "swims",
        "writes", "hides", "dreams")]
    max_tokens = 48

    def load() -> list[dict]:
        outs = [{} for _ in prompts]
        started = [threading.Event() for _ in prompts]
        threads = [threading.Thread(target=stream_text, args=(base, max_tokens, s, o, p))
                   for p, s, o in zip(prompts, started, outs, strict=True)]
        for thread in threads:
            thread.start()
        return outs, started, threads

    with running_server(tmp_path, {"cluster.instances": 3, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 2}) as (base, driver):
        outs, _, threads = load()
        for thread in threads:
            thread.join(120)
        reference = [o["text"] for o in outs]
        assert all(o["error"] is None for o in outs)

        outs, started, threads = load()
        if victim == "prefill":
            # mid-load, while it holds prefills (12 short prompts prefill in one batch within
            # milliseconds: waiting for a streamed token could find it empty)
            wait_for(lambda: driver.view.instances[0].prefill_queue_len > 0, 30, 0.0005)
            kill_worker(driver, 0)
        else:
            assert started[0].wait(60)
            wait_for(lambda: any(s.running_decodes >= 3 for s in driver.view.instances[1:]),
                     30)
            busiest = max((1, 2), key=lambda i: driver.view.instances[i].running_decodes)
            kill_worker(driver, busiest)
        for thread in threads:
            thread.join(120)
        assert not any(thread.is_alive() for thread in threads)
        assert [o["error"] for o in outs] == [None] * len(prompts)
        assert [o["text"] for o in outs] == reference
        assert all(o["completion_tokens"] <= max_tokens for o in outs)
        assert driver.metrics.total("pdserve:retries") >= 1
        if victim == "decode":  # its running decodes had streamed tokens: resumed, not redone
            assert driver.metrics.total("pdserve:resumed_tokens") >= 3
        assert driver.metrics.total("pdserve:worker_failures") == 1
