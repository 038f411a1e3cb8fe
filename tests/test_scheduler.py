"""The pure global scheduler and the baseline policy components, on constructed states."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from conftest import make_perf, policy_setup

from pdserve.cluster.actions import DispatchDecode, DispatchPrefill, Reject, SetRole
from pdserve.cluster.events import Arrival, ClusterView, InstanceFailed, PrefillDone
from pdserve.cluster.roles import RoleBoard
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.instance.stats import InstanceStats, mean_token_interval_s
from pdserve.policies.min_load import (
    MinLoadPrefillRouter,
    MinRunningTokensDecodeRouter,
    predicted_prefill_queue_s,
)
from pdserve.policies.presets import build_policy
from pdserve.policies.round_robin import RoundRobinPrefillRouter
from pdserve.policies.setup import PolicyConfig, PolicySetup
from pdserve.policies.static_roles import StaticRoles
from pdserve.types import SLO, Request, Role

IDLE = InstanceStats(instance_id=0, prefill_queue_len=0, prefill_queue_tokens=0,
                     prefill_queue_attn_units=0, decode_queue_len=0, decode_queue_tokens=0,
                     running_decodes=0, running_tokens=0, used_blocks=0, total_blocks=1000,
                     preemptions_total=0, decode_steps_total=0, decode_busy_s_total=0.0)


def setup(policy: str | PolicyConfig, **changes) -> PolicySetup:
    section = PolicyConfig(policy) if isinstance(policy, str) else policy
    return policy_setup(make_perf(), SLO(2.0, 0.15), section, **changes)


def view_of(*loads: InstanceStats) -> ClusterView:
    return ClusterView(0.0, [replace(load, instance_id=i) for i, load in enumerate(loads)])


def test_scheduler_knows_no_clock_and_keeps_roles():
    policy, count = build_policy(setup("static-pd", prefill=2, decode=3))
    scheduler = GlobalScheduler(policy, count)
    assert scheduler.roles == [Role.PREFILL] * 2 + [Role.DECODE] * 3
    view = view_of(*[IDLE] * 5)
    [action] = scheduler.handle(Arrival(Request(7, 0.0, 100, 10)), view)
    assert isinstance(action, DispatchPrefill) and action.instance_id in (0, 1)
    [action] = scheduler.handle(PrefillDone(Request(7, 0.0, 100, 10), 1), view)
    assert isinstance(action, DispatchDecode) and action.source_id == 1
    assert action.target_id in (2, 3, 4)


def test_min_load_prefill_prefers_the_shortest_predicted_queue():
    perf = make_perf()
    busy = replace(IDLE, prefill_queue_len=1, prefill_queue_tokens=4000,
                   prefill_queue_attn_units=4000 * 4000)
    light = replace(IDLE, prefill_queue_len=3, prefill_queue_tokens=300,
                    prefill_queue_attn_units=3 * 100 * 100)
    view = view_of(busy, light, busy)
    board = RoleBoard([Role.PREFILL] * 3)
    assert MinLoadPrefillRouter(perf.prefill).route(Request(0, 0, 10, 1), view, board) == 1
    assert predicted_prefill_queue_s(light, perf.prefill) == pytest.approx(
        3 * 0.01 + 300 * 2e-5 + 30_000 * 1e-9)


def test_min_load_ties_go_to_fewer_decodes_and_failed_instances_are_skipped():
    view = view_of(replace(IDLE, running_decodes=5), IDLE, IDLE)
    board = RoleBoard([Role.MIXED] * 3)
    router = MinLoadPrefillRouter(make_perf().prefill)
    assert router.route(Request(0, 0, 10, 1), view, board) == 1
    board.mark_failed(1)
    assert router.route(Request(0, 0, 10, 1), view, board) == 2


def test_min_load_picks_the_first_least_queue_then_decodes_key():
    """The router reads a candidate's decodes only when they can decide: its pick is the
    first candidate with the least (predicted queue time, decodes) over random loads with
    many ties, as a min over those keys gives."""
    rng = random.Random(3)
    perf = make_perf()
    router = MinLoadPrefillRouter(perf.prefill)
    for _ in range(500):
        loads = []
        for _ in range(rng.randint(1, 6)):
            queued = rng.choice([0, 0, 1, 2])
            loads.append(replace(IDLE, prefill_queue_len=queued,
                                 prefill_queue_tokens=100 * queued,
                                 prefill_queue_attn_units=10_000 * queued,
                                 running_decodes=rng.choice([0, 0, 1, 3]),
                                 decode_queue_len=rng.choice([0, 0, 2])))
        view = view_of(*loads)
        board = RoleBoard([Role.MIXED] * len(loads))
        keys = [(predicted_prefill_queue_s(load, perf.prefill),
                 load.running_decodes + load.decode_queue_len) for load in view.instances]
        assert router.route(Request(0, 0, 10, 1), view, board) == keys.index(min(keys))


def test_min_running_tokens_counts_incoming_transfers():
    view = view_of(IDLE, replace(IDLE, running_tokens=500),
                   replace(IDLE, running_tokens=100, decode_queue_tokens=900),
                   replace(IDLE, running_tokens=400))
    board = RoleBoard([Role.PREFILL, Role.DECODE, Role.DECODE, Role.DECODE])
    assert MinRunningTokensDecodeRouter().route(Request(0, 0, 10, 2), 0, view, board) == 3


def test_min_running_tokens_picks_the_first_least_total():
    """The router skips a candidate's incoming tokens once its running tokens alone are no
    fewer than the best total: its pick is still the first least running + incoming."""
    rng = random.Random(5)
    router = MinRunningTokensDecodeRouter()
    for _ in range(500):
        loads = [replace(IDLE, running_tokens=rng.choice([0, 100, 200, 300]),
                         decode_queue_tokens=rng.choice([0, 0, 100, 200]))
                 for _ in range(rng.randint(1, 6))]
        view = view_of(*loads)
        board = RoleBoard([Role.DECODE] * len(loads))
        totals = [load.running_tokens + load.decode_queue_tokens for load in loads]
        assert router.route(Request(0, 0, 10, 2), 0, view, board) == totals.index(min(totals))


def test_round_robin_cycles_over_current_candidates():
    board = RoleBoard([Role.PREFILL, Role.DECODE, Role.PREFILL, Role.PREFILL])
    router = RoundRobinPrefillRouter()
    view = view_of(*[IDLE] * 4)
    picks = [router.route(Request(i, 0, 10, 1), view, board) for i in range(6)]
    assert picks == [0, 2, 3, 0, 2, 3]


def test_role_changes_become_actions_once():
    board = RoleBoard([Role.PREFILL, Role.DECODE])
    board.set_role(1, Role.MIXED)
    board.set_role(0, Role.PREFILL)  # no change, no action
    assert board.take_changes() == [SetRole(1, Role.MIXED)]
    assert board.take_changes() == []
    assert board.prefill_candidates == [0, 1] and board.decode_candidates == [1]


def test_oversized_request_and_no_capacity_are_rejected_with_a_reason():
    policy, count = build_policy(setup("colocated", instances=2))
    scheduler = GlobalScheduler(policy, count)
    view = view_of(IDLE, IDLE)  # 1000 blocks = 16,000 tokens
    [action] = scheduler.handle(Arrival(Request(0, 0.0, 15_000, 2_000)), view)
    assert isinstance(action, Reject) and "exceeds the KV capacity" in action.reason
    scheduler.handle(InstanceFailed(0), view)
    scheduler.handle(InstanceFailed(1), view)
    [action] = scheduler.handle(Arrival(Request(1, 0.0, 10, 10)), view)
    assert isinstance(action, Reject) and "no instance" in action.reason


def test_static_roles_validate_counts_and_presets_validate_names():
    with pytest.raises(ValueError, match="needs 5 instances, got 4"):
        StaticRoles(2, 3).initial_roles(4)
    with pytest.raises(ValueError, match="at least one prefill and one decode"):
        StaticRoles(0, 3)
    with pytest.raises(ValueError, match="unknown policy 'magic'"):
        build_policy(setup("magic"))
    with pytest.raises(ValueError, match="unknown prefill router 'fastest'"):
        build_policy(setup(PolicyConfig("static-pd", prefill_router="fastest")))


def test_mean_token_interval_from_two_snapshots():
    before = replace(IDLE, decode_steps_total=100, decode_busy_s_total=1.0)
    after = replace(IDLE, decode_steps_total=150, decode_busy_s_total=1.75)
    assert mean_token_interval_s(before, after) == pytest.approx(0.015)
    assert mean_token_interval_s(after, after) == 0.0


def test_role_board_lists_stay_sorted_and_skip_failed_instances():
    board = RoleBoard([Role.PREFILL, Role.DECODE, Role.PREFILL, Role.DECODE])
    board.set_role(3, Role.D_TO_P)
    board.set_role(1, Role.PREFILL)
    assert board.pools[Role.PREFILL] == [0, 1, 2] and board.pools[Role.D_TO_P] == [3]
    assert board.prefill_candidates == [0, 1, 2, 3] and board.decode_candidates == []
    board.mark_failed(2)
    board.set_role(2, Role.DECODE)  # a failed instance's role may change, it stays out
    assert board.prefill_candidates == [0, 1, 3] and board.decode_candidates == []
    assert board.count(Role.DECODE) == 0
