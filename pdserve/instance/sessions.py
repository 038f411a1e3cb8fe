"""Multi-round sessions on an instance (AMPD sec. 3, 6): the history KV it keeps, and what
its local scheduler does for session rounds.

`SessionCache` holds the history KV of idle sessions bound to this instance. When a round
of a multi-round session finishes, its decode instance keeps the sequence's KV (the next
round's prompt starts with it) instead of freeing it. Between rounds the entry is idle and
may be evicted, least recently used first, when the instance runs out of memory; the
session's next round then recomputes its history (`evictions_total` counts that). From the
moment a round is routed until its KV is back on this instance the entry is pinned: a local
prefill takes its blocks over, and a remote prefill's hand-off extends them with only the
new tokens' KV (AMPD footnote 4: a decode worker merges the incremental KV with the history
it keeps).

`SessionHistory` is the local scheduler's side of sessions, in one place:
  keep      a finished round with `retain_kv` leaves its KV in the `SessionCache` (idle,
            evictable) instead of freeing it
  local     a round prefilled where its history is takes the history's blocks over and
            computes only its new tokens (`cached_prefix_tokens` of them are reused)
  remote    a round prefilled elsewhere must first read its history from the session's
            decode instance; the read starts when the round heads the queue (the lazy read
            of sec. 6, overlapping the batch in progress: `reads_due`) and the round waits
            for it (`waiting_for_read`)
  hand-off  a hand-off to the instance holding the history moves only the new tokens' KV:
            it reserves blocks beyond the history's (`history_blocks`, `take_for_transfer`) and
            records how many tokens it found (`transfer_reused_tokens`, for the driver's
            byte count)
  pressure  before preempting or refusing work, the KV budget evicts history (`reclaim`,
            the budget's reclaim hook)

Both only count blocks: the methods return the blocks they free or hand over, and the local
scheduler gives them to its `KVBudget` (`instance/kv_budget.py`), the only writer of the
free-block count.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.instance.prefill_queue import PrefillQueue
from pdserve.types import Request, blocks_for


@dataclass(slots=True)
class SessionKV:
    tokens: int  # KV positions held (the finished round's sequence less its last token)
    blocks: int
    pinned: bool = False
    locked: bool = False  # another worker is reading it (live): never evicted meanwhile


class SessionCache:
    """History KV of idle sessions kept on this instance, least recently used first."""

    def __init__(self) -> None:
        self._entries: OrderedDict[int, SessionKV] = OrderedDict()  # least recent first
        self.blocks = 0
        self.evictions_total = 0
        self.on_evict: Callable[[int], None] | None = None  # a live engine frees the KV

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._entries

    def tokens(self, session_id: int) -> int:
        entry = self._entries.get(session_id)
        return entry.tokens if entry is not None else 0

    def blocks_of(self, session_id: int) -> int:
        entry = self._entries.get(session_id)
        return entry.blocks if entry is not None else 0

    def store(self, session_id: int, tokens: int, blocks: int) -> int:
        """Keep a finished round's KV, idle; returns blocks freed by replacing an older
        entry of the same session (none in normal operation)."""
        freed = self.drop(session_id)
        self._entries[session_id] = SessionKV(tokens, blocks)
        self.blocks += blocks
        return freed

    def pin(self, session_id: int) -> int:
        """A round of the session was routed: keep its history until the KV is back here.
        Returns the history tokens held (0 when there is none, e.g. evicted)."""
        entry = self._entries.get(session_id)
        if entry is None:
            return 0
        entry.pinned = True
        self._entries.move_to_end(session_id)
        return entry.tokens

    def lock(self, session_id: int, locked: bool = True) -> bool:
        """Lock (or unlock) the history while another worker copies it; False if absent."""
        entry = self._entries.get(session_id)
        if entry is None:
            return False
        entry.locked = locked
        entry.pinned = True
        return True

    def take(self, session_id: int) -> tuple[int, int]:
        """Hand the history over to the session's next sequence: (tokens, blocks), or
        (0, 0) when there is none; the blocks stay in use, now counted by the request."""
        entry = self._entries.pop(session_id, None)
        if entry is None:
            return 0, 0
        self.blocks -= entry.blocks
        return entry.tokens, entry.blocks

    def drop(self, session_id: int) -> int:
        """Forget a session's history (its next round goes elsewhere); returns freed blocks."""
        entry = self._entries.pop(session_id, None)
        if entry is None:
            return 0
        self.blocks -= entry.blocks
        return entry.blocks

    def trim(self, session_id: int, tokens: int) -> int:
        """Keep only the first `tokens` of the history (0: forget it); returns freed
        blocks. A live engine reuses a history only as far as the new tokens agree."""
        entry = self._entries.get(session_id)
        if entry is None:
            return 0
        if tokens <= 0:
            return self.drop(session_id)
        keep = min(entry.blocks, blocks_for(tokens))
        freed, entry.blocks, entry.tokens = entry.blocks - keep, keep, min(tokens, entry.tokens)
        self.blocks -= freed
        return freed

    @property
    def evictable_blocks(self) -> int:
        """Blocks `evict` could free: every history no other worker is reading."""
        return sum(e.blocks for e in self._entries.values() if not e.locked)

    def evict(self, blocks_needed: int, keep_session: int = -1) -> int:
        """Evict entries, least recently used first, until `blocks_needed` blocks are
        freed or none is left; returns the blocks freed. Idle entries go first; pinned ones
        (rounds in flight) only when that is not enough, since memory that only pinned
        history holds could otherwise never be had (a hand-off waiting for blocks while
        the rounds pinning them wait behind it): their hand-off then carries the whole
        sequence. `keep_session` (the requester's own history) is never evicted."""
        freed = 0
        for pinned in (False, True):
            for session_id in [s for s, e in self._entries.items()
                               if e.pinned == pinned and s != keep_session and not e.locked]:
                if freed >= blocks_needed:
                    return freed
                freed += self.drop(session_id)
                self.evictions_total += 1
                if self.on_evict is not None:
                    self.on_evict(session_id)
        return freed


class SessionHistory:
    """The local scheduler's side of sessions: the kept histories (`cache`), remote rounds
    waiting to read theirs (`reads`), and hand-offs that found one (`transfer_reused_tokens`)."""

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

    def reclaim(self, blocks_short: int, keep_session: int = -1) -> int:
        """Blocks freed by evicting history (LRU, idle first) to make up `blocks_short`;
        the `KVBudget`'s reclaim hook."""
        if not len(self.cache):
            return 0
        return self.cache.evict(blocks_short, keep_session)

    def history_blocks(self, request: Request, total_blocks: int) -> int:
        """Blocks of an incoming hand-off the history here already holds."""
        if request.session_id < 0:
            return 0  # not a session round: no history anywhere
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

