"""Sessions in the live world: a client's multi-round conversation (AMPD sec. 3).

A client names its session with the `X-Session-Id` HTTP header (any string up to 256
characters; `pdserve.server.app`). Requests of one session get one integer id, are marked
to keep their KV where they finish (`retain_kv`), and carry the instance that finished the
session's previous request (`home_instance`): AMPD's binding, which its routers follow, so
the next round's prefill can start on that history. The worker reuses the history as far
as the new prompt's tokens agree with it (`engine/session_kv.py`).

The table keeps the `MAX_SESSIONS` most recently used sessions.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from pdserve.types import Request

MAX_SESSIONS = 100_000


@dataclass
class _Session:
    session_id: int
    home_instance: int = -1
    history_tokens: int = 0  # KV positions the home instance keeps (its estimate)


class LiveSessions:
    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._by_id: dict[int, str] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def attach(self, request: Request, key: str) -> None:
        """Mark `request` as the next round of session `key`."""
        session = self._sessions.get(key)
        if session is None:
            session = _Session(self._next_id)
            self._next_id += 1
            self._sessions[key] = session
            self._by_id[session.session_id] = key
            if len(self._sessions) > MAX_SESSIONS:
                _, old = self._sessions.popitem(last=False)
                self._by_id.pop(old.session_id, None)
        self._sessions.move_to_end(key)
        request.session_id = session.session_id
        request.retain_kv = True
        request.home_instance = session.home_instance
        history = min(session.history_tokens, request.input_tokens - 1)
        request.history_tokens = request.cached_prefix_tokens = max(0, history)

    def finished(self, request: Request, instance_id: int) -> None:
        """The session's request finished on `instance_id`, which keeps its KV."""
        key = self._by_id.get(request.session_id)
        if key is None or key not in self._sessions:
            return
        session = self._sessions[key]
        session.home_instance = instance_id
        session.history_tokens = request.input_tokens + request.generated_tokens - 1
