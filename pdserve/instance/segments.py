"""FlowKV's segment allocator for KV blocks, and bidirectional segment alignment (sec. 3.3).

Shared by the live engine (`pdserve.engine.allocator`) and the simulator (`pdserve.sim.blocks`),
which counts a transfer's copies from the same block ids; no torch here.

Free blocks are kept as segments (runs of consecutive block ids) in a min-heap by length.
Allocation keeps a sequence in as few runs as possible: it first extends the run the
sequence already ends with (if the next block is free), then takes the smallest free
segment that holds the whole request (best fit), and only when none does, the largest
segments one after another. Releasing a block run merges it with free neighbours.

Before a transfer, `align` pairs the sender's and receiver's block lists position by
position and cuts them into runs that are consecutive on both sides; each run is one copy.
Deviation: the heap uses lazy deletion (stale entries are skipped when popped) rather than
decrease-key, which a binary heap does not offer.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


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
        self._heap: list[tuple[int, int]] = [(num_blocks, 0)]
        self._in_use = bytearray(num_blocks)
        self.free_blocks = num_blocks

    # ---- segments ----
    def _add_segment(self, start: int, length: int) -> None:
        self._length_at[start] = length
        self._start_ending_at[start + length] = start
        heapq.heappush(self._heap, (length, start))

    def _remove_segment(self, start: int) -> int:
        length = self._length_at.pop(start)
        del self._start_ending_at[start + length]
        return length

    def _take(self, start: int, count: int) -> list[int]:
        """Take `count` blocks from the front of the free segment at `start`."""
        length = self._remove_segment(start)
        if length > count:
            self._add_segment(start + count, length - count)
        for block in range(start, start + count):
            self._in_use[block] = 1
        self.free_blocks -= count
        return list(range(start, start + count))

    def _best_fit(self, count: int) -> int | None:
        popped, found = [], None
        while self._heap:
            length, start = heapq.heappop(self._heap)
            if self._length_at.get(start) != length:
                continue  # stale
            popped.append((length, start))
            if length >= count:
                found = start
                break
        for entry in popped:
            heapq.heappush(self._heap, entry)
        return found

    # ---- public ----
    def allocate(self, count: int, after: int | None = None) -> list[int]:
        """`count` free blocks, continuing the run that ends at block `after` if possible."""
        if count > self.free_blocks:
            raise MemoryError(f"need {count} KV blocks, {self.free_blocks} free")
        blocks: list[int] = []
        if after is not None and count and (after + 1) in self._length_at:
            blocks += self._take(after + 1, min(count, self._length_at[after + 1]))
        while len(blocks) < count:
            need = count - len(blocks)
            start = self._best_fit(need)
            if start is None:  # no single segment holds it: largest first
                start = max(self._length_at, key=self._length_at.__getitem__)
            blocks += self._take(start, min(need, self._length_at[start]))
        return blocks

    def free(self, blocks: list[int]) -> None:
        for start, length in runs(sorted(blocks)):
            for block in range(start, start + length):
                if not self._in_use[block]:
                    raise ValueError(f"block {block} is not allocated")
                self._in_use[block] = 0
            self.free_blocks += length
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
        return Fragmentation(self.free_blocks, len(self._length_at),
                             max(self._length_at.values(), default=0))


def runs(blocks: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of a block list, in its order: [(start, length)]."""
    result: list[tuple[int, int]] = []
    for block in blocks:
        if result and result[-1][0] + result[-1][1] == block:
            result[-1] = (result[-1][0], result[-1][1] + 1)
        else:
            result.append((block, 1))
    return result


def align(source: list[int], target: list[int]) -> list[tuple[int, int, int]]:
    """Bidirectional segment alignment: [(source_start, target_start, length)] covering the
    block lists position by position, each run consecutive on both sides (one copy each)."""
    if len(source) != len(target):
        raise ValueError(f"block lists differ in length: {len(source)} vs {len(target)}")
    result: list[tuple[int, int, int]] = []
    for src, dst in zip(source, target, strict=True):
        if result:
            s0, d0, n = result[-1]
            if s0 + n == src and d0 + n == dst:
                result[-1] = (s0, d0, n + 1)
                continue
        result.append((src, dst, 1))
    return result
