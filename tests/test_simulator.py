"""The discrete-event simulator: determinism, fast-advance equivalence, end-to-end sanity."""

from __future__ import annotations

import math

import pytest
from conftest import make_perf

from pdserve.bench.metrics import summarize
from pdserve.bench.synthetic import synthetic_workload
from pdserve.config import SimConfig
from pdserve.perf.fitted import PerfModel
from pdserve.policies.presets import build_policy
from pdserve.sim.runner import Experiment
from pdserve.sim.simulator import SimResult, SimSettings, Simulator
from pdserve.types import SLO, Request


def simulate(policy_name: str, requests: list[Request], perf: PerfModel, span: int,
             **settings) -> tuple[SimResult, list[Request]]:
    policy, count = build_policy(policy_name, perf, instances=4, prefill=2, decode=2)
    sim = Simulator(policy, count, perf, SimSettings(max_span_steps=span, **settings))
    result = sim.run(requests)
    return result, result.requests


def outcome(request: Request) -> tuple:
    return (request.request_id, request.first_token_s, request.finish_s, request.preemptions,
            request.prefill_instance, request.decode_instance, request.rejected_reason)


@pytest.mark.parametrize("policy", ["colocated", "static-pd", "round-robin"])
def test_fast_advance_equals_step_by_step(policy: str):
    """Under memory pressure (preemptions, queued transfers) and bursty arrivals."""
    perf = make_perf(kv_capacity_tokens=12_000)
    workload = synthetic_workload(300, rate_rps=12.0, lengths="uniform:20-2500:1-400",
                                  arrival="gamma", cv=2.0, seed=7)
    step_run, stepwise = simulate(policy, workload.requests(), perf, span=1,
                                  chunk_size_tokens=512, monitor_interval_s=0.25)
    fast_run, fast = simulate(policy, workload.requests(), perf, span=1 << 20,
                              chunk_size_tokens=512, monitor_interval_s=0.25)
    assert sum(r.preemptions for r in stepwise) > 0  # the workload does stress memory
    for slow_r, fast_r in zip(stepwise, fast, strict=True):
        slow_o, fast_o = outcome(slow_r), outcome(fast_r)
        assert slow_o[0] == fast_o[0] and slow_o[3:] == fast_o[3:]
        assert fast_o[1] == pytest.approx(slow_o[1], rel=1e-9, abs=1e-9)
        assert fast_o[2] == pytest.approx(slow_o[2], rel=1e-9, abs=1e-9)
    # what the monitor saw at every tick is the same too
    assert len(step_run.samples) == len(fast_run.samples)
    for slow_s, fast_s in zip(step_run.samples, fast_run.samples, strict=True):
        assert slow_s.running_tokens == fast_s.running_tokens
        assert slow_s.prefill_queue_tokens == fast_s.prefill_queue_tokens
        assert slow_s.memory_fraction == pytest.approx(fast_s.memory_fraction)
    # and the fast path really skipped work
    assert fast_run.events < step_run.events / 3


def test_same_seed_same_results_different_seed_different():
    config = SimConfig(trace="synthetic", synthetic_requests=400, synthetic_rate_rps=30,
                       synthetic_lengths="table:arxiv-lengths", synthetic_arrival="gamma",
                       synthetic_cv=2, seed=3, policy="static-pd", prefill=2, decode=2)
    first = [outcome(r) for r in Experiment.from_config(config).simulate().requests]
    second = [outcome(r) for r in Experiment.from_config(config).simulate().requests]
    other = [outcome(r) for r in Experiment.from_config(config.replaced(seed=4))
             .simulate().requests]
    assert first == second
    assert first != other


def test_every_request_finishes_with_its_output_length(perf: PerfModel):
    workload = synthetic_workload(200, rate_rps=50, lengths="uniform:1-3000:1-300", seed=2)
    _, requests = simulate("static-pd", workload.requests(), perf, span=1 << 20)
    assert all(r.finished and r.generated_tokens == r.output_tokens for r in requests)
    assert all(r.first_token_s > r.arrival_s and r.finish_s >= r.first_token_s
               for r in requests)
    transferred = [r for r in requests if r.output_tokens > 1]
    assert all(r.transfer_s > 0 and r.decode_instance in (2, 3) for r in transferred)


def test_request_larger_than_memory_is_rejected_not_stuck():
    perf = make_perf(kv_capacity_tokens=4096)
    requests = [Request(0, 0.0, 5000, 10), Request(1, 0.1, 100, 10)]
    _, done = simulate("colocated", requests, perf, span=1 << 20)
    assert "exceeds the KV capacity" in done[0].rejected_reason and not done[0].finished
    assert done[1].finished


def test_static_pd_and_colocated_differ_sanely_on_a_real_trace_clip():
    """Five minutes of Azure conversation on 8 instances (4P4D vs 8 colocated).

    Colocated decode steps carry prefill chunks, so its TPOT is higher at every load. Its
    TTFT depends on load: lightly loaded, PD's dedicated prefill instances are faster (no
    decodes in their batches); heavily loaded, colocated wins because 8 instances take
    prefills instead of 4 and PD's prefill queues grow."""
    base = SimConfig(trace="azure-conv", start_s=600, duration_s=300, instances=8, prefill=4,
                     decode=4)
    results = {}
    for scale in (3, 13):
        for policy in ("colocated", "static-pd"):
            experiment = Experiment.from_config(base.replaced(policy=policy, rate_scale=scale))
            results[policy, scale] = summarize(experiment.simulate().requests, SLO(2.0, 0.15))
    for scale in (3, 13):
        colocated, pd = results["colocated", scale], results["static-pd", scale]
        assert colocated.completed == pd.completed == colocated.requests > 300
        assert colocated.tpot_s.p90 > pd.tpot_s.p90
        # sane magnitudes for Llama-3.1-8B on H800: ~10 ms per token, sub-second TTFT
        assert 0.005 < pd.tpot_s.p50 < colocated.tpot_s.p50 < 0.05
        assert pd.ttft_s.p50 < 1.0 and colocated.ttft_s.p50 < 1.0
        assert not math.isnan(pd.e2e_s.p99)
    assert results["static-pd", 3].ttft_s.p50 < results["colocated", 3].ttft_s.p50
    assert results["colocated", 13].ttft_s.p90 < results["static-pd", 13].ttft_s.p90
    # load costs both: higher rate, higher TPOT
    for policy in ("colocated", "static-pd"):
        assert results[policy, 13].tpot_s.p50 > results[policy, 3].tpot_s.p50
