"""FlowKV's segment allocator and alignment: properties under random use (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pdserve.engine.allocator import SegmentAllocator, align, runs

operations = st.lists(st.tuples(st.booleans(), st.integers(1, 12), st.integers(0, 30)),
                      min_size=1, max_size=80)


@settings(max_examples=150, deadline=None)
@given(operations, st.integers(8, 96))
def test_no_block_is_owned_twice_and_frees_merge(ops, num_blocks):
    allocator = SegmentAllocator(num_blocks)
    owners: dict[int, list[int]] = {}  # sequence -> blocks
    for is_alloc, count, who in ops:
        if is_alloc:
            owned = owners.setdefault(who, [])
            after = owned[-1] if owned else None
            if count > allocator.free_blocks:
                with pytest.raises(MemoryError):
                    allocator.allocate(count, after=after)
                continue
            owned += allocator.allocate(count, after=after)
        elif who in owners:
            allocator.free(owners.pop(who))
        held = [b for blocks in owners.values() for b in blocks]
        assert len(held) == len(set(held))  # never owned twice
        assert allocator.free_blocks == num_blocks - len(held)
        assert all(not allocator.is_free(b) for b in held)
        frag = allocator.fragmentation()
        assert frag.free_blocks == allocator.free_blocks
        # free segments are maximal: no two are adjacent (frees merged)
        assert frag.free_segments == len(runs([b for b in range(num_blocks)
                                               if allocator.is_free(b)]))
    for blocks in owners.values():
        allocator.free(blocks)
    frag = allocator.fragmentation()
    assert (frag.free_segments, frag.largest_free_segment, frag.external) == (1, num_blocks, 0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 20), min_size=1, max_size=10))
def test_a_fresh_pool_gives_one_run_per_sequence(sizes):
    allocator = SegmentAllocator(sum(sizes))
    for size in sizes:
        assert len(runs(allocator.allocate(size))) == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=30), st.integers(0, 2 ** 16))
def test_a_growing_sequence_stays_in_one_run_while_the_next_block_is_free(steps, seed):
    allocator = SegmentAllocator(sum(steps) + 10)
    blocks: list[int] = []
    for count in steps:
        blocks += allocator.allocate(count, after=blocks[-1] if blocks else None)
    assert len(runs(blocks)) == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 500), min_size=1, max_size=60, unique=True),
       st.lists(st.integers(0, 500), min_size=1, max_size=60, unique=True))
def test_alignment_covers_both_lists_with_at_most_the_runs_of_either_side(source, target):
    size = min(len(source), len(target))
    source, target = source[:size], target[:size]
    alignment = align(source, target)
    # every pair is covered in order, each run consecutive on both sides
    covered = [(s + i, d + i) for s, d, n in alignment for i in range(n)]
    assert covered == list(zip(source, target, strict=True))
    # one copy per aligned run: never more than the runs of the two lists combined, never
    # fewer than either side's runs
    assert max(len(runs(source)), len(runs(target))) <= len(alignment)
    assert len(alignment) <= len(runs(source)) + len(runs(target)) - 1


def test_alignment_of_two_contiguous_lists_is_one_copy():
    assert align(list(range(10, 30)), list(range(100, 120))) == [(10, 100, 20)]
    assert len(align([1, 2, 3, 7, 8], [4, 5, 6, 7, 9])) == 3


def test_best_fit_picks_the_smallest_segment_that_holds_the_request():
    allocator = SegmentAllocator(30)
    first, gap5, middle, gap3, rest = (allocator.allocate(n) for n in (2, 5, 2, 3, 18))
    allocator.free(gap5)
    allocator.free(gap3)
    assert allocator.allocate(3) == gap3  # 3 fits exactly in the 3-gap, not the 5-gap
    assert allocator.allocate(4) == gap5[:4]
    with pytest.raises(ValueError, match="not allocated"):
        allocator.free(gap3)
        allocator.free(gap3)
    assert first and middle and rest
