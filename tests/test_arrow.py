"""Arrow's algorithms on constructed cluster states (Arrow sec. 5, Alg. 1-4)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import make_perf

from pdserve.cluster.events import ClusterView
from pdserve.cluster.monitor import InstanceMonitor
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceStats
from pdserve.perf.fitted import PrefillCoeffs
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.decode_router import ArrowDecodeRouter
from pdserve.policies.arrow.pools import (
    settle,
    try_move_decode_to_prefill,
    try_move_prefill_to_decode,
)
from pdserve.policies.arrow.prefill_router import ArrowPrefillRouter
from pdserve.policies.arrow.profiling import (
    TtftPredictor,
    max_running_tokens,
    profile_ttft,
)
from pdserve.policies.arrow.role_manager import ArrowRoleManager
from pdserve.types import Request, Role, attn_units

P, D, PD, DP = Role.PREFILL, Role.DECODE, Role.P_TO_D, Role.D_TO_P
IDLE = InstanceStats(instance_id=0, prefill_queue_len=0, prefill_queue_tokens=0,
                     prefill_queue_attn_units=0, decode_queue_len=0, decode_queue_tokens=0,
                     running_decodes=0, running_tokens=0, used_blocks=0, total_blocks=10_000,
                     preemptions_total=0, decode_steps_total=0, decode_busy_s_total=0.0)
# TTFT(n) = 0.1 + 0.001 n  (s): a 1000-token prompt takes 1.1 s
PREDICTOR = TtftPredictor(PrefillCoeffs(0.1, 0.001, 0.0))


def queued(seconds_of_prefill: float) -> InstanceStats:
    """An instance with one queued prompt that takes `seconds_of_prefill` to run."""
    tokens = round((seconds_of_prefill - 0.1) / 0.001)
    return replace(IDLE, prefill_queue_len=1, prefill_queue_tokens=tokens,
                   prefill_queue_attn_units=tokens * tokens)


def decoding(tokens: int, count: int = 4) -> InstanceStats:
    return replace(IDLE, running_tokens=tokens, running_decodes=count)


def make(roles: list[Role], loads: list[InstanceStats], max_tokens: int = 10_000,
         ttft_slo_s: float = 2.0) -> tuple[ClusterView, RoleBoard, ArrowContext]:
    view = ClusterView(0.0, [replace(load, instance_id=i) for i, load in enumerate(loads)])
    context = ArrowContext(ttft_slo_s=ttft_slo_s, tpot_slo_s=0.1, predictor=PREDICTOR,
                           monitor=InstanceMonitor(5.0), max_running_tokens=max_tokens,
                           max_batch_size=64)
    return view, RoleBoard(roles), context


PROMPT = Request(0, 0.0, 500, 10)  # predicted TTFT 0.6 s


# ---- the TTFT predictor and profiling ----

def test_ttft_predictor_fits_a_quadratic_and_predicts_queues_including_partial_prefills():
    predictor = TtftPredictor.fit([(n, 0.02 + 1e-5 * n + 3e-9 * n * n)
                                   for n in (100, 500, 1000, 4000, 8000)])
    assert predictor.ttft_s(2000) == pytest.approx(0.02 + 0.02 + 0.012, rel=1e-6)
    # queue: a fresh 1000-token prompt, and a 3000-token prompt with 1000 tokens done
    load = replace(IDLE, prefill_queue_len=2, prefill_queue_tokens=1000 + 2000,
                   prefill_queue_attn_units=attn_units(1000, 0) + attn_units(2000, 1000))
    a = predictor.coeffs.intercept_s  # the partial one still needs a batch of its own
    expected = predictor.ttft_s(1000) + a + (predictor.ttft_s(3000) - predictor.ttft_s(1000))
    assert predictor.queue_delay_s(load) == pytest.approx(expected, rel=1e-6)


def test_profiled_ttft_includes_one_overhead_per_chunk():
    perf = make_perf()
    samples = dict(profile_ttft(perf, chunk_size_tokens=1000, lengths=(500, 2500)))
    c = perf.prefill
    assert samples[500] == pytest.approx(c.time_s(500, 500 * 500))
    assert samples[2500] == pytest.approx(3 * c.intercept_s + c.per_token_s * 2500
                                          + c.per_attn_unit_s * 2500 * 2500)


def test_profile_skips_prompts_whose_kv_does_not_fit_in_whole_blocks():
    """Capacity 1,000 tokens is 62 blocks (992 tokens): a 995-token prompt fits the token
    count but not the blocks, and must be skipped rather than planned forever."""
    samples = dict(profile_ttft(make_perf(kv_capacity_tokens=1_000), chunk_size_tokens=512,
                                lengths=(900, 990, 995)))
    assert sorted(samples) == [900, 990]


def test_max_running_tokens_is_bounded_by_memory_and_by_the_tpot_slo():
    perf = make_perf(kv_capacity_tokens=100_000)
    assert max_running_tokens(perf, tpot_slo_s=10.0, max_batch_size=64) == 100_000
    # step = 0.008 + 1e-4 * 64 + 2e-7 * S <= 0.02  ->  S <= 28,000
    assert max_running_tokens(perf, tpot_slo_s=0.02, max_batch_size=64) == 28_000


# ---- Algorithm 1 ----

def test_alg1_returns_t1_when_it_meets_the_ttft_slo():
    view, board, context = make([P, P, D, D], [queued(1.3), queued(0.5), IDLE, IDLE])
    assert ArrowPrefillRouter(context).route(PROMPT, view, board) == 1
    assert board.take_changes() == []


def test_alg1_falls_back_to_the_d_to_p_pool():
    view, board, context = make([P, DP, D, D], [queued(1.5), queued(0.2), IDLE, IDLE])
    assert ArrowPrefillRouter(context).route(PROMPT, view, board) == 1


def test_alg1_flips_the_least_loaded_decode_instance_when_decode_load_is_low():
    view, board, context = make([P, DP, D, D, D],
                                [queued(1.5), queued(1.9), decoding(900), IDLE, decoding(50)])
    chosen = ArrowPrefillRouter(context).route(PROMPT, view, board)
    assert chosen == 3
    assert board.roles[3] is P  # it had no decodes, so straight into the prefill pool
    assert [(c.instance_id, c.role) for c in board.take_changes()] == [(3, P)]


def test_alg1_flipped_instance_with_decodes_enters_d_to_p():
    view, board, context = make([P, D, D], [queued(1.9), decoding(100), decoding(300)])
    assert ArrowPrefillRouter(context).route(PROMPT, view, board) == 1
    assert board.roles[1] is DP


def test_alg1_returns_t1_without_flipping_when_decode_load_is_high():
    # without the least-loaded decode instance (8,500 tokens), Alg. 2's choice holds 8,500
    # tokens, past 0.8 of the 10,000 Max Running Tokens
    view, board, context = make([P, P, D, D, D],
                                [queued(1.5), queued(1.8), decoding(9_000), decoding(8_500),
                                 decoding(8_500)])
    assert ArrowPrefillRouter(context).route(PROMPT, view, board) == 0
    assert board.take_changes() == []


def test_alg1_with_an_empty_prefill_pool_uses_d_to_p():
    view, board, context = make([DP, D], [queued(1.9), decoding(100)])
    assert ArrowPrefillRouter(context).route(PROMPT, view, board) == 0  # no flip: last decode


# ---- Algorithm 2 ----

def test_alg2_decodes_in_place_when_the_prefill_instance_was_flipped_to_decode():
    view, board, context = make([PD, D], [queued(0.5), IDLE])
    assert ArrowDecodeRouter(context).route(PROMPT, 0, view, board) == 0


def test_alg2_picks_the_decode_instance_with_fewest_tokens_counting_incoming():
    view, board, context = make([P, D, D], [IDLE, decoding(3000),
                                            replace(decoding(1000), decode_queue_tokens=2500)])
    assert ArrowDecodeRouter(context).route(PROMPT, 0, view, board) == 1


def test_alg2_falls_back_to_p_to_d_then_flips_a_prefill_instance():
    view, board, context = make([P, P, D, PD], [queued(0.9), queued(0.3), decoding(20_000),
                                                decoding(5_000)], max_tokens=10_000)
    assert ArrowDecodeRouter(context).route(PROMPT, 0, view, board) == 3  # P->D can take it
    view, board, context = make([P, P, D, PD], [queued(0.9), queued(0.3), decoding(20_000),
                                                decoding(15_000)], max_tokens=10_000)
    assert ArrowDecodeRouter(context).route(PROMPT, 0, view, board) == 1  # least prefill delay
    assert board.roles[1] is PD  # it still has a queued prefill


def test_alg2_without_a_flip_returns_the_less_loaded_of_t1_and_t2():
    view, board, context = make([P, D, PD], [queued(0.9), decoding(20_000), decoding(15_000)],
                                max_tokens=10_000)
    assert ArrowDecodeRouter(context).route(PROMPT, 0, view, board) == 2
    assert board.roles[0] is P  # the last prefill-capable instance stays


def test_alg2_prefers_instances_with_a_free_batch_slot():
    full = decoding(100, count=64)
    view, board, context = make([P, D, D], [IDLE, full, decoding(5_000)])
    assert ArrowDecodeRouter(context).route(PROMPT, 0, view, board) == 2


# ---- Algorithms 3 and 4, settling ----

def test_alg3_never_flips_the_last_decode_capable_instance_and_prefers_p_to_d():
    view, board, context = make([P, D], [IDLE, IDLE])
    assert try_move_decode_to_prefill(view, board, context, "test") is None
    view, board, context = make([P, D, PD, D], [IDLE, decoding(10), decoding(500), IDLE])
    assert try_move_decode_to_prefill(view, board, context, "test") == 2
    assert board.roles[2] is DP


def test_alg4_never_flips_the_last_prefill_capable_instance_and_prefers_d_to_p():
    view, board, context = make([DP, D], [IDLE, IDLE])
    assert try_move_prefill_to_decode(view, board, context, "test") is None
    view, board, context = make([P, DP, DP, D], [IDLE, queued(1.0), queued(0.4), IDLE])
    assert try_move_prefill_to_decode(view, board, context, "test") == 2
    assert board.roles[2] is PD


def test_transitional_instances_settle_when_their_old_work_is_done():
    view, board, _ = make([PD, DP, DP], [IDLE, IDLE, decoding(10)])
    for i in range(3):
        settle(i, view, board)
    assert board.roles == [D, P, DP]


# ---- monitor-triggered flips ----

def tick(monitor_view: ClusterView, manager: ArrowRoleManager, board: RoleBoard,
         now_s: float) -> None:
    monitor_view.now_s = now_s
    manager.on_tick(monitor_view, board)


def test_monitor_flips_prefill_to_decode_when_token_interval_exceeds_the_tpot_slo():
    view, board, context = make([P, P, D], [IDLE, queued(0.5), decoding(100)])
    manager = ArrowRoleManager(context, prefill=2, decode=1)
    tick(view, manager, board, 0.0)
    instances = list(view.instances)
    instances[2] = replace(instances[2], decode_steps_total=10, decode_busy_s_total=1.5)
    view.instances = instances
    tick(view, manager, board, 1.0)  # 0.15 s per token > 0.1 s TPOT SLO
    assert board.roles == [D, P, D]  # Alg. 4: the prefill instance with the least delay


def test_monitor_moves_an_idle_prefill_instance_to_a_busy_decode_pool():
    view, board, context = make([P, P, D], [queued(0.5), IDLE, decoding(6_000)])
    manager = ArrowRoleManager(context, prefill=2, decode=1)
    tick(view, manager, board, 0.0)  # 6,000 tokens >= half of 10,000 Max Running Tokens
    assert board.roles == [P, D, D]
    tick(view, manager, board, 10.0)  # past the monitor's cooldown
    assert board.roles == [P, D, D]  # the last prefill-capable instance stays


def test_monitor_windows_token_intervals():
    view, _, _ = make([D], [IDLE])
    monitor = InstanceMonitor(window_s=2.0)
    for second, (steps, busy) in enumerate([(0, 0.0), (100, 1.0), (200, 3.0), (300, 6.0)]):
        view.now_s = float(second)
        view.instances = [replace(IDLE, decode_steps_total=steps, decode_busy_s_total=busy)]
        monitor.observe(view)
    assert monitor.token_interval_s([0]) == pytest.approx((6.0 - 1.0) / 200)
