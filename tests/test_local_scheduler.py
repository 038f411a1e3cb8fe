"""The shared local scheduler: chunking, decode-first order, memory accounting, preemption."""

from __future__ import annotations

import pytest
from conftest import local_scheduler
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.cluster.actions import SetChunkSize
from pdserve.instance.kv_budget import KVBudget
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.phase_priority import PhasePriority
from pdserve.types import Request, attn_units, blocks_for


def req(request_id: int, input_tokens: int, output_tokens: int) -> Request:
    return Request(request_id, 0.0, input_tokens, output_tokens)


def run_to_completion(local: LocalScheduler, max_steps: int = 1, limit: int = 10_000) -> list:
    finished = []
    for _ in range(limit):
        plan = local.plan(max_steps)
        if plan is None:
            return finished
        result = local.complete(plan)
        finished += result.finished
        for request in result.prefilled:  # colocated: decode in place
            local.continue_in_place(request)
    raise AssertionError("did not finish")


def test_long_prompt_is_chunked_under_the_token_budget():
    local = local_scheduler(0, total_blocks=10_000, chunk_size_tokens=2048)
    local.enqueue_prefill(req(1, 5000, 4))
    sizes = []
    while True:
        plan = local.plan()
        sizes.append([tokens for _, tokens in plan.chunks])
        result = local.complete(plan)
        if result.prefilled:
            break
    assert sizes == [[2048], [2048], [904]]
    assert result.prefilled[0].generated_tokens == 1  # the last chunk samples the first token


def test_chunk_attention_units_add_up_to_one_shot_prefill():
    local = local_scheduler(0, total_blocks=10_000, chunk_size_tokens=700)
    local.enqueue_prefill(req(1, 2000, 2))
    assert local.prefill_queue_attn_units == attn_units(2000, 0)
    total_units = 0
    while len(local.prefills):
        plan = local.plan()
        total_units += plan.prefill_attn_units
        local.complete(plan)
    assert total_units == attn_units(2000, 0)
    assert local.prefill_queue_tokens == 0 and local.prefill_queue_attn_units == 0


def test_decodes_go_first_and_shrink_the_prefill_budget():
    local = local_scheduler(0, total_blocks=10_000, chunk_size_tokens=100)
    for i in range(3):
        local.enqueue_prefill(req(i, 10, 50))
    result = local.complete(local.plan())
    for request in result.prefilled:
        local.continue_in_place(request)
    local.enqueue_prefill(req(9, 500, 5))
    plan = local.plan()
    assert [r.request_id for r in plan.decodes] == [0, 1, 2]
    assert plan.chunks[0][1] == 100 - 3  # budget left after one token per decode


def test_prefills_wait_in_fcfs_order():
    local = local_scheduler(0, total_blocks=10_000, chunk_size_tokens=64)
    for i in range(4):
        local.enqueue_prefill(req(i, 40, 2))
    order = []
    while len(local.prefills):
        plan = local.plan()
        order += [r.request_id for r, _ in plan.chunks if r.request_id not in order]
        result = local.complete(plan)
        for request in result.prefilled:
            local.release_handoff(request)
    assert order == [0, 1, 2, 3]


def test_memory_is_counted_in_blocks_and_freed_on_finish():
    local = local_scheduler(0, total_blocks=100, chunk_size_tokens=4096)
    local.enqueue_prefill(req(1, 33, 3))  # 33 tokens -> 3 blocks
    plan = local.plan()
    assert local.used_blocks == blocks_for(33) == 3
    result = local.complete(plan)
    local.continue_in_place(result.prefilled[0])
    plan = local.plan()  # decode step writes token 34 -> still 3 blocks
    assert local.used_blocks == 3
    local.complete(plan)
    plan = local.plan()
    assert local.used_blocks == 3
    result = local.complete(plan)
    assert [r.request_id for r in result.finished] == [1]
    assert local.used_blocks == 0


def test_decode_that_cannot_grow_preempts_the_newest_and_recomputes_it():
    # two sequences of 32 tokens fill 4 of 5 blocks; growing both needs 6 blocks
    local = local_scheduler(0, total_blocks=5, chunk_size_tokens=4096)
    old, new = req(1, 31, 20), req(2, 31, 20)
    local.enqueue_prefill(old)
    local.enqueue_prefill(new)
    result = local.complete(local.plan())
    for request in result.prefilled:
        local.continue_in_place(request)
    plan = local.plan()  # both at 32 tokens: fits
    local.complete(plan)
    plan = local.plan()  # both need a third block: only one is free
    assert [r.request_id for r in plan.decodes] == [1]
    assert new.preemptions == 1 and local.preemptions_total == 1
    assert local.prefills.waiting[0] is new
    assert new.prefill_target_tokens == 31 + new.generated_tokens  # recompute what it had
    finished = run_to_completion(local)
    assert sorted(r.request_id for r in finished) == [1, 2]
    assert old.generated_tokens == 20 and new.generated_tokens == 20
    assert local.used_blocks == 0


def test_transfers_wait_for_memory_in_fcfs_order():
    local = local_scheduler(0, total_blocks=10, chunk_size_tokens=4096)
    first, second = req(1, 100, 5), req(2, 60, 5)
    for request in (first, second):
        request.generated_tokens = 1  # prefilled elsewhere
        local.enqueue_transfer_in(request)
    assert [r.request_id for r in local.admit_transfers()] == [1]  # 7 blocks; 4 more won't fit
    assert local.decode_queue_len == 2
    assert local.decode_queue_tokens == 101 + 61
    local.transfer_done(first)
    plan = local.plan()
    assert [r.request_id for r in plan.decodes] == [1]
    assert local.decode_queue_tokens == 61


def test_bad_construction_names_the_field():
    with pytest.raises(ValueError, match="chunk_size_tokens"):
        local_scheduler(0, total_blocks=10, chunk_size_tokens=0)
    with pytest.raises(ValueError, match="total_blocks"):
        local_scheduler(0, total_blocks=0, chunk_size_tokens=10)


def check_counters(local: LocalScheduler, held_blocks: int) -> None:
    """Every incremental counter equals its value recomputed from the queues."""
    pending = [*local.prefills.waiting, *local.prefills.active.values()]
    assert local.prefill_queue_tokens == sum(r.prefill_target_tokens - r.prefilled_tokens
                                             for r in pending)
    assert local.prefill_queue_attn_units == sum(
        attn_units(r.prefill_target_tokens - r.prefilled_tokens, r.prefilled_tokens)
        for r in pending)
    assert local.running_tokens == sum(r.sequence_tokens for r in local.running.values())
    incoming = [*local.transfer_queue, *local.transferring.values(), *local.ready]
    assert local.decode_queue_tokens == sum(r.sequence_tokens for r in incoming)
    owned = sum(r.kv_blocks for r in [*local.prefills.active.values(), *local.running.values(),
                                       *local.transferring.values(), *local.ready])
    assert local.used_blocks == owned + held_blocks
    assert 0 <= local.free_blocks <= local.total_blocks


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40), st.booleans()),
                min_size=1, max_size=25),
       st.integers(40, 200), st.integers(16, 512), st.integers(1, 64))
def test_counters_stay_consistent_under_any_load(requests, total_blocks, chunk, max_steps):
    """Random prompts, some arriving as KV transfers, a small memory: counters never drift,
    nothing is lost, and every request ends with exactly its output length."""
    local = local_scheduler(0, total_blocks=total_blocks, chunk_size_tokens=chunk)
    all_requests = []
    for i, (n_in, n_out, transferred) in enumerate(requests):
        if blocks_for(n_in + n_out) > total_blocks // 2:
            continue  # the global scheduler rejects what can never fit
        request = req(i, n_in, n_out)
        all_requests.append(request)
        if transferred and n_out > 1:
            request.generated_tokens = 1
            local.enqueue_transfer_in(request)
        else:
            local.enqueue_prefill(request)
    finished = []
    for _ in range(20_000):
        for request in local.admit_transfers():
            local.transfer_done(request)
        check_counters(local, 0)
        plan = local.plan(max_steps)
        if plan is None:
            if not local.transfer_queue:
                break
            continue
        if plan.steps > 1:
            local.shrink_span(plan, max(1, plan.steps // 2))
            check_counters(local, 0)
        result = local.complete(plan)
        finished += result.finished
        for request in result.prefilled:
            local.continue_in_place(request)
    assert sorted(r.request_id for r in finished) == sorted(r.request_id for r in all_requests)
    assert all(r.generated_tokens == r.output_tokens for r in finished)
    assert local.used_blocks == 0


def test_abort_frees_a_request_wherever_it_is():
    """Cancelled clients: waiting, mid-prefill, held for hand-off, queued or ready transfers,
    and running decodes all leave with their blocks and load."""
    local = local_scheduler(0, total_blocks=200, chunk_size_tokens=64)
    waiting, partial, held = req(1, 500, 5), req(2, 100, 5), req(3, 30, 5)
    for request in (held, partial, waiting):
        local.enqueue_prefill(request)
    plan = local.plan()  # held (30) completes; partial gets 34 of 100 tokens
    result = local.complete(plan)
    assert result.prefilled == [held] and partial.request_id in local.prefills.active
    decoding = req(4, 40, 50)
    decoding.generated_tokens = 1
    local.enqueue_transfer_in(decoding)
    queued = req(5, 40, 50)
    queued.generated_tokens = 1
    local.enqueue_transfer_in(queued)
    for request in local.admit_transfers():
        local.transfer_done(request)
    local.plan()  # both transfers join the running decodes
    running_plan_requests = list(local.running.values())
    assert decoding in running_plan_requests
    for request in (waiting, partial, held, decoding, queued):
        local.abort(request)
        check_counters(local, sum(blocks for _, blocks in local.held.values()))
    assert local.used_blocks == 0 and len(local.prefills) == 0
    assert not local.running and not local.held and local.decode_queue_len == 0


def test_kv_budget_reclaims_only_what_is_short_and_takes_nothing_when_still_short():
    asked = []

    def reclaim(blocks_short: int, keep_session: int) -> int:
        asked.append((blocks_short, keep_session))
        return 3

    budget = KVBudget(10, reclaim)
    assert budget.try_take(8) and budget.free_blocks == 2 and not asked
    assert budget.try_take(4, keep_session=7) and asked == [(2, 7)]  # 2 + 3 reclaimed
    assert budget.free_blocks == 1 and budget.used_blocks == 9
    assert not budget.try_take(5) and asked[-1] == (4, -1)
    assert budget.free_blocks == 4  # what was reclaimed stays free, nothing is taken
    budget.give(6)
    assert budget.free_blocks == 10 and budget.used_blocks == 0


def test_chunk_size_and_priority_change_only_through_the_scheduler_and_are_checked():
    local = local_scheduler(0, 1000, chunk_size_tokens=256)
    for i in range(2):
        local.enqueue_prefill(Request(i, 0.0, 600, 10))
    assert local.plan().prefill_tokens == 256
    local.set_chunk_size(512)
    with pytest.raises(ValueError, match="positive"):
        local.set_chunk_size(0)
    assert local.chunk_size_tokens == 512  # the bad value left it as it was
    assert local.plan().prefill_tokens == 512
    local.set_phase_priority(PhasePriority.PREFILL_FIRST)
    assert local.phase_priority is PhasePriority.PREFILL_FIRST
    with pytest.raises(ValueError, match="positive"):
        SetChunkSize(0, 0)
