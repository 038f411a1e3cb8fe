"""An instance's KV memory budget, counted in blocks of `KV_BLOCK_TOKENS` tokens.

`KVBudget` owns the total and the free block count of one local scheduler and is the only
code that changes the free count (`tests/test_instance_layout.py` checks that): whatever
takes or frees blocks asks it. The local scheduler owns one and wires its reclaim hook: the
instance's idle session history (AMPD), evicted only when a request would not fit otherwise.
Prefix-cache entries no request uses count as free (`instance/prefix_cache.py`).

Block ids are not tracked here: an owner of real ids (the engine, the simulator's block
table) follows the counts with its own `SegmentAllocator`.
"""

from __future__ import annotations

from collections.abc import Callable

# blocks short, session whose history to keep (-1: none) -> blocks freed
Reclaim = Callable[[int, int], int]


def _reclaim_nothing(blocks_short: int, keep_session: int) -> int:
    return 0


class KVBudget:
    __slots__ = ("total_blocks", "_free_blocks", "_reclaim")

    def __init__(self, total_blocks: int, reclaim: Reclaim = _reclaim_nothing) -> None:
        if total_blocks <= 0:
            raise ValueError(f"total_blocks must be positive, got {total_blocks}")
        self.total_blocks = total_blocks
        self._free_blocks = total_blocks
        self._reclaim = reclaim

    @property
    def free_blocks(self) -> int:
        return self._free_blocks

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self._free_blocks

    def try_take(self, blocks: int, keep_session: int = -1) -> bool:
        """Take `blocks` if they are free, reclaiming (never `keep_session`'s history) what is
        short first; False, taking nothing, when even that is not enough."""
        free = self._free_blocks
        if blocks > free:
            free += self._reclaim(blocks - free, keep_session)
            self._free_blocks = free
            if blocks > free:
                return False
        self._free_blocks = free - blocks
        return True

    def take_if_free(self, blocks: int) -> bool:
        """Take `blocks` if that many are free now, reclaiming nothing; False, taking
        nothing, otherwise (`free_blocks` and `take` in one call: a decode span's plan)."""
        free = self._free_blocks
        if blocks > free:
            return False
        self._free_blocks = free - blocks
        return True

    def take(self, blocks: int) -> None:
        """Take blocks the caller has seen to be free (`free_blocks`)."""
        self._free_blocks -= blocks

    def give(self, blocks: int) -> None:
        """Blocks freed (a request's KV, evicted history, the unused part of a reservation)."""
        self._free_blocks += blocks
