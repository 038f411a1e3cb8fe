"""A worker's side of sessions (AMPD): its engine's kept histories and its local
scheduler's block counts of them, kept in step.

  after add      the engine reused a history as far as the prompt agrees with it; the
                 scheduler's count is trimmed to the same length (`count_reuse`)
  before adopt   a hand-off merges onto the history only as far as the two agree
                 (`agree_with`)
  export         another worker will read a history: it is locked here until unlocked
  import         this worker copies a history from another's pool before prefilling
  drop           the session's next round recomputes its history elsewhere, or its decode
                 moved: the kept copy is forgotten
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from pdserve.engine.engine import Engine
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.sessions import HistoryRef
from pdserve.engine.transfer import KVHandoff
from pdserve.instance.local_scheduler import LocalScheduler


class WorkerSessions:
    def __init__(self, engine: Engine, local: LocalScheduler,
                 peer: Callable[[str], PagedKVPool]) -> None:
        self.engine, self.local, self.peer = engine, local, peer
        local.sessions.on_evict = engine.sessions.drop  # an eviction frees the real KV

    def count_reuse(self, session_id: int, reused_tokens: int) -> None:
        self.local.trim_session_history(session_id, reused_tokens)

    def agree_with(self, session_id: int, handoff: KVHandoff) -> None:
        sessions = self.engine.sessions
        reuse = sessions.reusable(session_id, handoff.token_ids, handoff.computed_tokens)
        sessions.trim(session_id, reuse)
        self.count_reuse(session_id, reuse)

    def export(self, session_id: int) -> HistoryRef | None:
        history = self.engine.sessions.export(session_id, self.engine.pool.shared_name)
        if history is not None and not self.local.sessions.lock(session_id):
            return None  # the two disagree: do not let it be read
        if history is not None:
            self.engine.pool.stage(history.blocks)  # a GPU pool's host mirror
        return history

    def drop(self, session_id: int) -> None:
        """Forget a kept history (the session moved on elsewhere), in both views."""
        self.local.drop_session_history(session_id)
        self.engine.sessions.drop(session_id)

    def unlock(self, session_id: int) -> None:
        self.local.sessions.lock(session_id, False)

    def import_history(self, history: HistoryRef) -> int:
        """Copy a session's history from its decode worker's pool; returns the tokens
        copied (0 when there is no room or the copy failed: the prefill computes them)."""
        tokens, blocks = len(history.token_ids), len(history.blocks)
        if not self.local.adopt_history(history.session_id, tokens, blocks):
            return 0
        try:
            self.engine.import_history(history, self.peer(history.pool_name))
        except Exception:  # noqa: BLE001 - e.g. the sender's pool is gone
            traceback.print_exc()
            self.local.drop_session_history(history.session_id)
            self.engine.sessions.drop(history.session_id)
            return 0
        return tokens
