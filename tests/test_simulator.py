"""The discrete-event simulator: determinism, fast-advance equivalence, end-to-end sanity."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from conftest import make_perf, policy_setup, sim_settings

from pdserve.cluster.actions import Migrate
from pdserve.config import Config
from pdserve.metrics.summary import summarize
from pdserve.perf.fitted import PerfModel
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicyConfig
from pdserve.sim.runner import Experiment
from pdserve.sim.simulator import SimResult, Simulator
from pdserve.types import SLO, Request
from pdserve.workload.synthetic import synthetic_workload

DEFAULT_SLO = SLO(2.0, 0.15)


def simulate(policy_name: str, requests: list[Request], perf: PerfModel, span: int,
             slo: SLO = DEFAULT_SLO, prefill: int = 2, decode: int = 2,
             **settings) -> tuple[SimResult, list[Request]]:
    policy, count = build_policy(policy_setup(
        perf, slo, PolicyConfig(policy_name), instances=prefill + decode, prefill=prefill,
        decode=decode,
        chunk_size_tokens=settings.get("chunk_size_tokens", 2048)))
    sim = Simulator(policy, count, perf, sim_settings(max_span_steps=span, **settings))
    result = sim.run(requests)
    return result, result.requests


def outcome(request: Request) -> tuple:
    return (request.request_id, request.first_token_s, request.finish_s, request.preemptions,
            request.prefill_instance, request.decode_instance, request.rejected_reason)


def assert_fast_equals_stepwise(policy: str, slo: SLO = DEFAULT_SLO, prefill: int = 2,
                                decode: int = 2, perf: PerfModel | None = None
                                ) -> tuple[SimResult, list[Request]]:
    """Run a memory-pressured, bursty workload step by step and with fast-advance."""
    perf = perf or make_perf(kv_capacity_tokens=12_000)
    workload = synthetic_workload(300, rate_rps=12.0, lengths="uniform:20-2500:1-400",
                                  arrival="gamma", cv=2.0, seed=7)
    runs = [simulate(policy, workload.requests(), perf, span, slo, prefill, decode,
                     chunk_size_tokens=512, monitor_interval_s=0.25) for span in (1, 1 << 20)]
    (step_run, stepwise), (fast_run, fast) = runs
    for slow_r, fast_r in zip(stepwise, fast, strict=True):
        slow_o, fast_o = outcome(slow_r), outcome(fast_r)
        assert slow_o[0] == fast_o[0] and slow_o[3:] == fast_o[3:]
        assert fast_o[1] == pytest.approx(slow_o[1], rel=1e-9, abs=1e-9)
        assert fast_o[2] == pytest.approx(slow_o[2], rel=1e-9, abs=1e-9)
        # token timing kept per batch, not per token, matches too (NaN: never decoded)
        assert fast_r.decode_first_token_s == pytest.approx(
            slow_r.decode_first_token_s, rel=1e-9, abs=1e-9, nan_ok=True)
        assert fast_r.max_itl_s == pytest.approx(slow_r.max_itl_s, rel=1e-9, abs=1e-9)
    # what the monitor saw at every tick is the same too, and so are the role changes
    assert len(step_run.samples) == len(fast_run.samples)
    for slow_s, fast_s in zip(step_run.samples, fast_run.samples, strict=True):
        assert slow_s.running_tokens == fast_s.running_tokens
        assert slow_s.prefill_queue_tokens == fast_s.prefill_queue_tokens
        assert slow_s.memory_fraction == pytest.approx(fast_s.memory_fraction)
        assert slow_s.roles == fast_s.roles
    assert [(c.instance_id, c.role) for c in step_run.role_changes] == \
        [(c.instance_id, c.role) for c in fast_run.role_changes]
    # and the fast path really skipped work
    assert fast_run.events < step_run.events / 3
    return fast_run, fast


@pytest.mark.parametrize("policy", ["colocated", "static-pd", "round-robin"])
def test_fast_advance_equals_step_by_step(policy: str):
    """Under memory pressure (preemptions, queued transfers) and bursty arrivals."""
    _, requests = assert_fast_equals_stepwise(policy)
    assert sum(r.preemptions for r in requests) > 0  # the workload does stress memory


def test_fast_advance_equals_step_by_step_with_a_super_linear_decode_cost():
    """A step-log fit's squared batch term (and its tangent beyond the logged batches) is a
    constant of a span, so spans stay exact."""
    base = make_perf(kv_capacity_tokens=12_000)
    perf = replace(base, decode=replace(base.decode, per_seq_squared_s=2e-5,
                                        squared_until_batch=12))
    assert perf.decode.step_s(30, 0) > base.decode.step_s(30, 0) + 0.01
    _, requests = assert_fast_equals_stepwise("static-pd", perf=perf)
    assert sum(r.preemptions for r in requests) > 0


def test_fast_advance_equals_step_by_step_while_arrow_flips_instances():
    """Arrow reads windowed token intervals and mid-span loads to flip instances."""
    result, requests = assert_fast_equals_stepwise("arrow", SLO(0.2, 0.06), prefill=3,
                                                   decode=3)
    assert result.flips >= 10  # with 5 s dwell and monitor cooldown, in a 25 s run
    assert sum(r.preemptions for r in requests) > 0


def test_same_seed_same_results_different_seed_different():
    config = Config().with_values({"workload.trace": "synthetic",
                                   "workload.synthetic_requests": 400,
                                   "workload.synthetic_rate_rps": 30,
                                   "workload.synthetic_lengths": "table:arxiv-lengths",
                                   "workload.synthetic_arrival": "gamma",
                                   "workload.synthetic_cv": 2, "seed": 3,
                                   "policy.name": "static-pd", "cluster.prefill": 2,
                                   "cluster.decode": 2})
    first = [outcome(r) for r in Experiment.from_config(config).simulate().requests]
    second = [outcome(r) for r in Experiment.from_config(config).simulate().requests]
    other = [outcome(r) for r in Experiment.from_config(config.with_values({"seed": 4}))
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

    Colocated decode steps carry prefill chunks, so its tail TPOT (P99) is higher at every
    load (its median need not be: 8 instances share the decodes, so its batches are half the
    size). Its TTFT depends on
    load: lightly loaded, PD's dedicated prefill instances are faster (no
    decodes in their batches); heavily loaded, colocated wins because 8 instances take
    prefills instead of 4 and PD's prefill queues grow."""
    base = Config().with_values({"workload.trace": "azure-conv", "workload.start_s": 600,
                                 "workload.duration_s": 300, "cluster.instances": 8,
                                 "cluster.prefill": 4, "cluster.decode": 4})
    results = {}
    for scale in (3, 26):
        for policy in ("colocated", "static-pd"):
            experiment = Experiment.from_config(base.with_values({"policy.name": policy,
                                                                  "workload.rate_scale": scale}))
            results[policy, scale] = summarize(experiment.simulate().requests, SLO(2.0, 0.15))
    for scale in (3, 26):
        colocated, pd = results["colocated", scale], results["static-pd", scale]
        assert colocated.completed == pd.completed == colocated.requests > 300
        assert colocated.tpot_s.p99 > pd.tpot_s.p99
        # sane magnitudes for Llama-3.1-8B on H800: ~10 ms per token, sub-second TTFT
        assert 0.005 < pd.tpot_s.p50 < 0.05 and 0.005 < colocated.tpot_s.p50 < 0.05
        assert pd.ttft_s.p50 < 1.0 and colocated.ttft_s.p50 < 1.0
        assert not math.isnan(pd.e2e_s.p99)
    assert results["static-pd", 3].ttft_s.p50 < results["colocated", 3].ttft_s.p50
    assert results["colocated", 26].ttft_s.p90 < results["static-pd", 26].ttft_s.p90
    # load costs both: higher rate, higher TPOT
    for policy in ("colocated", "static-pd"):
        assert results[policy, 26].tpot_s.p50 > results[policy, 3].tpot_s.p50


def test_arrow_beats_min_load_on_a_bursty_real_trace():
    """Azure code, first 10 minutes at 28x: bursts overload 4 prefill instances; Arrow
    flips decode instances to prefill and meets the SLOs where the fixed 4P4D split misses."""
    base = Config().with_values({"workload.trace": "azure-code", "workload.duration_s": 600,
                                 "workload.rate_scale": 28, "slo.ttft_s": 3, "slo.tpot_s": 0.1})
    summaries, flips = {}, {}
    for policy in ("arrow", "min-load"):
        experiment = Experiment.from_config(base.with_values({"policy.name": policy}))
        result = experiment.simulate()
        summaries[policy], flips[policy] = experiment.summarize(result), result.flips
    assert summaries["arrow"].slo_attainment >= summaries["min-load"].slo_attainment + 0.05
    assert summaries["arrow"].ttft_s.p90 < summaries["min-load"].ttft_s.p90
    assert flips["arrow"] > 0 and flips["min-load"] == 0


class MigrateEveryTick:
    """Test rebalancer: each tick, move the longest-running decode that an instance-2
    router dispatched from its decode instance to the other decode instance."""

    def __init__(self, recorder: list[Request], decode_ids: tuple[int, int]) -> None:
        self.recorder, self.decode_ids = recorder, decode_ids

    def on_tick(self, view, board):
        running = [r for r in self.recorder if not r.finished and r.generated_tokens > 1
                   and r.decode_instance in self.decode_ids]
        if not running:
            return []
        request = min(running, key=lambda r: r.first_token_s)
        target = [i for i in self.decode_ids if i != request.decode_instance][0]
        return [Migrate(request, request.decode_instance, target)]


class RecordingRouter:
    def __init__(self, inner, recorder: list[Request]) -> None:
        self.inner, self.recorder = inner, recorder

    def route(self, request, prefill_instance, view, board):
        self.recorder.append(request)
        return self.inner.route(request, prefill_instance, view, board)


def run_with_migrations(span: int) -> tuple[SimResult, list[Request]]:
    perf = make_perf(kv_capacity_tokens=12_000)
    workload = synthetic_workload(150, rate_rps=6.0, lengths="uniform:20-1500:50-400",
                                  arrival="gamma", cv=2.0, seed=11)
    policy, count = build_policy(policy_setup(perf, DEFAULT_SLO, PolicyConfig("static-pd"),
                                              prefill=2, decode=2, chunk_size_tokens=512))
    recorder: list[Request] = []
    policy.decode_router = RecordingRouter(policy.decode_router, recorder)
    policy.rebalancer = MigrateEveryTick(recorder, (2, 3))
    sim = Simulator(policy, count, perf, sim_settings(chunk_size_tokens=512,
                                                      monitor_interval_s=0.25,
                                                      max_span_steps=span))
    result = sim.run(workload.requests())
    return result, result.requests


def test_migrated_decodes_finish_exactly_and_fast_advance_still_equals_step_by_step():
    (step_run, stepwise), (fast_run, fast) = run_with_migrations(1), run_with_migrations(1 << 20)
    moved = [r for r in fast if r.transfer_s > 1.5 * make_perf().transfer_time_s(r.input_tokens)]
    assert len(moved) >= 10  # some requests moved more than once (two transfers)
    assert all(r.finished and r.generated_tokens == r.output_tokens for r in fast)
    for slow_r, fast_r in zip(stepwise, fast, strict=True):
        assert outcome(slow_r)[3:] == outcome(fast_r)[3:]
        assert fast_r.finish_s == pytest.approx(slow_r.finish_s, rel=1e-9, abs=1e-9)
    assert fast_run.events < step_run.events


def test_a_run_that_can_never_progress_fails_clearly_instead_of_hanging(monkeypatch):
    """Reintroduce a KV leak (hand-offs never free the prefill side): the prefill
    instance fills up and the run must end with an error, not tick forever."""
    from pdserve.instance.local_scheduler import LocalScheduler

    monkeypatch.setattr(LocalScheduler, "release_handoff",
                        lambda self, request: self.held.pop(request.request_id))
    perf = make_perf(kv_capacity_tokens=4_000)
    workload = synthetic_workload(60, rate_rps=20.0, lengths="fixed:600:20", seed=1)
    with pytest.raises(RuntimeError, match="simulation stalled"):
        simulate("static-pd", workload.requests(), perf, span=1 << 20)
