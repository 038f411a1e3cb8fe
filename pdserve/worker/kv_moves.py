"""A worker's KV movement (a mixin of `Worker`): sequences handed in (`AdoptKV`: queued, then
copied from the sender's pool once the local scheduler admits them, `start_transfers`),
handed out (`Detach`, a migration's source; `ReleaseKV` once the receiver has them), and the
peers' pools it maps (`ForgetPool` when a peer's worker is gone). A transfer that fails
fails only its request (`WorkerError`)."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import Connection

from pdserve.engine.engine import Engine
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.transfer import attach_pool
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.types import Request
from pdserve.worker.batch_guard import describe
from pdserve.worker.messages import (
    AdoptKV,
    Detach,
    Detached,
    ForgetPool,
    ReleaseKV,
    Transferred,
    WorkerError,
)
from pdserve.worker.sessions import WorkerSessions


class WorkerKV:
    # the worker's
    instance_id: int
    connection: Connection
    engine: Engine
    local: LocalScheduler
    sessions: WorkerSessions
    requests: dict[int, Request]
    handoffs: dict[int, AdoptKV]
    peers: dict[str, PagedKVPool]
    drop: Callable[[int], None]
    follow_prefix_cache: Callable[[], None]

    def handle_kv(self, command: AdoptKV | Detach | ReleaseKV | ForgetPool) -> None:
        local, engine = self.local, self.engine
        if isinstance(command, AdoptKV):
            handoff, session = command.handoff, command.session_id
            if session >= 0:  # only the history that agrees with the sequence is merged
                self.sessions.agree_with(session, handoff)
            request = Request(handoff.request_id, 0.0, handoff.prompt_tokens,
                              handoff.params.max_tokens,
                              generated_tokens=len(handoff.token_ids) - handoff.prompt_tokens,
                              session_id=session, retain_kv=session >= 0)
            self.requests[request.request_id] = request
            self.handoffs[request.request_id] = command
            local.enqueue_transfer_in(request)
        elif isinstance(command, Detach):
            request = self.requests.get(command.request_id)
            moved = request is not None and local.detach(request)
            self.connection.send(Detached(self.instance_id, command.request_id,
                                          engine.export(command.request_id) if moved else None))
        elif isinstance(command, ReleaseKV):
            request = self.requests.pop(command.request_id, None)
            if request is not None:  # else cancelled meanwhile
                local.release_handoff(request)
                engine.release(command.request_id)
        else:
            pool = self.peers.pop(command.pool_name, None)
            if pool is not None:
                pool.close()

    def _peer(self, pool_name: str) -> PagedKVPool:
        if pool_name not in self.peers:
            self.peers[pool_name] = attach_pool(pool_name, self.engine.pool)
        return self.peers[pool_name]

    def start_transfers(self) -> None:
        admitted = self.local.admit_transfers()
        self.follow_prefix_cache()  # admitting may evict: free those blocks first
        for request in admitted:
            handoff = self.handoffs.pop(request.request_id).handoff
            try:
                assert handoff.pool_name is not None
                merge = self.local.transfer_reused_tokens.pop(request.request_id, 0)
                self.engine.import_from(handoff, self._peer(handoff.pool_name),
                                        request.session_id if merge else -1)
            except Exception as err:  # noqa: BLE001 - e.g. the sender's pool is gone
                self.drop(request.request_id)
                self.connection.send(WorkerError(
                    self.instance_id, request.request_id,
                    f"the KV transfer failed: {describe(err)}", "server_error"))
                continue
            self.local.transfer_done(request)
            self.connection.send(Transferred(self.instance_id, request.request_id))
