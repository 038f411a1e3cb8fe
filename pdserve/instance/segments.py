"""FlowKV's segment allocator for KV blocks, and bidirectional segment alignment (sec. 3.3).

Shared by the live engine (`pdserve.engine.allocator`) and the simulator (`pdserve.sim.blocks`),
which counts a transfer's copies from the same block ids; no torch here.

Free blocks are kept as segments (runs of consecutive block ids) ordered by length (the
paper's min-heap; here a sorted list, which finds the best fit by bisection instead of
popping every shorter segment, with the same answer: shortest fitting, lowest start).
Allocation keeps a sequence in as few runs as possible: it first extends the run the
sequence already ends with (if the next block is free), then takes the smallest free
segment that holds the whole request (best fit), and only when none does, the largest
segments one after another. Releasing a block run merges it with free neighbours.

Before a transfer, `align` pairs the sender's and receiver's block lists position by
position and cuts them into runs that are consecutive on both sides; each run is one copy.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Fragmentation:
    free_blocks: int
    free_segments: int
    largest_free_segment: int

    @property
    def external(self) -> float:
        """1 - largest free segment / free blocks: 0 when all free memory is one run."""
        return 1 - self.largest_free_segment / self.free_blocks if self.free_blocks else 0.0


class SegmentAllocator:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self._length_at: dict[int, int] = {0: num_blocks}  # free segment start -> length
        self._start_ending_at: dict[int, int] = {num_blocks: 0}  # end (exclusive) -> start
        self._by_length: list[tuple[int, int]] = [(num_blocks, 0)]  # sorted (length, start)
        self._in_use = bytearray(num_blocks)
        self._free_id_count = num_blocks

    @property
    def free_blocks(self) -> int:
        """Block ids not allocated (this pool's; a local scheduler's count is its
        `KVBudget`'s)."""
        return self._free_id_count

    # ---- segments ----
    def _add_segment(self, start: int, length: int) -> None:
        self._length_at[start] = length
        self._start_ending_at[start + length] = start
        insort(self._by_length, (length, start))

    def _remove_segment(self, start: int) -> int:
        length = self._length_at.pop(start)
        del self._start_ending_at[start + length]
        del self._by_length[bisect_left(self._by_length, (length, start))]
        return length

    def _take(self, start: int, count: int) -> list[int]:
        """Take `count` blocks from the front of the free segment at `start`."""
        length = self._remove_segment(start)
        if length > count:
            self._add_segment(start + count, length - count)
        self._in_use[start:start + count] = b"\x01" * count
        self._free_id_count -= count
        return list(range(start, start + count))

    def _best_fit(self, count: int) -> int | None:
        """Start of the shortest free segment holding `count` blocks (lowest start among
        equals), or None."""
        index = bisect_left(self._by_length, (count, -1))
        return self._by_length[index][1] if index < len(self._by_length) else None

    # ---- public ----
    def allocate(self, count: int, after: int | None = None) -> list[int]:
        """`count` free blocks, continuing the run that ends at block `after` if possible."""
        if count > self._free_id_count:
            raise MemoryError(f"need {count} KV blocks, {self._free_id_count} free")
        blocks: list[int] = []
        if after is not None and count and (after + 1) in self._length_at:
            blocks += self._take(after + 1, min(count, self._length_at[after + 1]))
        while len(blocks) < count:
            need = count - len(blocks)
            start = self._best_fit(need)
            if start is None:  # no single segment holds it: largest first
                start = self._by_length[-1][1]
            blocks += self._take(start, min(need, self._length_at[start]))
        return blocks

    def free(self, blocks: list[int]) -> None:
        for start, length in runs(blocks):
            if self._in_use.count(0, start, start + length):
                block = start + self._in_use.index(0, start, start + length)
                raise ValueError(f"block {block} is not allocated")
            self._in_use[start:start + length] = bytes(length)
            self._free_id_count += length
            if start in self._start_ending_at:  # merge with the free segment before
                before = self._start_ending_at[start]
                length += self._remove_segment(before)
                start = before
            if start + length in self._length_at:  # and with the one after
                length += self._remove_segment(start + length)
            self._add_segment(start, length)

    def is_free(self, block: int) -> bool:
        return not self._in_use[block]

    def fragmentation(self) -> Fragmentation:
        return Fragmentation(self._free_id_count, len(self._length_at),
                             self._by_length[-1][0] if self._by_length else 0)


def runs(blocks: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of a block list, in its order: [(start, length)]."""
    if not blocks:
        return []
    first, last = blocks[0], blocks[-1]
    if last - first == len(blocks) - 1 and (len(blocks) < 3 or blocks[1] == first + 1) \
            and blocks == list(range(first, last + 1)):
        return [(first, len(blocks))]  # the common case: one run
    if len(blocks) > 64:  # long and fragmented: find the breaks in C
        ids = np.asarray(blocks)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(ids) != 1) + 1))
        lengths = np.diff(np.append(starts, len(blocks)))
        return list(zip(ids[starts].tolist(), lengths.tolist(), strict=True))
    result: list[tuple[int, int]] = []
    start = previous = first
    for block in blocks[1:]:
        if block != previous + 1:
            result.append((start, previous - start + 1))
            start = block
        previous = block
    result.append((start, previous - start + 1))
    return result


def align(source: list[int], target: list[int]) -> list[tuple[int, int, int]]:
    """Bidirectional segment alignment: [(source_start, target_start, length)] covering the
    block lists position by position, each run consecutive on both sides (one copy each).
    Walks the two sides' runs together: a copy ends where either side's run ends."""
    if len(source) != len(target):
        raise ValueError(f"block lists differ in length: {len(source)} vs {len(target)}")
    result: list[tuple[int, int, int]] = []
    source_runs, target_runs = runs(source), runs(target)
    i = j = source_done = target_done = 0
    while i < len(source_runs):
        source_start, source_length = source_runs[i]
        target_start, target_length = target_runs[j]
        count = min(source_length - source_done, target_length - target_done)
        result.append((source_start + source_done, target_start + target_done, count))
        source_done += count
        target_done += count
        if source_done == source_length:
            i, source_done = i + 1, 0
        if target_done == target_length:
            j, target_done = j + 1, 0
    return result
