"""AMPD's Algorithm 1 (adaptive routing) and binding on constructed cluster states."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import make_perf

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceStats
from pdserve.policies.ampd.binding import bound_decode_instance
from pdserve.policies.ampd.context import AmpdContext
from pdserve.policies.ampd.cost_model import (
    PrefillTask,
    local_cost_s,
    prefill_time_s,
    remote_cost_s,
)
from pdserve.policies.ampd.routing import AmpdDecodeRouter, AmpdPrefillRouter
from pdserve.types import Request, Role, attn_units

P, D = Role.PREFILL, Role.DECODE
IDLE = InstanceStats(instance_id=0, prefill_queue_len=0, prefill_queue_tokens=0,
                     prefill_queue_attn_units=0, decode_queue_len=0, decode_queue_tokens=0,
                     running_decodes=0, running_tokens=0, used_blocks=0, total_blocks=10_000,
                     preemptions_total=0, decode_steps_total=0, decode_busy_s_total=0.0)
PERF = make_perf()
TTFT_SLO, ITL_SLO = 1.0, 0.05


def setup(loads: list[InstanceStats], roles: list[Role],
          now_s: float = 100.0) -> tuple[ClusterView, RoleBoard, AmpdContext]:
    view = ClusterView(now_s, [replace(load, instance_id=i) for i, load in enumerate(loads)])
    return view, RoleBoard(roles), AmpdContext(TTFT_SLO, ITL_SLO, [PERF])


def set_itl(context: AmpdContext, view: ClusterView, instance: int, itl_s: float) -> None:
    """Two monitor snapshots 5 s apart in which `instance` ran 100 steps of `itl_s` each."""
    before = ClusterView(view.now_s - 5, list(view.instances))
    context.monitor.observe(before)
    loads = list(view.instances)
    loads[instance] = replace(loads[instance], decode_steps_total=100,
                              decode_busy_s_total=100 * itl_s)
    view.instances = loads
    context.monitor.observe(view)


def round_request(history: int = 0, new: int = 1000, home: int = -1) -> Request:
    request = Request(7, 99.0, history + new, 20, session_id=3, history_tokens=history,
                      cached_prefix_tokens=history, home_instance=home)
    return request


def test_binding_picks_least_memory_and_sticks() -> None:
    view, board, _ = setup([IDLE, replace(IDLE, used_blocks=5000),
                            replace(IDLE, used_blocks=1000)], [P, D, D])
    request = round_request()
    assert bound_decode_instance(request, view, board)[0] == 2
    assert request.home_instance == 2
    view.instances = [IDLE, IDLE, replace(IDLE, used_blocks=9000)]
    assert bound_decode_instance(request, view, board)[0] == 2  # bound: stays
    promised = replace(IDLE, decode_queue_tokens=16 * 6000)  # incoming hand-offs count
    view.instances = [IDLE, replace(IDLE, used_blocks=5000), promised]
    assert bound_decode_instance(round_request(), view, board)[0] == 1


def test_line2_remote_to_prefill_worker_with_ttft_slack() -> None:
    view, board, ctx = setup([IDLE, IDLE, IDLE], [P, P, D])
    ctx.record_ttft(0, 99.0, 0.95)  # > 0.9 * SLO
    ctx.record_ttft(1, 99.0, 0.85)  # <= 0.9 * SLO
    router = AmpdPrefillRouter(ctx)
    for _ in range(5):  # random order, but only instance 1 qualifies
        assert router.route(round_request(home=2), view, board) == 1
    assert ctx.counts["remote"] == 5
    assert "alg1 line 2" in ctx.decisions[-1].reason


def test_ttft_window_forgets_old_samples() -> None:
    view, board, ctx = setup([IDLE, IDLE], [P, D])
    ctx.record_ttft(0, 80.0, 5.0)  # 20 s ago: outside the 10 s window
    assert ctx.windowed_ttft_s(0, view.now_s) == 0.0
    assert AmpdPrefillRouter(ctx).route(round_request(home=1), view, board) == 0


def test_line4_local_when_prefill_pressed_and_decode_has_itl_slack() -> None:
    view, board, ctx = setup([IDLE, IDLE], [P, D])
    ctx.record_ttft(0, 99.0, 0.95)
    set_itl(ctx, view, 1, 0.04)  # <= 0.85 * 50 ms
    assert AmpdPrefillRouter(ctx).route(round_request(home=1), view, board) == 1
    assert ctx.decisions[-1].kind == "local"
    set_itl(ctx, view, 1, 0.045)  # > 42.5 ms: no slack, goes to the cost model
    AmpdPrefillRouter(ctx).route(round_request(home=1), view, board)
    assert ctx.decisions[-1].kind.startswith("cost-")


def test_line9_cost_model_picks_cheaper_of_local_and_remote() -> None:
    # prefill worker 0 has a long queue, worker 1 a short one; decode 2 has a medium queue
    def queue(tokens: int) -> InstanceStats:
        return replace(IDLE, prefill_queue_len=1, prefill_queue_tokens=tokens,
                       prefill_queue_attn_units=attn_units(tokens, 0))
    view, board, ctx = setup([queue(40_000), queue(2_000), queue(10_000)], [P, P, D])
    for i in (0, 1):
        ctx.record_ttft(i, 99.0, 2.0)
    set_itl(ctx, view, 2, 0.1)
    request = round_request(history=3000, new=500, home=2)
    assert AmpdPrefillRouter(ctx).route(request, view, board) == 1
    assert ctx.decisions[-1].kind == "cost-remote"
    # the decode worker's own queue empty: local wins (no KV to move, no queue)
    view.instances = [*view.instances[:2], replace(view.instances[2], prefill_queue_len=0,
                                                   prefill_queue_tokens=0,
                                                   prefill_queue_attn_units=0)]
    assert AmpdPrefillRouter(ctx).route(request, view, board) == 2
    assert ctx.decisions[-1].kind == "cost-local"


def test_cost_model_equations() -> None:
    view, _, _ = setup([replace(IDLE, prefill_queue_len=2, prefill_queue_tokens=300,
                                prefill_queue_attn_units=50_000), IDLE], [P, D])
    task = PrefillTask(history_tokens=3000, new_tokens=500)
    compute = PERF.prefill.time_s(500, 500 * (500 + 2 * 3000))
    assert prefill_time_s(PERF, task) == pytest.approx(compute)
    queue_s = 2 * 0.01 + 300 * 2e-5 + 50_000 * 1e-9
    kv_s = PERF.transfer_time_s(3000) + PERF.transfer_time_s(500)  # history in, new KV out
    assert remote_cost_s(view, PERF, 0, 1, task) == pytest.approx(compute + queue_s + kv_s)
    assert local_cost_s(view, PERF, 1, task) == pytest.approx(compute)
    no_history = PrefillTask(0, 500)  # a first round reads nothing
    assert remote_cost_s(view, PERF, 0, 1, no_history) == pytest.approx(
        prefill_time_s(PERF, no_history) + queue_s + PERF.transfer_time_s(500))


def test_always_remote_and_decode_router_records_ttft() -> None:
    queue = replace(IDLE, prefill_queue_len=1, prefill_queue_tokens=5000,
                    prefill_queue_attn_units=attn_units(5000, 0))
    view, board, ctx = setup([queue, IDLE, IDLE], [P, P, D])
    request = round_request(home=2)
    assert AmpdPrefillRouter(ctx, adaptive=False).route(request, view, board) == 1
    assert AmpdDecodeRouter(ctx).route(request, 1, view, board) == 2  # the bound worker
    assert ctx.windowed_ttft_s(1, view.now_s) == pytest.approx(1.0)  # 100 - 99


def test_line2_random_choice_among_slack_workers_follows_the_runs_seed() -> None:
    from pdserve.config import Config
    from pdserve.policies.presets import build_policy
    from pdserve.sim.runner import policy_setup

    def choices(seed: int) -> list[int]:
        config = Config().with_values({"policy.name": "ampd", "cluster.prefill": 4,
                                       "cluster.decode": 1, "seed": seed})
        policy, _ = build_policy(policy_setup(config, PERF))
        view, board, _ = setup([IDLE] * 5, [P, P, P, P, D])
        context = policy.prefill_router.context
        for worker in range(4):
            context.record_ttft(worker, 99.0, 0.1)  # every prefill worker has slack
        return [policy.prefill_router.route(round_request(home=4), view, board)
                for _ in range(20)]

    assert choices(1) == choices(1)
    assert choices(1) != choices(2)
    assert set(choices(1)) == {0, 1, 2, 3}  # random among the slack ones, not the first
