"""What the local scheduler does for multi-round sessions (AMPD sec. 3, 6), in one place.

  keep      a finished round with `retain_kv` leaves its KV in the `SessionCache` (idle,
            evictable) instead of freeing it
  local     a round prefilled where its history is takes the history's blocks over and
            computes only its new tokens (`cached_prefix_tokens` of them are reused)
  remote    a round prefilled elsewhere must first read its history from the session's
            decode instance; the read starts when the round heads the queue (the lazy read
            of sec. 6, overlapping the batch in progress: `reads_due`) and the round waits
            for it (`waiting_for_read`)
  hand-off  a hand-off to the instance holding the history moves only the new tokens' KV:
            it reserves blocks beyond the history's (`reserve_transfer`) and records how
            many tokens it found (`transfer_reused_tokens`, for the driver's byte count)
  pressure  before preempting or refusing work, the scheduler evicts history (`reclaim`)
The scheduler owns the free-block count; these methods return the blocks they free or take.
"""

from __future__ import annotations

from pdserve.instance.prefill_queue import PrefillQueue
from pdserve.instance.session_cache import SessionCache
from pdserve.types import Request


class SessionHistory:
    def __init__(self) -> None:
        self.cache = SessionCache()
        self.reads: dict[int, bool] = {}  # remote rounds waiting for history: started?
        self.transfer_reused_tokens: dict[int, int] = {}

    def on_enqueue(self, request: Request) -> None:
        """A prefill arrives: take the history over here, or wait to read it."""
        if not request.cached_prefix_tokens:
            return
        if request.session_id in self.cache:
            request.cached_prefix_tokens, request.kv_blocks = self.cache.take(
                request.session_id)
        else:
            self.reads[request.request_id] = False

    def waiting_for_read(self, request: Request) -> bool:
        return request.request_id in self.reads

    def reads_due(self, prefills: PrefillQueue) -> list[Request]:
        """The queue's next request if its history read has not started; marks it started."""
        if not self.reads or not prefills.waiting:
            return []
        head = prefills.peek()
        if self.reads.get(head.request_id) is False:
            self.reads[head.request_id] = True
            return [head]
        return []

    def read_done(self, request: Request) -> None:
        self.reads.pop(request.request_id, None)

    def reclaim(self, blocks_needed: int, free_blocks: int, keep_session: int = -1) -> int:
        """Blocks freed by evicting history (LRU, idle first) so `blocks_needed` fit."""
        if blocks_needed <= free_blocks or not len(self.cache):
            return 0
        return self.cache.evict(blocks_needed - free_blocks, keep_session)

    def history_blocks(self, request: Request, total_blocks: int) -> int:
        """Blocks of an incoming hand-off the history here already holds."""
        return min(self.cache.blocks_of(request.session_id), total_blocks)

    def take_for_transfer(self, request: Request) -> int:
        """The hand-off is admitted: it takes the history over; returns its blocks."""
        tokens, blocks = self.cache.take(request.session_id)
        if tokens:
            self.transfer_reused_tokens[request.request_id] = tokens
        return blocks

    def keep(self, request: Request) -> int | None:
        """A finished request: keep its KV for the session's next round. Returns blocks
        freed (an older entry replaced), or None when the request keeps nothing."""
        if not (request.retain_kv and request.session_id >= 0):
            return None
        freed = self.cache.store(request.session_id, request.sequence_tokens - 1,
                                 request.kv_blocks)
        request.kv_blocks = 0
        return freed

    def forget(self, request: Request) -> None:
        self.reads.pop(request.request_id, None)
        self.transfer_reused_tokens.pop(request.request_id, None)

