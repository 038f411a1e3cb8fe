"""Predicted-length-aware dispatch from prefill to decode (`policies/ares/dispatch.py`): on
constructed forecasts, and end to end in the simulator on a workload built so that only a
prediction sees where the KV is going."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from test_ares_sim import BASE, LONGS, hidden_growth_workload

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.decode_forecast import (
    DecodeForecast,
    DecodeLoadTracker,
    ForecastSettings,
    RequestForecast,
)
from pdserve.policies.ares.dispatch import PredictedLoadDecodeRouter, peak_tokens
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicyConfig
from pdserve.sim.runner import Experiment, load_perf_model, policy_setup
from pdserve.types import KV_BLOCK_TOKENS, Request, Role

SETTINGS = ForecastSettings(predictor="oracle", horizon_steps=1000, points=4, decay=0.8)


@dataclass
class Load:
    running_tokens: int
    decode_forecast: DecodeForecast | None
    decode_queue_tokens: int = 0
    total_blocks: int = 100_000


def view_of(groups: list[list[tuple[int, int, int]]]) -> ClusterView:
    """Decode instances holding requests of (input, generated, true output length), with
    the forecasts their workers would report."""
    tracker = DecodeLoadTracker(SETTINGS)
    loads = []
    for i, group in enumerate(groups):
        here = []
        for k, (prompt, generated, output) in enumerate(group):
            request = Request(i * 100 + k, 0.0, prompt, output)
            request.generated_tokens = generated
            here.append(request)
        loads.append(Load(sum(r.sequence_tokens for r in here),
                          tracker.forecast(i, here, ())))
    return ClusterView(1.0, loads)


def new_request(request_id: int, prompt: int, output: int) -> Request:
    request = Request(request_id, 0.0, prompt, output)
    request.generated_tokens = 1  # prefilled: its first token is out
    return request


# instance 0: heavy now (6,000 tokens) and empty within 100 steps; instance 1: light now
# (2,000 tokens) and still 2,000-3,000 for the whole horizon
GROUPS = [[(3000, 0, 100), (3000, 0, 100)], [(1000, 0, 5000), (1000, 0, 5000)]]


def test_a_long_request_goes_where_the_future_is_light() -> None:
    router = PredictedLoadDecodeRouter(SETTINGS)
    board = RoleBoard([Role.DECODE] * 2)
    view = view_of(GROUPS)
    # current load alone would say instance 1 (2,000 < 6,000 tokens)
    assert router.route(new_request(7, 500, 4000), 9, view, board) == 0


def test_a_short_request_goes_where_the_present_is_light() -> None:
    router = PredictedLoadDecodeRouter(SETTINGS)
    board = RoleBoard([Role.DECODE] * 2)
    # done within 10 steps: only t = 0 of its trajectory overlaps anything
    assert router.route(new_request(7, 500, 10), 9, view_of(GROUPS), board) == 1


def test_requests_not_yet_in_a_report_count_until_they_are() -> None:
    """A live report can predate a dispatch: the router adds what it sent until the
    instance's forecast lists it, so a burst does not all land on one instance."""
    router = PredictedLoadDecodeRouter(SETTINGS)
    board = RoleBoard([Role.DECODE] * 2)
    view = view_of([[], []])  # two empty instances; the reports never change below
    targets = [router.route(new_request(10 + k, 200, 3000), 9, view, board)
               for k in range(6)]
    assert sorted(targets) == [0, 0, 0, 1, 1, 1]
    # once instance 0's report lists its three, they are not counted twice
    sent_to_0 = [10 + k for k, t in enumerate(targets) if t == 0]
    tracker = DecodeLoadTracker(SETTINGS)
    listed = [new_request(rid, 200, 3000) for rid in sent_to_0]
    view.instances[0].decode_forecast = tracker.forecast(0, (), listed)
    assert router.route(new_request(20, 200, 3000), 9, view, board) == 0  # 3 vs 3: lower id
    assert not any(rid in router._sent.get(0, {}) for rid in sent_to_0)


def test_the_peak_is_a_fraction_of_each_instance_kv() -> None:
    router = PredictedLoadDecodeRouter(SETTINGS)
    board = RoleBoard([Role.DECODE] * 2)
    view = view_of(GROUPS)
    # the long request's peak: 6,798 tokens on instance 0 (its two decodes just before
    # they end at step 99, plus its own 600), 14,495 on instance 1 (at its own last step)
    view.instances[0].total_blocks = 8000 // KV_BLOCK_TOKENS  # 0.85 of the KV
    view.instances[1].total_blocks = 100_000 // KV_BLOCK_TOKENS  # 0.14
    assert router.route(new_request(7, 500, 4000), 9, view, board) == 1
    assert router.memory_fallbacks == 0
    router = PredictedLoadDecodeRouter(SETTINGS)
    view.instances[0].total_blocks = 4000 // KV_BLOCK_TOKENS  # 1.70: it would preempt
    view.instances[1].total_blocks = 8000 // KV_BLOCK_TOKENS  # 1.81: so would this one
    assert router.route(new_request(8, 500, 4000), 9, view, board) == 0
    assert router.memory_fallbacks == 1


def test_peak_tokens_is_the_exact_maximum_of_the_load_model() -> None:
    import random

    rng = random.Random(0)
    for _ in range(200):
        residents = [RequestForecast(k, rng.randint(1, 5000), rng.choice(
            [rng.uniform(0, 3000), float(rng.randint(0, 3000)), float("inf")]), True)
            for k in range(rng.randint(0, 8))]
        own = RequestForecast(99, rng.randint(1, 5000), float(rng.randint(0, 3000)), False)
        brute = max(sum(r.load_at(t) for r in [*residents, own])
                    for t in range(max(1, math.ceil(own.remaining_tokens))))
        assert peak_tokens(residents, own) == brute


def test_history_learns_from_the_requests_it_dispatched() -> None:
    settings = ForecastSettings(predictor="history", horizon_steps=1000, points=4)
    router = PredictedLoadDecodeRouter(settings, output_lengths_known=False)
    board = RoleBoard([Role.DECODE] * 2)
    view = view_of([[], []])
    before = router.predicted_remaining_tokens(new_request(1, 300, 8000))
    for k in range(60):
        request = new_request(100 + k, 300, 8000)
        router.route(request, 9, view, board)
        request.generated_tokens, request.finish_s = 5000, 2.0  # every one stops there
    router.route(new_request(999, 300, 8000), 9, view, board)  # learns on its next call
    after = router.predicted_remaining_tokens(new_request(1000, 300, 8000))
    assert before <= 1 and after == 4999  # it had seen nothing; then 60 of 5,000 tokens


def test_it_needs_predicted_forecasts() -> None:
    with pytest.raises(ValueError, match="needs a length predictor"):
        PredictedLoadDecodeRouter(ForecastSettings(predictor="none"))
    config = BASE.with_values({"policy.name": "reschedule-current",
                               "policy.decode_router": "predicted-load"})
    with pytest.raises(ValueError, match="reschedule-current"):
        build_policy(policy_setup(config, load_perf_model(config)))
    # alone, it makes the instances keep the forecasts it reads
    config = BASE.with_values({"policy.name": "vllm", "policy.decode_router": "predicted-load"})
    policy, _ = build_policy(policy_setup(config, load_perf_model(config)))
    assert isinstance(policy.decode_router, PredictedLoadDecodeRouter)
    assert policy.decode_forecast == policy.decode_router.settings
    assert PolicyConfig(decode_router="predicted-load").decode_router == "predicted-load"


def test_dispatch_spreads_the_growing_decodes_that_current_load_stacks() -> None:
    """The workload of `test_prediction_moves_the_growing_decodes...`: six requests that are
    light at dispatch and grow to 36K tokens each. By current load (`vllm`) all six land on
    one instance, which runs out of KV and preempts; ARES's rebalancer repairs it with
    migrations. Predicted-length-aware dispatch places them apart in the first place: no
    preemption and no migration. Measured 2026-11-25 (measured vLLM model, oracle): vllm 11
    preemptions; vllm + predicted-load 0 preemptions, 0 migrations, the six split 3 / 3;
    ares 8 migrations; ares + predicted-load 5."""
    workload = hidden_growth_workload()
    config = BASE.with_values({"cluster.decode": 2, "policy.ares.forecast.predictor": "oracle",
                               "perf.backend": ""})
    perf = load_perf_model(config)
    runs = {}
    for name, router in (("vllm", ""), ("vllm", "predicted-load"), ("ares", ""),
                         ("ares", "predicted-load")):
        experiment = Experiment(config.with_values({"policy.name": name,
                                                    "policy.decode_router": router}),
                                workload, perf)
        result = experiment.simulate()
        runs[name, router] = (result, experiment.summarize(result))
    vllm, vllm_summary = runs["vllm", ""]
    dispatched, dispatched_summary = runs["vllm", "predicted-load"]
    assert len({r.decode_instance for r in vllm.requests[1:1 + LONGS]}) == 1
    assert vllm_summary.preemptions > 0
    longs_on = [r.decode_instance for r in dispatched.requests[1:1 + LONGS]]
    assert min(longs_on.count(i) for i in set(longs_on)) >= 2 and len(set(longs_on)) == 2
    assert dispatched_summary.preemptions == 0 and dispatched.migrations == 0
    assert dispatched_summary.completed == len(workload.arrival_s)
    assert dispatched_summary.slo_attainment >= vllm_summary.slo_attainment
    ares, _ = runs["ares", ""]
    both, both_summary = runs["ares", "predicted-load"]
    assert both_summary.preemptions == 0 and both.migrations < ares.migrations
