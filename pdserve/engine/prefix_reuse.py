"""The engine following the local scheduler's prefix cache (a mixin of `Engine`): the
scheduler's `PrefixCache` decides what is cached and evicted; the engine keeps the block ids
of each entry (`CachedBlockIds`), frees evicted entries' blocks, takes donated blocks from a
sequence, and starts a prefill with a hit on the cached blocks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdserve.engine.kv_pool import PagedKVPool
from pdserve.instance.local_scheduler import BatchPlan
from pdserve.instance.prefix_cache import CachedBlockIds
from pdserve.instance.segments import SegmentAllocator
from pdserve.types import Request

if TYPE_CHECKING:
    from pdserve.engine.engine import Sequence


class EnginePrefixReuse:
    # the engine's
    sequences: dict[int, Sequence]
    pool: PagedKVPool
    allocator: SegmentAllocator
    prefix_ids: CachedBlockIds | None
    prefix_hit_tokens_total: int

    def enable_prefix_cache(self, block_tokens: int) -> None:
        self.prefix_ids = CachedBlockIds(block_tokens // self.pool.block_size)

    def follow_prefix_cache(self, evicted: list[int], donated: list[tuple[int, int, int]]
                            ) -> None:
        """Apply the cache's events: evicted entries free their blocks; donated ones take
        the (request id, hash index, hash) block of that sequence."""
        assert self.prefix_ids is not None
        for blocks in self.prefix_ids.evict(evicted):
            self.allocator.free(blocks)
        for request_id, index, block_hash in donated:
            sequence = self.sequences[request_id]
            self.prefix_ids.donate(block_hash, sequence.blocks, index)
            sequence.shared_blocks = (index + 1) * self.prefix_ids.per_entry

    def attach_prefix_hits(self, plan: BatchPlan) -> None:
        """Prefills the local scheduler admitted with prefix hits start on the cached
        blocks, computed up to the hit (idempotent)."""
        for request, _ in plan.chunks:
            if request.cached_blocks:
                self._reuse_prefix(request)

    def _reuse_prefix(self, request: Request) -> None:
        sequence = self.sequences[request.request_id]
        if self.prefix_ids is None or sequence.blocks or sequence.computed_tokens:
            return
        sequence.blocks = self.prefix_ids.hit(request.hash_ids[:request.cached_blocks])
        sequence.shared_blocks = len(sequence.blocks)
        sequence.computed_tokens = sequence.shared_blocks * self.pool.block_size
        self.prefix_hit_tokens_total += sequence.computed_tokens
