"""Decode spans: a decode-only batch run over many steps at once (the simulator's fast
advance). The local scheduler reserves the blocks of the longest run of steps whose batch
cannot change (no decode finishes before its last step, every block it needs is free), and
gives back the rest when new work cuts the span short. A mixin of `LocalScheduler`, whose
block counts it updates."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdserve.types import KV_BLOCK_TOKENS, Request, blocks_for

if TYPE_CHECKING:
    from pdserve.instance.local_scheduler import BatchPlan


class DecodeSpans:
    free_blocks: int  # the local scheduler's

    def _reserve_span(self, decodes: list[Request], max_steps: int) -> int:
        """Longest run of steps with an unchanged batch: no decode finishes before its last
        step and every block it needs is free. Reserves those blocks."""
        steps = min(max_steps, min(r.output_tokens - r.generated_tokens for r in decodes))
        if steps <= 1:
            return 1
        if self._span_blocks(decodes, steps) > self.free_blocks:
            low, high = 1, steps  # low fits (its blocks were allocated by _grow_decodes)
            while high - low > 1:
                mid = (low + high) // 2
                if self._span_blocks(decodes, mid) <= self.free_blocks:
                    low = mid
                else:
                    high = mid
            steps = low
        extra = steps - 1
        for request in decodes:
            blocks = -(-(request.input_tokens + request.generated_tokens + extra)
                       // KV_BLOCK_TOKENS)
            self.free_blocks -= blocks - request.kv_blocks
            request.kv_blocks = blocks
        return steps

    @staticmethod
    def _span_blocks(decodes: list[Request], steps: int) -> int:
        """Blocks the decodes need beyond what they hold to run `steps` steps."""
        extra = steps - 1
        return sum(-(-(r.input_tokens + r.generated_tokens + extra) // KV_BLOCK_TOKENS)
                   - r.kv_blocks for r in decodes)

    def shrink_span(self, plan: BatchPlan, steps: int) -> None:
        """Cut a multi-step plan to its first `steps` steps, giving back the blocks reserved
        for the rest; the state is then what running it step by step would have reached."""
        if not 1 <= steps <= plan.steps:
            raise ValueError(f"steps must be in 1..{plan.steps}, got {steps}")
        for request in plan.decodes:
            blocks = blocks_for(request.sequence_tokens + steps - 1)
            self.free_blocks += request.kv_blocks - blocks
            request.kv_blocks = blocks
        plan.steps = steps

    def blocks_after(self, plan: BatchPlan, steps: int) -> int:
        """Blocks in use once `steps` steps of `plan` have been scheduled (for a view of an
        instance part-way through a multi-step plan)."""
        excess = sum(r.kv_blocks - blocks_for(r.sequence_tokens + steps - 1)
                     for r in plan.decodes)
        return self.used_blocks - excess
