"""Block ids of a simulated instance, allocated as the live engine allocates them, so a KV
transfer's copy count is what FlowKV's alignment gives (FlowKV sec. 3.3, appendix A).

The local scheduler only counts blocks (`Request.kv_blocks`); this table follows those
counts with real ids from the engine's `SegmentAllocator` at the points where the engine
allocates and frees: a batch's sequences grow when it starts (preempted ones drop their KV
first), a cut span gives back its later steps' blocks, finished sequences free theirs, an
incoming transfer allocates its blocks when admitted, and the sender frees its copy when the
transfer lands. With a prefix cache (`pdserve.instance.prefix_cache`) the table follows its
events: a hit starts a request's list with its entries' ids, a donation hands ids to the
cache, an eviction frees them, and a request frees only the ids it owns. Inside a multi-step
span the decodes grow in the order a step-by-step run
grows them (by step, then batch order), so both modes see the same ids; a span's blocks
are allocated only when something else touches the table (nothing else allocates during a
span), for the steps that ran.

Transfer pricing (`transfer_calls`):
  aligned              one call per run that is consecutive on both sides after FlowKV's
                       bidirectional alignment (`segments.align`)
  per-block-per-layer  one call per block, per layer, for K and V apiece (the layer-wise
                       layout FlowKV starts from: 2 x layers calls per block)
  fixed                the configured number of calls, whatever the layout (the old model)
"""

from __future__ import annotations

from collections.abc import Iterable

from pdserve.instance.local_scheduler import BatchPlan
from pdserve.instance.prefix_cache import CachedBlockIds, PrefixCache
from pdserve.instance.segments import SegmentAllocator, align
from pdserve.types import KV_BLOCK_TOKENS, Request

TRANSFER_MODES = ("aligned", "per-block-per-layer", "fixed")


class BlockTable:
    def __init__(self, total_blocks: int, cache: PrefixCache | None = None) -> None:
        self.allocator = SegmentAllocator(total_blocks)
        self.blocks: dict[int, list[int]] = {}  # request id -> its block ids, in order
        self.cache = cache
        self.cached_ids = CachedBlockIds(cache.kv_blocks_per_entry if cache is not None else 1)
        self.shared: dict[int, int] = {}  # request id -> leading ids the cache owns
        # a span's growth, allocated when anything else touches the table (nothing else
        # allocates during a span, so the ids are the same, and a cut span allocates only
        # the steps it ran): (request, its tokens at the span's start, blocks at its end)
        self._span: list[tuple[Request, int, int]] = []

    def flush(self) -> None:
        if self._span:
            span, self._span = self._span, []
            self._grow_span(span)

    def sync_cache(self) -> None:
        """Follow the prefix cache: evicted entries free their ids, donated blocks become
        the cache's."""
        self.flush()
        if self.cache is None:
            return
        evicted, donated = self.cache.take_events()
        for blocks in self.cached_ids.evict(evicted):
            self.allocator.free(blocks)
        per_entry = self.cached_ids.per_entry
        for request_id, index, block_hash in donated:
            self.cached_ids.donate(block_hash, self.blocks[request_id], index)
            self.shared[request_id] = (index + 1) * per_entry

    def resize(self, request_id: int, count: int) -> None:
        """Grow (continuing the last run where possible) or cut a request's blocks."""
        self.flush()
        blocks = self.blocks.setdefault(request_id, [])
        need = count - len(blocks)
        if need > 0:
            blocks += self.allocator.allocate(need, after=blocks[-1] if blocks else None)
        elif need < 0:
            self.allocator.free(blocks[count:])
            del blocks[count:]

    def free(self, request_id: int) -> None:
        """The request's own ids go back; those the cache owns stay with their entry."""
        self.flush()
        blocks = self.blocks.pop(request_id, None)
        shared = self.shared.pop(request_id, 0)
        if blocks and len(blocks) > shared:
            self.allocator.free(blocks[shared:])

    def done(self, finished: Iterable[Request]) -> None:
        """A batch ended: take the cache's events, free the finished requests' ids."""
        self.sync_cache()
        for request in finished:
            self.free(request.request_id)

    # ---- following the local scheduler ----
    def start(self, plan: BatchPlan) -> None:
        """A batch starts: preempted sequences lose their KV, the others grow to their
        planned counts (a span's, lazily)."""
        self.sync_cache()
        for request in plan.preempted:
            self.free(request.request_id)
        if self.cache is not None:
            for request, _ in plan.chunks:
                if request.cached_blocks and request.request_id not in self.blocks:
                    self.blocks[request.request_id] = self.cached_ids.hit(
                        request.hash_ids[:request.cached_blocks])
                    self.shared[request.request_id] = len(self.blocks[request.request_id])
        if plan.steps > 1:
            self._span = [(r, r.sequence_tokens, r.kv_blocks) for r in plan.decodes]
        else:
            for request in plan.decodes:
                self.resize(request.request_id, request.kv_blocks)
        for request, _ in plan.chunks:
            self.resize(request.request_id, request.kv_blocks)

    def _grow_span(self, span: list[tuple[Request, int, int]]) -> None:
        """Allocate a span's blocks in step-by-step order: a decode of S tokens (S - 1
        computed) needs its (k+1)-th block at the step where its length passes k blocks."""
        events: list[tuple[int, int, int]] = []  # (step, batch position, request id)
        for position, (request, start_tokens, target) in enumerate(span):
            held = len(self.blocks.get(request.request_id, ()))
            for block in range(held, target):
                step = max(1, block * KV_BLOCK_TOKENS - start_tokens + 2)
                events.append((step, position, request.request_id))
        events.sort()
        allocator = self.allocator
        for _, _, request_id in events:
            blocks = self.blocks.setdefault(request_id, [])
            blocks += allocator.allocate(1, after=blocks[-1] if blocks else None)

    def shrink(self, plan: BatchPlan) -> None:
        """A span was cut: only the steps that run get blocks."""
        if self._span:
            self._span = [(r, tokens, r.kv_blocks) for r, tokens, _ in self._span]
            return
        for request in plan.decodes:
            self.resize(request.request_id, request.kv_blocks)

    def transfer_calls(self, source: BlockTable, request: Request, mode: str,
                       layers: int, fixed_calls: int) -> int:
        """Calls to move `request`'s KV from `source` into the blocks just reserved here."""
        source.flush()
        target = self.blocks.get(request.request_id, [])
        if mode == "fixed":
            return fixed_calls
        if mode == "per-block-per-layer":
            return len(target) * layers * 2
        sent = source.blocks.get(request.request_id, [])[:len(target)]
        if len(sent) != len(target):
            raise RuntimeError(f"request {request.request_id}: {len(target)} blocks reserved "
                               f"for a transfer whose source holds {len(sent)}")
        return len(align(sent, target))
