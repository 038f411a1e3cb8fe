"""History KV of idle sessions, kept on the instance a session is bound to (AMPD sec. 3).

When a round of a multi-round session finishes, its decode instance keeps the sequence's KV
(the next round's prompt starts with it) instead of freeing it. Between rounds the entry is
idle and may be evicted, least recently used first, when the instance runs out of memory;
the session's next round then recomputes its history (`evictions_total` counts that). From
the moment a round is routed until its KV is back on this instance the entry is pinned: a
local prefill takes its blocks over, and a remote prefill's hand-off extends them with only
the new tokens' KV (AMPD footnote 4: a decode worker merges the incremental KV with the
history it keeps).

The cache only counts blocks; the local scheduler owns the free-block count and adds back
what `evict` and `drop` return.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.types import blocks_for


@dataclass(slots=True)
class SessionKV:
    tokens: int  # KV positions held (the finished round's sequence less its last token)
    blocks: int
    pinned: bool = False
    locked: bool = False  # another worker is reading it (live): never evicted meanwhile


class SessionCache:
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
