"""FlowKV's load-aware scheduling: scores, scenarios with hysteresis, imbalance help through
the phase-priority switch, elastic scaling (FlowKV Alg. 1, appendix B)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import local_scheduler, make_perf

from pdserve.cluster.actions import SetPhasePriority, StartInstance, StopInstance
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.phase_priority import PhasePriority
from pdserve.instance.stats import InstanceStats
from pdserve.policies.flowkv.balance import PhaseBalancer
from pdserve.policies.flowkv.context import FlowKVContext
from pdserve.policies.flowkv.scaling import ElasticScaler
from pdserve.policies.flowkv.scenario import Scenario, ScenarioClassifier
from pdserve.policies.flowkv.scores import decode_score, normalise, prefill_score
from pdserve.policies.flowkv.settings import (
    DECODE_WEIGHTS,
    PREFILL_WEIGHTS,
    FlowKVSettings,
    ScoreScales,
    ScoreWeights,
)
from pdserve.policies.flowkv.status import NodeStatus, StatusWindow
from pdserve.types import Request, Role

IDLE = InstanceStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 1000, 0, 0, 0.0)


def stats(**fields) -> InstanceStats:
    return replace(IDLE, **fields)


def test_status_window_smooths_queues_and_derives_utilisation_from_counters():
    window = StatusWindow(window_s=10.0, chunk_size_tokens=1000)
    for t, waiting, busy, decode_busy in ((0.0, 0, 0.0, 0.0), (1.0, 4, 0.8, 0.2),
                                          (2.0, 2, 1.4, 0.6)):
        load = stats(prefill_queue_len=waiting, prefill_queue_tokens=500 * waiting,
                     used_blocks=250, busy_s_total=busy, decode_busy_s_total=decode_busy,
                     preemptions_total=int(t) * 2)
        window.observe(ClusterView(t, [load]))
    status = window.status(0)
    assert status.prefill_waiting == pytest.approx(2.0)  # mean of 0, 4, 2
    assert status.token_budget_steps == pytest.approx(1.0)  # 1000 queued tokens / 1000
    assert status.kv_utilisation == pytest.approx(0.25)
    assert status.compute_utilisation == pytest.approx(0.7)  # 1.4 s busy over 2 s
    assert status.bandwidth_utilisation == pytest.approx(0.3)
    assert status.preemptions_per_s == pytest.approx(2.0)


def test_scores_are_normalised_weighted_sums_in_zero_one():
    status = NodeStatus(prefill_running=1, prefill_waiting=16, prefill_sending=2,
                        decode_running=32, decode_waiting=0, preemptions_per_s=0.5,
                        token_budget_steps=2, kv_utilisation=0.5, compute_utilisation=1.0,
                        bandwidth_utilisation=0.2)
    n = normalise(status, ScoreScales(), max_batch_size=256)
    assert (n.prefill_running, n.prefill_waiting, n.prefill_sending) == (0.5, 1.0, 0.25)
    assert (n.decode_running, n.swapped, n.token_budget) == (0.5, 0.5, 0.5)
    w = PREFILL_WEIGHTS
    assert prefill_score(n, w) == pytest.approx(
        0.10 * 0.5 + 0.30 * 1.0 + 0.10 * 0.25 + 0.20 * 0.5 + 0.05 * 0.5 + 0.20 * 1.0
        + 0.05 * 0.2)
    saturated = NodeStatus(*([1e9] * 10))
    assert prefill_score(normalise(saturated, ScoreScales(), 256), w) == pytest.approx(1.0)
    assert decode_score(normalise(saturated, ScoreScales(), 256), DECODE_WEIGHTS) == \
        pytest.approx(1.0)
    with pytest.raises(ValueError, match="sum to 1"):
        ScoreWeights(0.5, 0.5, 0.5, 0, 0, 0, 0, 0)


def test_a_load_sitting_at_a_threshold_does_not_flap():
    classifier = ScenarioClassifier(FlowKVSettings(confirm_ticks=3))
    seen = []
    for tick in range(60):  # C^p jitters around eps_p_low = 0.35, inside the hysteresis band
        c_p = 0.35 + (0.04 if tick % 2 else -0.04)
        seen.append(classifier.update(c_p, 0.1, float(tick)))
    assert set(seen) == {Scenario.NORMAL}
    for tick in range(60, 62):  # clearly past low + margin: needs 3 ticks in a row
        assert classifier.update(0.5, 0.1, float(tick)) is Scenario.NORMAL
    assert classifier.update(0.5, 0.1, 62.0) is Scenario.IMBALANCED
    seen = [classifier.update(0.35 + (0.04 if t % 2 else -0.04), 0.1, 63.0 + t)
            for t in range(40)]  # back at the threshold: stays imbalanced, no flapping
    assert set(seen) == {Scenario.IMBALANCED}
    for t in range(3):
        scenario = classifier.update(0.9, 0.1, 103.0 + t)
    assert scenario is Scenario.EXTREME and classifier.overloaded_phase_is_prefill(0.9, 0.1)
    classifier_plain = ScenarioClassifier(FlowKVSettings(hysteresis=0.0, confirm_ticks=1))
    flips = [classifier_plain.update(0.35 + (0.04 if t % 2 else -0.04), 0.1, float(t))
             for t in range(10)]
    assert len(set(flips)) == 2  # without hysteresis and confirmation the same load flaps


def _requests(count: int, tokens: int, start_id: int = 0) -> list[Request]:
    return [Request(start_id + i, 0.0, tokens, 50) for i in range(count)]


def test_prefill_first_runs_prefill_chunks_alone_decode_first_mixes_them():
    for priority in PhasePriority:
        local = local_scheduler(0, 1000, chunk_size_tokens=256)
        local.set_phase_priority(priority)
        decoding = _requests(3, 40)
        for request in decoding:
            local.enqueue_prefill(request)
        first = local.plan()
        local.complete(first)
        for request in decoding:
            local.continue_in_place(request)
        for request in _requests(2, 300, start_id=10):
            local.enqueue_prefill(request)
        plan = local.plan()
        if priority is PhasePriority.PREFILL_FIRST:
            assert plan.decodes == [] and sum(t for _, t in plan.chunks) == 256
        else:
            assert len(plan.decodes) == 3 and sum(t for _, t in plan.chunks) == 256 - 3


def _context(homes: list[Role], settings: FlowKVSettings | None = None) -> FlowKVContext:
    return FlowKVContext(settings or FlowKVSettings(), [make_perf()] * len(homes), list(homes),
                         2048, 256)


def test_idle_instances_help_the_overloaded_phase_and_go_home_after_their_term():
    homes = [Role.PREFILL, Role.PREFILL, Role.DECODE, Role.DECODE]
    context = _context(homes, FlowKVSettings(switch_ticks=2))
    board = RoleBoard(list(homes))
    balancer = PhaseBalancer(context, PhasePriority.PREFILL_FIRST)
    view = ClusterView(0.0, [IDLE] * 4)
    context.c_prefill, context.c_decode = 0.6, 0.1
    context.classifier.prefill_level = 1
    context.decode_scores = [0.0, 0.0, 0.05, 0.5]  # instance 2 idle, 3 busy
    actions = balancer.on_tick(Scenario.IMBALANCED, view, board)
    assert actions == [SetPhasePriority(2, PhasePriority.PREFILL_FIRST)]
    assert "prefill overloaded" in actions[0].reason
    assert board.roles[2] is Role.MIXED and 2 in board.prefill_candidates
    assert [c.role for c in board.take_changes()] == [Role.MIXED]
    assert balancer.on_tick(Scenario.NORMAL, view, board) == []  # mid-term: stays
    actions = balancer.on_tick(Scenario.NORMAL, view, board)  # term over, load normal
    assert actions == [SetPhasePriority(2, PhasePriority.PREFILL_FIRST)]
    assert "normal" in actions[0].reason and board.roles[2] is Role.DECODE
    # a decode-overloaded cluster lends idle prefill instances decode-first
    context.c_prefill, context.c_decode = 0.1, 0.6
    context.classifier.prefill_level, context.classifier.decode_level = 0, 1
    context.prefill_scores = [0.1, 0.9, 0.0, 0.0]
    actions = balancer.on_tick(Scenario.IMBALANCED, view, board)
    assert actions == [SetPhasePriority(0, PhasePriority.DECODE_FIRST)]
    assert board.roles[0] is Role.MIXED and 0 in board.decode_candidates


def test_scale_up_starts_a_stopped_reserve_then_down_stops_it_when_drained():
    homes = [Role.PREFILL, Role.DECODE, Role.RESERVE, Role.RESERVE]
    settings = FlowKVSettings(scale_up_after_s=5, scale_cooldown_s=20, scale_down_after_s=15)
    context = _context(homes, settings)
    board = RoleBoard(list(homes))
    board.stopped.update({2, 3})  # as the scheduler holds reserves at the start
    scaler = ElasticScaler(context)
    view = ClusterView(0.0, [IDLE] * 4)
    context.classifier.prefill_level = 2  # prefill overloaded
    context.c_prefill, context.c_decode = 0.9, 0.3
    for t in range(5):
        view.now_s = float(t)
        scaler.on_tick(view, board)
    assert not scaler.starting  # 4 s of overload: under the duration threshold
    view.now_s = 5.0
    scaler.on_tick(view, board)
    assert list(scaler.starting) == [2] and board.roles[2] is Role.RESERVE
    [start] = board.take_changes()
    assert start == StartInstance(2) and "scale up" in start.reason
    for t in range(6, 15):  # still overloaded, one instance starting, cooldown: no second
        view.now_s = float(t)
        scaler.on_tick(view, board)
        scaler.on_started(2, view, board)  # progress elsewhere: not started yet, no effect
    assert board.roles[2] is Role.RESERVE and len(scaler.starting) == 1
    assert board.take_changes() == []
    view.now_s = 15.5  # the driver reports it up (InstanceStarted -> on_progress)
    board.mark_started(2)
    scaler.on_started(2, view, board)
    assert board.roles[2] is Role.PREFILL and 2 in board.prefill_candidates
    assert context.side(Role.PREFILL, board) == [0, 2] and not scaler.starting
    board.take_changes()
    # load vanishes: after the cooldown and 15 s of low load, one prefill instance leaves
    context.classifier.prefill_level = 0
    context.classifier.low_load = True
    context.c_prefill = context.c_decode = 0.0
    downs, stops = [], []
    for t in range(16, 80):
        view.now_s = float(t)
        scaler.on_tick(view, board)
        downs += [e for e in scaler.events if e[2] == "to reserve" and e not in downs]
        stops += [a for a in board.take_changes() if isinstance(a, StopInstance)]
    assert [e[1] for e in downs] == [2]  # the newest prefill instance; D keeps its only one
    assert downs[0][0] == 16.0 + 15 and board.roles[2] is Role.RESERVE
    assert board.roles[:2] == [Role.PREFILL, Role.DECODE]
    assert [a.instance_id for a in stops] == [2]  # drained (idle) at its next tick: stopped
    assert 2 in board.stopped


def _overloaded_scaler(stopped: set[int]) -> tuple[ElasticScaler, RoleBoard]:
    homes = [Role.PREFILL, Role.DECODE, Role.RESERVE, Role.RESERVE]
    context = _context(homes, FlowKVSettings(scale_up_after_s=0, scale_cooldown_s=0))
    board = RoleBoard(list(homes))
    board.stopped.update(stopped)
    context.classifier.prefill_level = 2
    context.c_prefill, context.c_decode = 0.9, 0.3
    return ElasticScaler(context), board


def test_scale_up_prefers_a_reserve_still_running_which_serves_at_once():
    scaler, board = _overloaded_scaler(stopped={2})  # 3 was scaled down, not yet stopped
    scaler.on_tick(ClusterView(0.0, [IDLE] * 4), board)
    assert not scaler.starting and board.roles[3] is Role.PREFILL  # no start-up to wait for
    assert not [a for a in board.take_changes() if isinstance(a, StartInstance)]
    scaler, board = _overloaded_scaler(stopped={2})  # 3 still drains its decodes
    scaler.on_tick(ClusterView(0.0, [IDLE, IDLE, IDLE, replace(IDLE, running_decodes=1)]),
                   board)
    assert list(scaler.starting) == [2] and board.roles[3] is Role.RESERVE


def test_a_reserve_that_failed_to_start_is_not_waited_for_and_another_scales_up():
    scaler, board = _overloaded_scaler(stopped={2, 3})
    scaler.on_tick(ClusterView(0.0, [IDLE] * 4), board)
    assert list(scaler.starting) == [2] and board.starting == {2}
    board.mark_failed(2)  # the driver: its worker never came up
    assert not board.starting
    scaler.on_tick(ClusterView(1.0, [IDLE] * 4), board)  # still overloaded
    assert any(i == 2 and what == "start failed" for _, i, what, _ in scaler.events)
    assert list(scaler.starting) == [3]  # the other reserve, not the failed one
