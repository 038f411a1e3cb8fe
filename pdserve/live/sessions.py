"""Sessions in the live world: a client's multi-round conversation (AMPD sec. 3).

A client names its session with the `X-Session-Id` HTTP header (any string up to 256
characters; `pdserve.server.app`). Requests of one session get one integer id, are marked
to keep their KV where they finish (`retain_kv`), and carry the instance that finished the
session's previous request (`home_instance`): AMPD's binding, which its routers follow, so
the next round's prefill can start on that history. The worker reuses the history as far
as the new prompt's tokens agree with it (`engine/sessions.py`).

The table keeps the `MAX_SESSIONS` most recently used sessions.

Where a round's history comes from is the decision both worlds share
(`cluster/sessions.py: history_source`). A round prefilled on a prefill-only worker away
from the one keeping its history (AMPD's remote execution, READ) first reads the history
(`HistoryReads`): the driver asks the keeping worker to
lock it and say where it is (`ExportHistory` -> `HistoryExported`), sends the prefill with
that location (`AddRequest.history`), and unlocks it once the prefill worker has copied it
(`HistoryCopied` -> `UnlockHistory`) or the request is gone. The history stays on its
worker, which later merges the prefill's new KV onto it. The read happens at dispatch: a
live worker's queue does not tell the driver when a task is next (the simulator reads
lazily, when the task heads the queue, as the paper does).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.engine.sessions import HistoryRef
from pdserve.live.requests import LiveRequest
from pdserve.types import Request
from pdserve.worker.messages import (
    AddRequest,
    Command,
    ExportHistory,
    HistoryCopied,
    HistoryExported,
    UnlockHistory,
)

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


    def instance_lost(self, instance_id: int) -> None:
        """A worker died: the histories it kept are gone, so its sessions are unbound (their
        next rounds are routed as new ones and recompute their history)."""
        for session in self._sessions.values():
            if session.home_instance == instance_id:
                session.home_instance, session.history_tokens = -1, 0


class HistoryReads:
    """The driver's side of remote prefills that read a session's history (the READ of
    `cluster/sessions.py`): `send` is the driver's command path, `lookup` finds a request
    still in flight by its current attempt id."""

    def __init__(self, send: Callable[[int, Command], None],
                 lookup: Callable[[int], LiveRequest | None]) -> None:
        self.send = send
        self.lookup = lookup
        self._waiting: dict[int, int] = {}  # request -> prefill worker, export asked
        self._locked: dict[int, tuple[int, int]] = {}  # request -> (keeping worker, session)

    @staticmethod
    def add_request(live: LiveRequest, history: HistoryRef | None = None) -> AddRequest:
        request = live.request
        return AddRequest(request.request_id, live.prompt_ids, live.params,
                          tuple(live.token_ids), request.session_id, history,
                          request.arrival_s)

    def read_first(self, live: LiveRequest, prefill_instance: int) -> None:
        """Ask the keeping worker for the history; the prefill goes out when it comes."""
        request = live.request
        self._waiting[request.request_id] = prefill_instance
        self.send(request.home_instance, ExportHistory(request.request_id, request.session_id))

    def on_message(self, message: HistoryExported | HistoryCopied) -> None:
        if isinstance(message, HistoryCopied):
            self._unlock(message.request_id)
            return
        rid = message.request_id
        if message.history is not None:
            self._locked[rid] = (message.instance_id, message.history.session_id)
        target = self._waiting.pop(rid, None)
        live = self.lookup(rid)
        if target is None or live is None:
            self._unlock(rid)
            return
        self.send(target, self.add_request(live, message.history))

    def source_lost(self, instance: int) -> None:
        """The worker keeping some histories died: their prefills go without them."""
        for rid, target in list(self._waiting.items()):
            live = self.lookup(rid)
            if live is not None and live.request.home_instance == instance:
                del self._waiting[rid]
                self.send(target, self.add_request(live))

    def forget(self, request_id: int) -> None:
        self._waiting.pop(request_id, None)
        self._unlock(request_id)

    def _unlock(self, request_id: int) -> None:
        instance, session = self._locked.pop(request_id, (-1, -1))
        if instance >= 0:
            self.send(instance, UnlockHistory(session))
