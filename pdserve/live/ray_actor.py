"""One instance's worker loop hosted in a Ray actor.

`WorkerHost.serve` builds the same `Worker` a local process runs (model, engine, local
scheduler), starts a `KVServer` over its pool, connects back to the driver
(`ray_channel.ActorChannel`), says hello and runs `Worker.serve`: the worker loop is
unchanged. A `HostWatch` ends the actor's process when its raylet or its driver is gone.
The actor allows a few concurrent calls, so while `serve` runs its peers can ask where its
KV is (`kv_endpoint`) and read runs of it through the object store (`read_run`).

`RayHostedWorker` differs from `Worker` in one place, how it maps a sender's pool (the
`map_peer_pool` it gives the worker, `_map_peer_pool`): the pool is named after the sender's
actor; on the same node it is mapped from shared memory as before, on another node it is
read through the configured transport (`ray_kv`).
"""

from __future__ import annotations

import os
import threading
from multiprocessing.connection import Client
from typing import Any

import numpy as np
import ray

from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.transfer import attach_pool
from pdserve.live.processes import WorkerSettings
from pdserve.live.ray_channel import ActorHello
from pdserve.live.ray_host_watch import HostWatch
from pdserve.live.ray_kv import READ_TIMEOUT_S, KVServer, object_store_pool, read_run, tcp_pool
from pdserve.worker.worker import Worker

ACTOR_CONCURRENCY = 4  # serve + peers' endpoint and object-store reads


class RayHostedWorker(Worker):
    def __init__(self, *args: Any, namespace: str, kv_transport: str, authkey: bytes,
                 **kwargs: Any) -> None:
        self.authkey = authkey  # the server's: its workers' KV servers ask peers for it
        self.namespace = namespace
        self.kv_transport = kv_transport
        self.node_id = ray.get_runtime_context().get_node_id()
        super().__init__(*args, map_peer_pool=self._map_peer_pool, **kwargs)

    def _map_peer_pool(self, pool_name: str, like: PagedKVPool) -> PagedKVPool:
        sender = ray.get_actor(pool_name, namespace=self.namespace)
        node_id, host, port = ray.get(sender.kv_endpoint.remote(), timeout=READ_TIMEOUT_S)
        if node_id == self.node_id:
            return attach_pool(pool_name, like)
        if self.kv_transport == "tcp":
            return tcp_pool((host, port), like, self.authkey)  # type: ignore[return-value]
        return object_store_pool(sender, like)  # type: ignore[return-value]


class WorkerHost:
    """The actor class (`ray.remote(WorkerHost)` with the instance's resources)."""

    def __init__(self, instance: int, settings: WorkerSettings, pool_name: str,
                 namespace: str, kv_transport: str, environment: dict[str, str]) -> None:
        os.environ.update(environment)
        self.instance = instance
        self.settings = settings
        self.pool_name = pool_name
        self.namespace = namespace
        self.kv_transport = kv_transport
        self.worker: RayHostedWorker | None = None
        self.kv: KVServer | None = None
        self._ready = threading.Event()

    def serve(self, address: tuple[str, int], authkey: bytes) -> None:
        """Build the worker, connect to the driver and run the loop. The process ends
        itself (`HostWatch`) when its raylet dies or the driver's connection breaks."""
        watch = HostWatch.from_env()
        if watch is not None:
            watch.start()
        try:
            self._serve(address, authkey, watch)
        except (EOFError, OSError) as err:
            if watch is not None:
                watch.end(f"the connection to its driver broke "
                          f"({type(err).__name__}: {err})")
            raise

    def _serve(self, address: tuple[str, int], authkey: bytes,
               watch: HostWatch | None) -> None:
        s = self.settings
        self.worker = RayHostedWorker(
            self.instance, s.model, s.seed, s.kv_blocks, s.chunk_size_tokens,
            s.max_batch_size, None, s.phase_priority,  # type: ignore[arg-type]
            s.prefix_block_tokens, s.queue_order, s.perf, s.decode_forecast,
            pool_name=self.pool_name,
            device=s.device,
            namespace=self.namespace, kv_transport=self.kv_transport, authkey=authkey)
        if watch is not None:
            watch.pool_name = self.pool_name
        node_ip = ray.util.get_node_ip_address()
        self.kv = KVServer(self.worker.engine.pool, node_ip, authkey)
        self._ready.set()
        connection = Client(address, authkey=authkey)
        connection.send(ActorHello(os.getpid(), self.worker.node_id, node_ip))
        self.worker.connection = connection
        try:
            self.worker.serve()
        finally:
            self.kv.close()

    def kv_endpoint(self) -> tuple[str, str, int]:
        """(node id, host, port) of this worker's KV server, once its pool exists."""
        if not self._ready.wait(READ_TIMEOUT_S):
            raise RuntimeError(f"instance {self.instance}'s pool is not ready")
        assert self.worker is not None and self.kv is not None
        return (self.worker.node_id, *self.kv.address)

    def read_run(self, start: int, count: int) -> np.ndarray:
        assert self.worker is not None and self.kv is not None
        run = read_run(self.worker.engine.pool, start, count)
        self.kv.count(count)
        return run

    def kv_served(self) -> tuple[int, int]:
        """(runs, bytes) this worker sent to peers on other nodes (either transport)."""
        return (self.kv.runs_served, self.kv.bytes_served) if self.kv is not None else (0, 0)
