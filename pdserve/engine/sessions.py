"""History KV of sessions kept by a live engine between rounds (AMPD sec. 3).

When a session's request finishes here, its sequence's computed KV (the prompt and output
less the last sampled token, which was never fed back) is kept instead of freed. The
session's next request reuses the longest common prefix of that history and its own tokens:
those blocks are taken over and only the rest is computed (a local prefill) or copied in
(a hand-off from a prefill instance merges onto the history, AMPD footnote 4). The part of
the history past the common prefix is freed.

This mirrors the local scheduler's `SessionCache` (block counts); the worker keeps the two
in step (evictions there drop entries here).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.engine.allocator import SegmentAllocator
from pdserve.types import blocks_for


@dataclass(frozen=True)
class HistoryRef:
    """Where a session's kept history is, for another worker to read it (AMPD sec. 6: a
    remote prefill reads the history KV from the session's decode worker)."""

    session_id: int
    token_ids: tuple[int, ...]
    blocks: tuple[int, ...]
    pool_name: str


@dataclass
class StoredSession:
    token_ids: list[int]  # tokens whose KV is held
    blocks: list[int]


def common_prefix(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SessionKVStore:
    def __init__(self, allocator: SegmentAllocator) -> None:
        self.allocator = allocator
        self._sessions: dict[int, StoredSession] = {}

    def __contains__(self, session_id: int) -> bool:
        return session_id in self._sessions

    def keep(self, session_id: int, token_ids: list[int], blocks: list[int]) -> None:
        """Hold `blocks` (the KV of `token_ids`) for the session's next request."""
        self.drop(session_id)
        needed = blocks_for(len(token_ids))
        if len(blocks) > needed:
            self.allocator.free(blocks[needed:])
        self._sessions[session_id] = StoredSession(list(token_ids), blocks[:needed])

    def reusable(self, session_id: int, token_ids: list[int] | tuple[int, ...],
                 limit: int) -> int:
        """How many leading tokens of `token_ids` (at most `limit`) the history covers."""
        stored = self._sessions.get(session_id)
        return min(common_prefix(stored.token_ids, token_ids), limit) if stored else 0

    def trim(self, session_id: int, tokens: int) -> None:
        """Keep only the first `tokens` of the history (0: forget it)."""
        stored = self._sessions.get(session_id)
        if stored is None:
            return
        if tokens <= 0:
            self.drop(session_id)
            return
        needed = blocks_for(tokens)
        if len(stored.blocks) > needed:
            self.allocator.free(stored.blocks[needed:])
        stored.token_ids, stored.blocks = stored.token_ids[:tokens], stored.blocks[:needed]

    def take(self, session_id: int) -> tuple[int, list[int]]:
        """Hand the (trimmed) history over: (tokens, blocks); the blocks stay allocated."""
        stored = self._sessions.pop(session_id, None)
        return (len(stored.token_ids), stored.blocks) if stored else (0, [])

    def export(self, session_id: int, pool_name: str | None) -> HistoryRef | None:
        """The history's location (it stays here; the worker keeps it locked until read)."""
        stored = self._sessions.get(session_id)
        if stored is None or pool_name is None:
            return None
        return HistoryRef(session_id, tuple(stored.token_ids), tuple(stored.blocks), pool_name)

    def adopt(self, ref: HistoryRef, blocks: list[int]) -> None:
        """Keep a history copied in from another worker into `blocks`."""
        self.keep(ref.session_id, list(ref.token_ids), blocks)

    def drop(self, session_id: int) -> None:
        stored = self._sessions.pop(session_id, None)
        if stored is not None and stored.blocks:
            self.allocator.free(stored.blocks)
