"""Fault handling without a server: an engine error isolated to its request, resuming a
sequence from streamed tokens, phase coverage after failures, and who is blamed for a
worker's death."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest
import torch
from conftest import local_scheduler
from test_scheduler import IDLE, setup, view_of

import pdserve.engine.engine as engine_module
from pdserve.cluster.actions import DispatchPrefill, SetRole
from pdserve.cluster.events import Arrival, InstanceFailed, InstanceRecovered, PrefillDone
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.live.failover import MAX_RETRIES, verdict
from pdserve.policies.presets import build_policy
from pdserve.types import Request, Role
from pdserve.worker.batch_guard import run_guarded


@pytest.fixture(scope="module")
def model_and_tokenizer():
    torch.set_num_threads(1)
    return load_model("tiny", seed=0)


PROMPTS = [[5, 17, 300, 42, 7], [900, 12, 33], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
POISON_SEED = 4242


def run_batch(engine: Engine, local: LocalScheduler, steps: int) -> tuple[dict, dict]:
    """Plan/execute/complete like a worker; returns tokens and failures per request."""
    tokens: dict[int, list[int]] = {}
    failures: dict[int, tuple[str, str]] = {}
    for _ in range(steps):
        plan = local.plan()
        if plan is None:
            break
        guarded = run_guarded(engine, plan)
        for output in guarded.outputs:
            tokens.setdefault(output.request_id, []).append(output.token_id)
        stopped = frozenset(o.request_id for o in guarded.outputs if o.finish_reason)
        result = local.complete(plan, 0.0, stopped)
        for request in result.prefilled:
            local.continue_in_place(request)
        for request_id in guarded.failures:
            local.abort(next(r for r in [*plan.decodes, *(r for r, _ in plan.chunks)]
                             if r.request_id == request_id))
            engine.release(request_id)
        failures.update(guarded.failures)
        for request in result.finished:
            engine.release(request.request_id)
    return tokens, failures


def start(engine: Engine, local: LocalScheduler, seeds: list[int | None]) -> None:
    for rid, (prompt, seed) in enumerate(zip(PROMPTS, seeds, strict=True)):
        params = SamplingParams(max_tokens=12, temperature=0.0, seed=seed, ignore_eos=True)
        engine.add(rid, prompt, params)
        local.enqueue_prefill(Request(rid, 0.0, len(prompt), 12))


def test_an_engine_error_fails_only_its_request_and_the_batch_state_stays_right(
        model_and_tokenizer, monkeypatch):
    model, tokenizer = model_and_tokenizer
    clean = Engine(model, tokenizer, 64)
    clean_local = local_scheduler(0, 64, 512)
    start(clean, clean_local, [None, None, None])
    expected, failures = run_batch(clean, clean_local, 40)
    assert not failures and all(len(t) == 12 for t in expected.values())

    real_sample_batch = engine_module.sample_batch
    calls = {"poison": 0}

    def sample_batch(logits, rows, eos_token_ids=()):
        if any(row.params.seed == POISON_SEED for row in rows):
            calls["poison"] += 1
            if calls["poison"] >= 4:  # fails mid-decode, after the batch's forward pass
                raise RuntimeError("invalid multinomial distribution")
        return real_sample_batch(logits, rows, eos_token_ids)

    monkeypatch.setattr(engine_module, "sample_batch", sample_batch)
    engine = Engine(model, tokenizer, 64)
    local = local_scheduler(0, 64, 512)
    start(engine, local, [None, POISON_SEED, None])  # the poison sits mid-batch
    tokens, failures = run_batch(engine, local, 40)
    assert list(failures) == [1]
    kind, message = failures[1]
    assert kind == "invalid_request" and "invalid multinomial" in message
    assert tokens[0] == expected[0] and tokens[2] == expected[2]  # nothing lost or repeated
    assert tokens[1] == expected[1][:3]
    assert not engine.sequences and engine.allocator.free_blocks == 64
    assert local.free_blocks == 64


def test_an_engine_that_fails_every_request_is_a_server_error(model_and_tokenizer,
                                                              monkeypatch):
    model, tokenizer = model_and_tokenizer

    def sample_batch(logits, rows, eos_token_ids=()):
        raise RuntimeError("broken engine")

    monkeypatch.setattr(engine_module, "sample_batch", sample_batch)
    engine, local = Engine(model, tokenizer, 64), local_scheduler(0, 64, 512)
    start(engine, local, [None, None, None])
    _, failures = run_batch(engine, local, 1)
    assert sorted(failures) == [0, 1, 2]
    assert all(kind == "server_error" for kind, _ in failures.values())


def test_resume_continues_exactly_where_the_streamed_tokens_end(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = Engine(model, tokenizer, 64)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    engine.add(0, PROMPTS[0], params)
    engine.run([], [(0, len(PROMPTS[0]))])
    while not engine.sequences[0].finish_reason:
        engine.run([0], [])
    whole = engine.release(0).generated
    engine.add(1, PROMPTS[0], params, resume_ids=tuple(whole[:7]))
    engine.run([], [(1, len(PROMPTS[0]) + 7)])  # prefill prompt + the resumed tokens
    while not engine.sequences[1].finish_reason:
        engine.run([1], [])
    resumed = engine.sequences[1]
    assert resumed.generated == whole and resumed.finish_reason == "length"
    with pytest.raises(ValueError, match="leave nothing to generate"):
        engine.add(2, PROMPTS[0], params, resume_ids=tuple(whole))


def run_to_end(engine: Engine, request_id: int, prefill_tokens: int) -> None:
    engine.run([], [(request_id, prefill_tokens)])
    while not engine.sequences[request_id].finish_reason:
        engine.run([request_id], [])


def test_a_stop_string_spanning_the_resume_boundary_still_stops(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine, prompt = Engine(model, tokenizer, 64), tokenizer.encode("The quick brown fox")
    engine.add(0, prompt, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    run_to_end(engine, 0, len(prompt))
    whole = engine.release(0).generated
    text = tokenizer.decode(whole)

    def stop_at(k: int) -> str:  # the text of tokens k-1 and k
        return tokenizer.decode(whole[:k + 1])[len(tokenizer.decode(whole[:k - 1])):]

    # the first boundary whose two-token stop string first occurs right there
    k = next(k for k in range(3, 20)
             if stop_at(k) and text.index(stop_at(k)) == len(tokenizer.decode(whole[:k - 1])))
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True,
                            stop=(stop_at(k),))
    engine.add(1, prompt, params)
    run_to_end(engine, 1, len(prompt))
    engine.add(2, prompt, params, resume_ids=tuple(whole[:k]))  # the boundary splits `stop`
    run_to_end(engine, 2, len(prompt) + k)
    uninterrupted, resumed = engine.sequences[1], engine.sequences[2]
    assert resumed.finish_reason == uninterrupted.finish_reason == "stop"
    assert resumed.generated == uninterrupted.generated == whole[:k + 1]
    assert engine.text_of(2) == engine.text_of(1) == tokenizer.decode(whole[:k - 1])


def test_token_ids_outside_the_vocabulary_are_refused_at_add(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    engine = Engine(model, tokenizer, 64)
    for bad in (999999, -1, model.config.vocab_size):
        with pytest.raises(ValueError, match=f"token id {bad} at position 1 is outside"):
            engine.add(0, [5, bad], SamplingParams(max_tokens=4))
    assert not engine.sequences


def test_the_last_prefill_instance_failing_makes_a_live_one_take_both_phases():
    policy, count = build_policy(setup("arrow", instances=2, prefill=1, decode=1))
    scheduler = GlobalScheduler(policy, count)
    view = view_of(IDLE, IDLE)
    changes = scheduler.handle(InstanceFailed(0), view)
    assert changes == [SetRole(1, Role.MIXED)]
    assert "instance 0 failed" in changes[0].reason
    [dispatch] = scheduler.handle(Arrival(Request(1, 0.0, 10, 10)), view)
    assert dispatch == DispatchPrefill(dispatch.request, 1)
    [decode] = scheduler.handle(PrefillDone(dispatch.request, 1), view)
    assert decode.target_id == 1  # decodes in place: the only live instance
    changes = scheduler.handle(InstanceRecovered(0), view)
    assert changes == [SetRole(1, Role.DECODE)]  # back to its role
    assert scheduler.board.prefill_candidates == [0]
    assert scheduler.board.decode_candidates == [1]


def test_a_busy_decode_instance_moves_through_the_transitional_role():
    policy, count = build_policy(setup("static-pd", instances=3, prefill=1, decode=2))
    scheduler = GlobalScheduler(policy, count)
    view = view_of(IDLE, replace(IDLE, running_decodes=3, running_tokens=900),
                   replace(IDLE, running_decodes=1, running_tokens=50))
    [change] = scheduler.handle(InstanceFailed(0), view)
    assert change == SetRole(2, Role.D_TO_P)  # the least-loaded decode, finishing its work
    assert scheduler.board.prefill_candidates == [2]
    assert scheduler.board.decode_candidates == [1]
    [change] = scheduler.handle(InstanceRecovered(0), view)
    assert change == SetRole(2, Role.DECODE) and "instance 0 recovered" in change.reason
    assert scheduler.board.prefill_candidates == [0]


def test_blame_for_a_worker_death():
    kill = -signal.SIGKILL
    assert verdict(0, kill, in_batch=True, retries=0).retry  # killed from outside
    crash = verdict(0, 70, in_batch=True, retries=0)
    assert not crash.retry and crash.reason == "worker_crash" and "exit code 70" in crash.message
    assert verdict(0, -signal.SIGSEGV, in_batch=False, retries=0).retry  # not in its batch
    spent = verdict(0, kill, in_batch=False, retries=MAX_RETRIES)
    assert not spent.retry and spent.reason == "retry_budget"
