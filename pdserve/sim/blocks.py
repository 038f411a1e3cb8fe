"""Block ids of a simulated instance, allocated as the live engine allocates them, so a KV
transfer's copy count is what FlowKV's alignment gives (FlowKV sec. 3.3, appendix A).

The local scheduler only counts blocks (`Request.kv_blocks`); this table follows those
counts with real ids from the engine's `SegmentAllocator` at the points where the engine
allocates and frees: a batch's sequences grow when it starts (preempted ones drop their KV
first), a cut span gives back its later steps' blocks, finished sequences free theirs, an
incoming transfer allocates its blocks when admitted, and the sender frees its copy when the
transfer lands. Inside a multi-step span the decodes grow in the order a step-by-step run
grows them (by step, then batch order), so both modes see the same ids.

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
from pdserve.instance.segments import SegmentAllocator, align
from pdserve.types import KV_BLOCK_TOKENS, Request

TRANSFER_MODES = ("aligned", "per-block-per-layer", "fixed")


class BlockTable:
    def __init__(self, total_blocks: int) -> None:
        self.allocator = SegmentAllocator(total_blocks)
        self.blocks: dict[int, list[int]] = {}  # request id -> its block ids, in order

    def resize(self, request_id: int, count: int) -> None:
        """Grow (continuing the last run where possible) or cut a request's blocks."""
        blocks = self.blocks.setdefault(request_id, [])
        need = count - len(blocks)
        if need > 0:
            blocks += self.allocator.allocate(need, after=blocks[-1] if blocks else None)
        elif need < 0:
            self.allocator.free(blocks[count:])
            del blocks[count:]

    def free(self, request_id: int) -> None:
        blocks = self.blocks.pop(request_id, None)
        if blocks:
            self.allocator.free(blocks)

    def free_all(self, requests: Iterable[Request]) -> None:
        for request in requests:
            self.free(request.request_id)

    # ---- following the local scheduler ----
    def start(self, plan: BatchPlan) -> None:
        """A batch starts: preempted sequences lose their KV, the others grow to their
        planned counts."""
        for request in plan.preempted:
            self.free(request.request_id)
        if plan.steps > 1:
            self._grow_span(plan.decodes)
        else:
            for request in plan.decodes:
                self.resize(request.request_id, request.kv_blocks)
        for request, _ in plan.chunks:
            self.resize(request.request_id, request.kv_blocks)

    def _grow_span(self, decodes: list[Request]) -> None:
        """Allocate a span's blocks in step-by-step order: a decode of S tokens (S - 1
        computed) needs its (k+1)-th block at the step where its length passes k blocks."""
        events: list[tuple[int, int, int]] = []  # (step, batch position, request id)
        for position, request in enumerate(decodes):
            held = len(self.blocks.get(request.request_id, ()))
            start_tokens = request.sequence_tokens
            for block in range(held, request.kv_blocks):
                step = max(1, block * KV_BLOCK_TOKENS - start_tokens + 2)
                events.append((step, position, request.request_id))
        events.sort()
        for _, _, request_id in events:
            blocks = self.blocks.setdefault(request_id, [])
            blocks += self.allocator.allocate(1, after=blocks[-1] if blocks else None)

    def shrink(self, plan: BatchPlan) -> None:
        """A span was cut: give back the blocks of the steps that will not run."""
        for request in plan.decodes:
            self.resize(request.request_id, request.kv_blocks)

    def transfer_calls(self, source: BlockTable, request: Request, mode: str,
                       layers: int, fixed_calls: int) -> int:
        """Calls to move `request`'s KV from `source` into the blocks just reserved here."""
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
