"""TaiChi's Algorithm 1 (flowing decode) and Algorithm 2 (length-aware prefill) on
constructed cluster states."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import make_perf

from pdserve.cluster.actions import DispatchDecode, DispatchPrefill, Migrate, Reject, SetChunkSize
from pdserve.cluster.events import Arrival, ClusterView, PrefillDone, Tick
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.config import Config
from pdserve.instance.stats import InstanceStats
from pdserve.policies.taichi.prefill_router import prefill_time_s
from pdserve.policies.taichi.preset import build_taichi
from pdserve.policies.taichi.settings import TaiChiLayout, TaiChiSettings
from pdserve.types import SLO, Request, Role

PERF = make_perf(kv_capacity_tokens=16 * 1000)  # 1000 blocks per instance
IDLE = InstanceStats(instance_id=0, prefill_queue_len=0, prefill_queue_tokens=0,
                     prefill_queue_attn_units=0, decode_queue_len=0, decode_queue_tokens=0,
                     running_decodes=0, running_tokens=0, used_blocks=0, total_blocks=1000,
                     preemptions_total=0, decode_steps_total=0, decode_busy_s_total=0.0)


DEFAULT_SLO = SLO(1.0, 0.05)


def cluster(p_heavy: int = 2, d_heavy: int = 2, slo: SLO = DEFAULT_SLO,
            **settings) -> tuple[GlobalScheduler, ClusterView]:
    policy, count = build_taichi(PERF, slo, p_heavy, d_heavy, TaiChiSettings(**settings),
                                 Config().instance.max_batch_size)
    view = ClusterView(0.0, [replace(IDLE, instance_id=i) for i in range(count)])
    return GlobalScheduler(policy, count), view


def queued(tokens: int, decodes: int = 0, used_blocks: int = 0) -> dict:
    return dict(prefill_queue_len=1 if tokens else 0, prefill_queue_tokens=tokens,
                prefill_queue_attn_units=tokens * tokens, running_decodes=decodes,
                running_tokens=decodes * 500, used_blocks=used_blocks)


def set_load(view: ClusterView, instance: int, **fields) -> None:
    view.instances[instance] = replace(view.instances[instance], **fields)  # type: ignore


def arrive(scheduler: GlobalScheduler, view: ClusterView, input_tokens: int) -> list:
    return scheduler.handle(Arrival(Request(1, 0.0, input_tokens, 10)), view)


# ---- layout and sliders ----

def test_layout_sets_chunk_sizes_and_the_scheduler_applies_them_first():
    scheduler, _ = cluster(2, 2, chunk_p_tokens=1024, chunk_d_tokens=256)
    assert scheduler.roles == [Role.MIXED] * 4
    assert scheduler.initial_actions() == [SetChunkSize(0, 1024), SetChunkSize(1, 1024),
                                           SetChunkSize(2, 256), SetChunkSize(3, 256)]


def test_equal_chunks_are_aggregation_and_zero_d_chunk_is_disaggregation():
    agg = TaiChiLayout.of(2, 2, TaiChiSettings(chunk_p_tokens=512, chunk_d_tokens=512))
    assert not agg.differentiated and agg.roles == (Role.MIXED,) * 4
    pd = TaiChiLayout.of(1, 3, TaiChiSettings(chunk_p_tokens=8192, chunk_d_tokens=0))
    assert pd.roles == (Role.PREFILL,) + (Role.DECODE,) * 3
    assert pd.chunk_sizes_tokens == (8192, 0, 0, 0)
    with pytest.raises(ValueError, match="chunk_d_tokens"):
        TaiChiSettings(chunk_p_tokens=256, chunk_d_tokens=512)
    with pytest.raises(ValueError, match="no_feasible"):
        TaiChiSettings(no_feasible="drop")


# ---- Algorithm 2 ----

def test_prefill_estimate_counts_chunks_and_the_decode_batch():
    idle = IDLE
    one_chunk = prefill_time_s(PERF, 512, idle, 512, 512 * 512)
    assert one_chunk == pytest.approx(PERF.prefill.time_s(512, 512 * 512))
    # with 256 decodes a 512-token chunk leaves 256 prefill tokens per step: 2 mixed steps
    busy = replace(idle, running_decodes=256, running_tokens=256 * 100)
    two_steps = prefill_time_s(PERF, 512, busy, 512, 512 * 512)
    step = PERF.batch_time_s(256, 256 * 100, 256, 0)
    assert two_steps == pytest.approx(2 * step + 512 * 512 * PERF.prefill.per_attn_unit_s)
    assert prefill_time_s(PERF, 128, busy, 10, 100) == float("inf")  # decodes fill the step


def test_short_prompt_goes_to_the_feasible_instance_with_fewest_queued_tokens():
    scheduler, view = cluster(2, 2, chunk_p_tokens=2048, chunk_d_tokens=256)
    set_load(view, 0, **queued(4000))
    set_load(view, 1, **queued(3000))
    set_load(view, 2, **queued(1500))  # D-heavy: slow chunks, but few queued tokens
    set_load(view, 3, **queued(2500))
    [dispatch] = arrive(scheduler, view, 200)
    assert dispatch == DispatchPrefill(dispatch.request, 2)


def test_long_prompt_skips_infeasible_d_heavy_for_a_p_heavy_instance():
    slo = SLO(0.3, 0.05)
    scheduler, view = cluster(2, 2, slo=slo, chunk_p_tokens=2048, chunk_d_tokens=128)
    router = scheduler.policy.prefill_router
    set_load(view, 0, **queued(9000))
    set_load(view, 1, **queued(2000))
    set_load(view, 2, **queued(100, decodes=64))
    set_load(view, 3, **queued(200, decodes=64))
    request = Request(1, 0.0, 3000, 10)
    board = scheduler.board
    estimates = [router.estimate_s(request, i, view, board) for i in range(4)]
    # D-heavy: 3000 tokens at 64 per step take > 40 steps; P-heavy pays a transfer (T > 0)
    assert sum(estimates[2]) > slo.ttft_s and sum(estimates[3]) > slo.ttft_s
    assert estimates[0][2] > 0 and estimates[2][2] == 0
    assert sum(estimates[1]) < slo.ttft_s < sum(estimates[0])
    [dispatch] = scheduler.handle(Arrival(request), view)
    assert dispatch.instance_id == 1  # the only feasible one, though not the least queued


def test_transfer_time_decides_feasibility_of_p_heavy():
    scheduler, view = cluster(1, 1, slo=SLO(0.035, 0.05), chunk_p_tokens=4096,
                              chunk_d_tokens=64)
    router, board = scheduler.policy.prefill_router, scheduler.board
    set_load(view, 1, **queued(4000))  # D-heavy hopeless
    request = Request(1, 0.0, 1000, 10)
    queue_s, exec_s, transfer_s = router.estimate_s(request, 0, view, board)
    assert transfer_s == pytest.approx(PERF.transfer_time_s(1000))  # no topology: perf link
    assert queue_s == 0 and queue_s + exec_s < 0.035 < queue_s + exec_s + transfer_s
    # no instance is feasible: the default assigns at random among prefill candidates
    picks = {arrive(scheduler, view, 1000)[0].instance_id for _ in range(40)}
    assert picks == {0, 1}


def test_no_feasible_least_loaded_and_reject():
    scheduler, view = cluster(1, 1, slo=SLO(0.05, 0.05), chunk_p_tokens=4096,
                              chunk_d_tokens=64, no_feasible="least-loaded")
    set_load(view, 0, **queued(9000))
    set_load(view, 1, **queued(3000))
    [dispatch] = arrive(scheduler, view, 2000)
    assert dispatch.instance_id == 1  # the least predicted queue (min-load)
    scheduler, view = cluster(1, 1, slo=SLO(0.05, 0.05), chunk_p_tokens=4096,
                              chunk_d_tokens=64, no_feasible="reject")
    [reject] = arrive(scheduler, view, 2000)
    assert isinstance(reject, Reject) and reject.overloaded
    assert "TTFT SLO of 0.05s" in reject.reason and "taichi alg2" in reject.reason


# ---- Algorithm 1 ----

def decode_on(scheduler: GlobalScheduler, view: ClusterView, request_id: int, prefill_on: int,
              generated: int, first_s: float = 0.0, last_s: float = 1.0,
              input_tokens: int = 1000) -> tuple[Request, list]:
    request = Request(request_id, 0.0, input_tokens, 10_000)
    request.first_token_s = first_s
    actions = scheduler.handle(PrefillDone(request, prefill_on), view)
    [dispatch] = actions
    request.decode_instance = dispatch.target_id
    request.generated_tokens = generated
    request.last_token_s = last_s
    return request, actions


def test_decode_starts_in_place_on_d_heavy_and_on_least_kv_d_heavy_after_p_heavy():
    scheduler, view = cluster(2, 2)
    _, [in_place] = decode_on(scheduler, view, 1, prefill_on=3, generated=1)
    assert in_place == DispatchDecode(in_place.request, 3, 3)
    set_load(view, 2, running_tokens=9000)
    set_load(view, 3, running_tokens=4000, decode_queue_tokens=1000)
    _, [moved] = decode_on(scheduler, view, 2, prefill_on=0, generated=1)
    assert moved == DispatchDecode(moved.request, 0, 3)


def test_watermark_degrades_the_longest_outputs_until_below_m():
    scheduler, view = cluster(2, 2, watermark=0.95)
    requests = {}
    for rid, generated in ((1, 50), (2, 900), (3, 10), (4, 400)):
        requests[rid], _ = decode_on(scheduler, view, rid, prefill_on=2, generated=generated,
                                     input_tokens=1600)
    # instance 2 holds 980 of 1000 blocks; releasing the longest (2: 2500 tokens = 157
    # blocks) brings it to 823 <= 950, so exactly one decode leaves
    set_load(view, 2, used_blocks=980, running_decodes=4)
    set_load(view, 1, running_tokens=5000)  # P-heavy 0 is the less loaded target
    actions = scheduler.handle(Tick(), view)
    assert [(a.request.request_id, a.source_id, a.target_id) for a in actions] == [(2, 2, 0)]
    assert "degrade" in actions[0].reason and "M 95%" in actions[0].reason
    # more pressure: the two longest go, spread over both P-heavy instances
    scheduler, view = cluster(2, 2, watermark=0.6)
    for rid, generated in ((1, 50), (2, 900), (3, 10), (4, 400)):
        decode_on(scheduler, view, rid, prefill_on=2, generated=generated, input_tokens=1600)
    set_load(view, 2, used_blocks=800, running_decodes=4)
    actions = scheduler.handle(Tick(), view)
    assert [(a.request.request_id, a.target_id) for a in actions] == [(2, 0), (4, 1)]
    assert all(isinstance(a, Migrate) for a in actions)


def test_backflow_at_alpha_times_slo_and_counters_reset():
    slo = SLO(1.0, 0.050)
    scheduler, view = cluster(2, 2, slo=slo, alpha=0.96)
    context = scheduler.policy.rebalancer.context
    # two decodes sit on P-heavy 0 (degraded earlier): 101 tokens in 4.9 s vs 4.7 s
    slow, _ = decode_on(scheduler, view, 1, prefill_on=2, generated=101, last_s=4.9)
    fast, _ = decode_on(scheduler, view, 2, prefill_on=2, generated=101, last_s=4.7)
    slow.decode_instance = fast.decode_instance = 0
    # 4.9 / 100 = 49 ms > 0.96 x 50 = 48 ms; 47 ms is not
    set_load(view, 3, running_tokens=100)
    [back] = scheduler.handle(Tick(), view)
    assert (back.request, back.source_id, back.target_id) == (slow, 0, 2)
    assert "backflow" in back.reason and "48.0 ms" in back.reason
    # the move lands and the request emits tokens there: its counters restart
    slow.decode_instance = 2
    assert scheduler.handle(Tick(), view) == []  # seen on the target
    slow.generated_tokens, slow.last_token_s = 105, 5.1
    assert scheduler.handle(Tick(), view) == []
    track = context.decodes[1]
    assert track.target == -1 and track.ref_tokens == 105 and track.ref_s == 5.1
    assert track.output_since_reset == 0
    slow.generated_tokens, slow.last_token_s = 115, 5.3  # 20 ms per token since the reset
    assert track.tpot_since_reset_s() == pytest.approx(0.02)


def test_no_flowing_in_aggregation_or_disaggregation_settings():
    for settings in (dict(chunk_p_tokens=512, chunk_d_tokens=512),
                     dict(chunk_p_tokens=8192, chunk_d_tokens=0)):
        scheduler, view = cluster(2, 2, watermark=0.0, **settings)
        prefill_on = 0 if settings["chunk_d_tokens"] == 0 else 2
        request, [dispatch] = decode_on(scheduler, view, 1, prefill_on=prefill_on,
                                        generated=500)
        for i in range(4):
            set_load(view, i, used_blocks=999)
        assert scheduler.handle(Tick(), view) == []


def test_a_full_batch_counts_against_the_watermark_and_feasibility():
    scheduler, view = cluster(1, 1, watermark=0.95, chunk_p_tokens=2048, chunk_d_tokens=512)
    for rid, generated in ((1, 30), (2, 300)):
        decode_on(scheduler, view, rid, prefill_on=1, generated=generated, input_tokens=100)
    # little KV in use, but 244 of 256 batch slots taken (> 0.95 x 256 = 243.2): the
    # longest output leaves, one is enough
    set_load(view, 1, used_blocks=100, running_decodes=244)
    [move] = scheduler.handle(Tick(), view)
    assert (move.request.request_id, move.target_id) == (2, 0)
    assert "batch 244/256" in move.reason
    # Alg. 2: no free slot on the D-heavy instance makes it infeasible despite no queue
    set_load(view, 1, running_decodes=256)
    set_load(view, 0, **queued(3000))
    router = scheduler.policy.prefill_router
    assert sum(router.estimate_s(Request(9, 0.0, 50, 5), 1, view, scheduler.board)) \
        == float("inf")
    [dispatch] = arrive(scheduler, view, 50)
    assert dispatch.instance_id == 0
