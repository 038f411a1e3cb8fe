"""Transfer-call accounting in the simulator: FlowKV-aligned runs vs per-block-per-layer."""

from __future__ import annotations

import pytest
from conftest import make_perf, policy_setup, sim_settings

from pdserve.instance.local_scheduler import BatchPlan
from pdserve.instance.segments import SegmentAllocator
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicyConfig
from pdserve.sim.blocks import BlockTable
from pdserve.sim.simulator import SimResult, Simulator
from pdserve.types import SLO, Request, blocks_for
from pdserve.workload.synthetic import synthetic_workload


def run(requests: list[Request], span: int, **settings) -> SimResult:
    perf = make_perf(kv_capacity_tokens=12_000)
    policy, count = build_policy(policy_setup(perf, SLO(2.0, 0.15), PolicyConfig("static-pd"),
                                              prefill=2, decode=2, chunk_size_tokens=512))
    return Simulator(policy, count, perf, sim_settings(
        chunk_size_tokens=512, max_span_steps=span, **settings)).run(requests)


def test_a_lone_transfer_is_one_aligned_call_and_layerwise_pays_blocks_x_layers_x_2():
    request = [Request(0, 0.0, 1000, 10)]
    aligned = run([Request(0, 0.0, 1000, 10)], 1 << 20)
    layerwise = run(request, 1 << 20, transfer_mode="per-block-per-layer", kv_layers=32)
    blocks = blocks_for(1000)
    assert aligned.transfer_calls == {0: 1}
    assert layerwise.transfer_calls == {0: blocks * 32 * 2}
    perf = make_perf()
    extra_s = (blocks * 64 - 1) * perf.transfer.per_call_s
    assert layerwise.requests[0].transfer_s - aligned.requests[0].transfer_s == \
        pytest.approx(extra_s, rel=1e-9)


def test_fragmented_memory_costs_more_calls_and_fast_advance_sees_the_same_ids():
    workload = synthetic_workload(300, rate_rps=12.0, lengths="uniform:20-2500:1-400",
                                  arrival="gamma", cv=2.0, seed=7)
    step = run(workload.requests(), 1)
    fast = run(workload.requests(), 1 << 20)
    assert step.transfer_calls == fast.transfer_calls
    calls = list(step.transfer_calls.values())
    assert max(calls) > 1  # churn fragments the pools: some transfers need several runs
    assert sum(calls) < sum(blocks_for(r.input_tokens) for r in step.requests
                            if r.request_id in step.transfer_calls)  # far fewer than blocks


def test_span_growth_allocates_in_step_by_step_order():
    def fresh() -> tuple[BlockTable, list[Request]]:
        table = BlockTable(64)
        decodes = [Request(i, 0.0, 15 + 7 * i, 100, generated_tokens=1) for i in range(3)]
        for request in decodes:
            request.kv_blocks = blocks_for(request.sequence_tokens)
            table.resize(request.request_id, request.kv_blocks)
        return table, decodes

    stepwise, decodes = fresh()
    for _ in range(40):
        for request in decodes:
            request.kv_blocks = blocks_for(request.sequence_tokens)
        stepwise.start(BatchPlan(decodes, []))
        for request in decodes:
            request.generated_tokens += 1
    spanned, decodes = fresh()
    for request in decodes:
        request.kv_blocks = blocks_for(request.sequence_tokens + 39)
    spanned.start(BatchPlan(decodes, [], steps=40))
    spanned.flush()  # a span allocates lazily, when the table is next touched
    assert spanned.blocks == stepwise.blocks
    assert any(len(runs) > 1 for runs in [_runs(b) for b in spanned.blocks.values()])


def _runs(blocks: list[int]) -> list[tuple[int, int]]:
    from pdserve.instance.segments import runs
    return runs(blocks)


def test_engine_and_simulator_share_one_allocator():
    from pdserve.engine import allocator
    assert allocator.SegmentAllocator is SegmentAllocator
