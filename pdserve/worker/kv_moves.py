"""A worker's KV movement between workers (`KVMoves`, owned by `worker/worker.py`):
sequences handed in (`AdoptKV`: queued, then copied from the sender's pool once the local
scheduler admits them, `start_transfers`), handed out (`Detach`, a migration's source;
`ReleaseKV` once the receiver has them), and the peers' pools it maps (`peer`; `ForgetPool`
when a peer's worker is gone). A transfer that fails fails only its request (`WorkerError`).

How a peer's pool is mapped is the host's choice (`map_peer_pool`): a local worker maps it
from shared memory (`transfer.attach_pool`); a worker in a Ray actor may read it from
another node (`live/ray_actor.py`).
"""

from __future__ import annotations

from collections.abc import Callable

from pdserve.engine.engine import Engine
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.transfer import attach_pool
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.types import Request
from pdserve.worker.batch_guard import describe
from pdserve.worker.messages import AdoptKV, Detached, Event, Transferred, WorkerError

# (pool name, this worker's pool, whose shape and dtype the peer's has) -> the peer's pool
MapPeerPool = Callable[[str, PagedKVPool], PagedKVPool]


class KVMoves:
    def __init__(self, instance_id: int, engine: Engine, local: LocalScheduler,
                 send: Callable[[Event], None], drop: Callable[[int], None],
                 follow_prefix_cache: Callable[[], None],
                 map_peer_pool: MapPeerPool = attach_pool) -> None:
        """`send`: an event to the driver; `drop`: forget a request wherever it is on the
        worker (a failed transfer); `follow_prefix_cache`: free the blocks the prefix cache
        evicted (admitting a transfer may evict)."""
        self.instance_id, self.engine, self.local = instance_id, engine, local
        self.send, self.drop, self.follow_prefix_cache = send, drop, follow_prefix_cache
        self.map_peer_pool = map_peer_pool
        self.handoffs: dict[int, AdoptKV] = {}  # by request id: waiting for their transfer
        self.peers: dict[str, PagedKVPool] = {}  # by pool name: mapped on first use

    # ---- in ----
    def receive(self, command: AdoptKV, request: Request) -> None:
        """Queue a hand-off's transfer (`request`: its local scheduler's request)."""
        self.handoffs[request.request_id] = command
        self.local.enqueue_transfer_in(request)

    def forget(self, request_id: int) -> None:
        """Drop a hand-off still waiting for its transfer, if any."""
        self.handoffs.pop(request_id, None)

    def start_transfers(self) -> None:
        """Copy in the queued hand-offs the local scheduler admits now."""
        admitted = self.local.admit_transfers()
        self.follow_prefix_cache()  # admitting may evict: free those blocks first
        for request in admitted:
            handoff = self.handoffs.pop(request.request_id).handoff
            try:
                assert handoff.pool_name is not None
                merge = self.local.transfer_reused_tokens.pop(request.request_id, 0)
                self.engine.import_from(handoff, self.peer(handoff.pool_name),
                                        request.session_id if merge else -1)
            except Exception as err:  # noqa: BLE001 - e.g. the sender's pool is gone
                self.drop(request.request_id)
                self.send(WorkerError(
                    self.instance_id, request.request_id,
                    f"the KV transfer failed: {describe(err)}", "server_error"))
                continue
            self.local.transfer_done(request)
            self.send(Transferred(self.instance_id, request.request_id))

    # ---- out ----
    def detach(self, request_id: int, request: Request | None) -> None:
        """Hand a sequence out (a migration's source) if it can move now: `Detached` with
        its hand-off, or with none (`request`: None when it is not here)."""
        moved = request is not None and self.local.detach(request)
        self.send(Detached(self.instance_id, request_id,
                           self.engine.export(request_id) if moved else None))

    def release(self, request: Request) -> None:
        """The receiver has the KV of a sequence handed out: free it here."""
        self.local.release_handoff(request)
        self.engine.release(request.request_id)

    # ---- peers' pools ----
    def peer(self, pool_name: str) -> PagedKVPool:
        if pool_name not in self.peers:
            self.peers[pool_name] = self.map_peer_pool(pool_name, self.engine.pool)
        return self.peers[pool_name]

    def forget_pool(self, pool_name: str) -> None:
        """A peer's worker is gone: unmap its pool."""
        pool = self.peers.pop(pool_name, None)
        if pool is not None:
            pool.close()

    def close(self) -> None:
        for pool in self.peers.values():
            pool.close()
