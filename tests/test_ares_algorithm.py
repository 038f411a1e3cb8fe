"""ARES Alg. 1 on constructed states: each phase, and whole rounds of the rebalancer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pdserve.cluster.actions import Migrate
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.decode_forecast import (
    DecodeForecast,
    DecodeLoadTracker,
    ForecastSettings,
    RequestForecast,
)
from pdserve.perf.presets import perf_model
from pdserve.policies.ares.candidates import enumerate_candidates
from pdserve.policies.ares.classification import Classification, InstanceState, classify
from pdserve.policies.ares.rebalancer import AresRebalancer
from pdserve.policies.ares.selection import select_migration, weighted_variance
from pdserve.policies.ares.settings import AresSettings
from pdserve.types import KV_BLOCK_TOKENS, Request, Role

SETTINGS = ForecastSettings(predictor="oracle", horizon_steps=1000, points=4, decay=0.8)
OFFSETS = SETTINGS.step_offsets()


def state(instance_id: int, decodes: list[tuple[int, float]], capacity: int = 10**6,
          step_s: float = 0.02, current: int | None = None,
          weighted: float | None = None) -> InstanceState:
    """An instance running decodes of (tokens now, predicted remaining tokens)."""
    requests = tuple(RequestForecast(instance_id * 100 + k, tokens, remaining, True)
                     for k, (tokens, remaining) in enumerate(decodes))
    offsets, weights = SETTINGS.step_offsets(), SETTINGS.weights()
    loads = tuple(sum(r.load_at(t) for r in requests) for t in offsets)
    w = sum(b * n for b, n in zip(weights, loads, strict=True))
    forecast = DecodeForecast(instance_id, loads, w if weighted is None else weighted, requests)
    now = int(loads[0]) if current is None else current
    return InstanceState(instance_id, forecast, now, capacity, step_s)


def free_cost(source: int, target: int, tokens: int) -> float:
    return 0.0


# ---- phase 1: classification ----

def test_overloaded_by_weighted_load_and_underloaded_by_current_load() -> None:
    states = {
        0: state(0, [], current=900, weighted=300),  # heavy now, light soon
        1: state(1, [], current=100, weighted=1500),  # light now, heavy soon
        2: state(2, [], current=500, weighted=600),
    }
    classes = classify(states, theta=0.1)  # mean w = 800, limit 880
    assert classes.mean_load == pytest.approx(800)
    assert classes.overloaded == (1,)
    # line 15: U is by the CURRENT load: instance 1 (100 now) is in U although its w is
    # the highest; instance 0 (900 now) is not although its w is the lowest
    assert 1 in classes.underloaded and 2 in classes.underloaded
    assert 0 not in classes.underloaded


def test_memory_guard_makes_a_full_instance_a_source() -> None:
    states = {0: state(0, [], current=950, weighted=100, capacity=1000),  # full now
              1: state(1, [], current=100, weighted=900, capacity=1000)}
    assert classify(states, theta=0.1).overloaded == (1,)  # the paper's rule
    assert classify(states, theta=0.1, memory_guard=0.9).overloaded == (0, 1)


def test_theta_widens_the_band() -> None:
    states = {0: state(0, [], current=100, weighted=1000), 1: state(1, [], current=100,
                                                                     weighted=800)}
    assert classify(states, theta=0.05).overloaded == (0,)  # 1000 > 945
    assert classify(states, theta=0.2).overloaded == ()  # 1000 < 1080


# ---- phase 2: candidates ----

def test_filter_remaining_tokens_must_exceed_migration_steps() -> None:
    states = {0: state(0, [(4000, 5.0), (4000, 50.0)], step_s=0.02), 1: state(1, [])}
    classes = Classification(0.0, (0,), (1,))
    cost = lambda s, t, tokens: 0.2  # 0.2 s / 0.02 s = 10 steps  # noqa: E731
    found = enumerate_candidates(states, classes, cost, OFFSETS)
    assert [c.request.remaining_tokens for c in found] == [50.0]
    assert found[0].migration_steps == pytest.approx(10.0)


def test_filter_request_must_fit_the_target_memory_over_the_horizon() -> None:
    # the target's own decodes grow by 4 x 250 tokens within the horizon: a request that
    # fits now and at its own end would overflow the target in 1000 steps
    states = {0: state(0, [(3000, 5000.0)]),
              1: state(1, [(1000, 5000.0)] * 4, capacity=9000)}
    classes = Classification(0.0, (0,), (1,))
    assert 4000 + 3000 <= 9000  # current load plus the request fits...
    assert states[1].forecast.load_tokens[-1] + 3000 + 1000 > 9000  # ...not in 1000 steps
    assert enumerate_candidates(states, classes, free_cost, OFFSETS) == []


def test_filter_request_must_fit_the_target_memory_at_its_predicted_end() -> None:
    states = {0: state(0, [(4000, 3000.0), (1000, 500.0)]),
              1: state(1, [(5000, 10_000.0)], capacity=12_000)}
    classes = Classification(0.0, (0,), (1,))
    found = enumerate_candidates(states, classes, free_cost, OFFSETS)
    # 5000 + 4000 + 3000 = 12000 fits exactly; a bigger one does not
    assert sorted(c.request.tokens for c in found) == [1000, 4000]
    states[1] = state(1, [(5000, 10_000.0)], capacity=11_999)
    found = enumerate_candidates(states, classes, free_cost, OFFSETS)
    assert [c.request.tokens for c in found] == [1000]


def test_no_pairs_with_itself_and_skipped_requests() -> None:
    states = {0: state(0, [(4000, 3000.0), (2000, 3000.0)]), 1: state(1, [])}
    classes = Classification(0.0, (0,), (0, 1))
    found = enumerate_candidates(states, classes, free_cost, OFFSETS, skip={0})
    assert [(c.source, c.target, c.request.request_id) for c in found] == [(0, 1, 1)]


# ---- phase 3: selection ----

def moved(states: dict[int, InstanceState], source: int, target: int,
          request_id: int) -> dict[int, InstanceState]:
    """States after really moving a request (recomputed from scratch)."""
    lists = {i: [(r.tokens, r.remaining_tokens) for r in s.forecast.requests
                 if r.request_id != request_id] for i, s in states.items()}
    request = next(r for r in states[source].forecast.requests if r.request_id == request_id)
    lists[target].append((request.tokens, request.remaining_tokens))
    return {i: state(i, lists[i]) for i in states}


def test_selection_picks_the_largest_variance_reduction() -> None:
    states = {0: state(0, [(7000, 2000.0), (2000, 2000.0), (500, 2000.0)]),
              1: state(1, [(800, 2000.0)]), 2: state(2, [(1000, 2000.0)])}
    classes = classify(states, 0.1)
    candidates = enumerate_candidates(states, classes, free_cost, OFFSETS)
    best, change, before = select_migration(candidates, states, SETTINGS.step_offsets(),
                                            SETTINGS.weights(), 0.0)
    assert best is not None
    weights = SETTINGS.weights()
    after = {(c.request.request_id, c.target):
             weighted_variance(moved(states, c.source, c.target, c.request.request_id),
                               weights) for c in candidates}
    assert (best.request.request_id, best.target) == min(after, key=after.get)
    assert before + change == pytest.approx(after[(best.request.request_id, best.target)])
    assert (best.request.tokens, best.target) == (2000, 1)  # not the biggest: it overshoots


def test_prediction_changes_the_choice() -> None:
    # two equal requests now; one finishes in 10 steps, the other runs long: moving the
    # long one balances the future, the short one only the present
    states = {0: state(0, [(4000, 10.0), (4000, 5000.0), (1000, 5000.0)]), 1: state(1, [])}
    classes = classify(states, 0.1)
    candidates = enumerate_candidates(states, classes, free_cost, OFFSETS)
    best, _, _ = select_migration(candidates, states, SETTINGS.step_offsets(),
                                  SETTINGS.weights(), 0.0)
    assert best is not None and best.request.remaining_tokens == 5000.0


def test_no_migration_when_balanced() -> None:
    states = {i: state(i, [(3000, 2000.0), (1000, 500.0)]) for i in range(3)}
    classes = classify(states, 0.1)
    assert classes.overloaded == ()
    assert enumerate_candidates(states, classes, free_cost, OFFSETS) == []


def test_no_migration_when_the_best_candidate_is_about_to_finish() -> None:
    # the overloaded instance's big request finishes in 3 steps; the move takes 10
    states = {0: state(0, [(20_000, 3.0), (100, 3000.0)]), 1: state(1, [(100, 3000.0)])}
    classes = classify(states, 0.1)
    assert classes.overloaded == (0,)
    cost = lambda s, t, tokens: 0.2  # noqa: E731
    candidates = enumerate_candidates(states, classes, cost, OFFSETS)
    assert all(c.request.tokens != 20_000 for c in candidates)
    best, _, _ = select_migration(candidates, states, SETTINGS.step_offsets(),
                                  SETTINGS.weights(), 0.01)
    assert best is None  # moving the small one would not pay


# ---- whole rounds (lines 1-10) ----

@dataclass
class FakeLoad:
    running_tokens: int
    running_decodes: int
    decode_forecast: DecodeForecast | None
    decode_queue_tokens: int = 0
    total_blocks: int = 100_000


def cluster(groups: list[list[tuple[int, int, int]]],
            settings: ForecastSettings = SETTINGS) -> tuple[ClusterView, list[Request],
                                                             DecodeLoadTracker]:
    """Instances holding requests of (input, generated, true output length), with the
    forecasts their workers would report under `settings`."""
    tracker = DecodeLoadTracker(settings)
    loads, requests = [], []
    for i, group in enumerate(groups):
        here = []
        for k, (prompt, generated, output) in enumerate(group):
            request = Request(i * 100 + k, 0.0, prompt, output)
            request.generated_tokens, request.decode_instance = generated, i
            here.append(request)
        requests += here
        forecast = tracker.forecast(i, here, ())
        loads.append(FakeLoad(sum(r.sequence_tokens for r in here), len(here), forecast))
    return ClusterView(5.0, loads), requests, tracker


def test_round_emits_one_migrate_with_its_reason() -> None:
    view, requests, _ = cluster([[(100, 1000, 9000), (100, 2000, 9000), (100, 10, 9000)],
                                 [(100, 100, 600)], [(100, 100, 600)]])
    rebalancer = AresRebalancer(AresSettings(forecast=SETTINGS), perf_model(
        "deepseek-r1-distill-qwen-7b-w8a8", "rtx-4090d"))
    for request in requests:
        rebalancer.on_decode(request, request.decode_instance)
    board = RoleBoard([Role.DECODE] * 3)
    actions = rebalancer.on_tick(view, board)
    assert len(actions) == 1
    action = actions[0]
    assert isinstance(action, Migrate) and action.source_id == 0 and action.target_id in (1, 2)
    assert action.reason.startswith("ares alg1: predicted load")
    assert rebalancer.on_tick(view, board) == []  # within the 1 s interval
    view.now_s += 1.0
    again = rebalancer.on_tick(view, board)
    assert all(a.request.request_id != action.request.request_id for a in again)  # cooldown


def test_current_load_mode_ignores_predictions() -> None:
    # instance 0 holds more tokens now but they all finish within a few steps; instance 1's
    # requests run long. Predicted load says 1 is overloaded; current load says 0.
    groups = [[(100, 3000, 3005), (100, 3000, 3005)],
              [(100, 1500, 20_000), (100, 1500, 20_000)], []]
    perf = perf_model("deepseek-r1-distill-qwen-7b-w8a8", "rtx-4090d")
    board = RoleBoard([Role.DECODE] * 3)
    moves = []
    for settings in (AresSettings(forecast=SETTINGS),
                     AresSettings(predictive=False, forecast=SETTINGS)):
        rebalancer = AresRebalancer(settings, perf)
        view, requests, _ = cluster(groups, rebalancer.forecast_settings)
        for request in requests:
            rebalancer.on_decode(request, request.decode_instance)
        moves.append(rebalancer.on_tick(view, board))
    assert [m[0].source_id for m in moves] == [1, 0]
    assert "current load" in moves[1][0].reason


def test_blocks_are_counted_as_capacity() -> None:
    view, requests, _ = cluster([[(100, 5000, 9000), (100, 5000, 9000)], []])
    view.instances[1].total_blocks = 5000 // KV_BLOCK_TOKENS  # too small for either
    rebalancer = AresRebalancer(AresSettings(forecast=SETTINGS), perf_model(
        "deepseek-r1-distill-qwen-7b-w8a8", "rtx-4090d"))
    for request in requests:
        rebalancer.on_decode(request, request.decode_instance)
    assert rebalancer.on_tick(view, RoleBoard([Role.DECODE] * 2)) == []
    assert rebalancer.records[-1].overloaded == 1 and rebalancer.records[-1].candidates == 0


# ---- the vectorised round picks what the reference phases pick ----

def test_fast_round_equals_the_reference_phases() -> None:
    import random

    from pdserve.cluster.topology import Link, Topology
    from pdserve.policies.ares.fast_round import LinkCosts, best_move

    rng = random.Random(5)
    topology = Topology.build([Link("nvlink", 200e9, 1e-5)] * 12, 4, Link("net", 3e9, 5e-5))
    links = LinkCosts.of(topology, perf_model("deepseek-r1-distill-qwen-7b-w8a8",
                                              "rtx-4090d"), 12)
    kv_bytes = 57344
    picked = 0
    for _trial in range(60):
        states = {}
        for i in range(12):
            decodes = [(rng.randint(50, 20_000), rng.choice([3.0, 40.0, 900.0, 8000.0,
                                                             rng.uniform(1, 5000)]))
                       for _ in range(rng.randint(0, 6))]
            states[i] = state(i, decodes, capacity=rng.choice([60_000, 200_000]),
                              step_s=rng.uniform(0.01, 0.05))
        classes = classify(states, rng.choice([0.0, 0.1, 0.3]))
        skip = {rng.randint(0, 1200) for _ in range(5)}
        cost = lambda s, t, tokens: links.time_s(s, t, tokens * kv_bytes)  # noqa: E731
        reference = select_migration(
            enumerate_candidates(states, classes, cost, OFFSETS, skip), states, OFFSETS,
            SETTINGS.weights(), 0.01)
        fast = best_move(states, classes, links, kv_bytes, OFFSETS, SETTINGS.weights(),
                         0.01, skip)
        assert fast[2] == pytest.approx(reference[2])  # σ̂² before
        if reference[0] is None:
            assert fast[0] is None
            continue
        picked += 1
        assert fast[0] is not None
        assert (fast[0].request.request_id, fast[0].source, fast[0].target) == (
            reference[0].request.request_id, reference[0].source, reference[0].target)
        assert fast[1] == pytest.approx(reference[1])
    assert picked > 20
