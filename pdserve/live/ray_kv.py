"""KV hand-off between Ray-hosted workers on different nodes.

On one node a receiver maps the sender's shared pool (`engine/transfer.attach_pool`), as local
workers do. Across nodes the receiver reads the sender's blocks one aligned run at a time
through a `RemoteKVPool`, which stands in for the mapped pool in `copy_aligned` (only `run`
is called on a source), by one of two transports:

- `tcp`: every Ray-hosted worker runs a `KVServer` thread; a peer first passes the
  server's challenge (the key the driver gave every worker of the server, as the driver's
  channel does), then each request names a run (first block, count) and the answer is
  `transfer.send_blocks`' stream of it, read with `transfer.recv_blocks` into a staging
  buffer;
- `object-store`: the sender's actor returns the run as an array (`WorkerHost.read_run`),
  which Ray moves through its object stores.

`bench/ray_transfer.py` measures both; `tcp` is the default (docs/results/ray.md).
Reads have timeouts, so a sender that vanishes fails the transfer (the worker reports a
`WorkerError` for the request) instead of hanging the receiver.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from multiprocessing import AuthenticationError
from typing import Any

import numpy as np
import torch

from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.transfer import recv_blocks, recv_exact, send_blocks
from pdserve.live.ray_channel import authenticate, receive_timeout

_REQUEST = struct.Struct("!II")  # first block, number of blocks
READ_TIMEOUT_S = 30.0


class KVServer:
    """Serves runs of one pool over TCP to peers on other nodes (a daemon thread per peer).
    Counts what it served (`runs_served`, `bytes_served`; object-store reads too)."""

    def __init__(self, pool: PagedKVPool, host: str, authkey: bytes) -> None:
        self.pool = pool
        self._authkey = authkey
        self._listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self.runs_served = 0
        self.bytes_served = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="pdserve-kv-server", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                peer, _ = self._listener.accept()
            except OSError:  # closed
                return
            peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(peer,), daemon=True).start()

    def _serve(self, peer: socket.socket) -> None:
        with peer:
            try:
                receive_timeout(peer, READ_TIMEOUT_S)
                authenticate(peer, self._authkey, serving=True)
                receive_timeout(peer, 0.0)  # then wait for requests as long as it likes
            except (AuthenticationError, EOFError, OSError):
                return
            while True:
                try:
                    header = recv_exact(peer, _REQUEST.size)
                except (ConnectionError, OSError):
                    return
                start, count = _REQUEST.unpack(header)
                if count < 1 or start + count > self.pool.num_blocks:
                    return  # a confused peer: drop the connection, its read fails
                send_blocks(peer, self.pool, list(range(start, start + count)))
                self.count(count)

    def count(self, blocks: int) -> None:
        """One run served (over TCP here, or through the object store by the actor)."""
        with self._lock:
            self.runs_served += 1
            self.bytes_served += blocks * self.pool.block_bytes

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()


class _Staging:
    """A growable host buffer of whole blocks that `recv_blocks` can fill (`host_run`,
    `block_bytes`)."""

    def __init__(self, like: PagedKVPool) -> None:
        self.block_shape = like.shape[1:]
        self.block_bytes = like.block_bytes
        self.dtype = like.dtype
        self.data = torch.empty((0, *self.block_shape), dtype=like.dtype)

    def run(self, start: int, count: int) -> torch.Tensor:
        if start + count > self.data.shape[0]:
            self.data = torch.empty((start + count, *self.block_shape), dtype=self.dtype)
        return self.data[start:start + count]

    host_run = run


class RemoteKVPool:
    """A peer's pool on another node, read one run at a time (the source side of
    `copy_aligned`); `fetch(start, count, staging)` returns the run's blocks."""

    def __init__(self, like: PagedKVPool, fetch: Callable[[int, int, _Staging], torch.Tensor],
                 close: Callable[[], None] = lambda: None) -> None:
        self.shape = like.shape
        self.block_bytes = like.block_bytes
        self._staging = _Staging(like)
        self._fetch = fetch
        self._close = close
        self.runs_read = 0
        self.bytes_read = 0

    def run(self, start: int, count: int) -> torch.Tensor:
        blocks = self._fetch(start, count, self._staging)
        self.runs_read += 1
        self.bytes_read += count * self.block_bytes
        return blocks

    def close(self) -> None:
        self._close()


def tcp_pool(address: tuple[str, int], like: PagedKVPool, authkey: bytes) -> RemoteKVPool:
    """Read runs from a peer's `KVServer` over one persistent, authenticated connection."""
    sock = socket.create_connection(address, timeout=READ_TIMEOUT_S)
    sock.settimeout(None)  # blocking, with a kernel receive timeout instead
    receive_timeout(sock, READ_TIMEOUT_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        authenticate(sock, authkey, serving=False)
    except BaseException:
        sock.close()
        raise
    lock = threading.Lock()

    def fetch(start: int, count: int, staging: _Staging) -> torch.Tensor:
        with lock:
            staging.run(0, count)  # sized first: recv_blocks fills runs of it
            sock.sendall(_REQUEST.pack(start, count))
            recv_blocks(sock, staging, list(range(count)))  # type: ignore[arg-type]
            return staging.run(0, count)

    return RemoteKVPool(like, fetch, sock.close)


def object_store_pool(host: Any, like: PagedKVPool) -> RemoteKVPool:
    """Read runs through Ray's object store: `host` is the sender's actor handle."""
    import ray

    def fetch(start: int, count: int, staging: _Staging) -> torch.Tensor:
        array = ray.get(host.read_run.remote(start, count), timeout=READ_TIMEOUT_S)
        target = staging.run(0, count)
        np.copyto(target.view(torch.uint8).numpy(), array)
        return target

    return RemoteKVPool(like, fetch)


def read_run(pool: PagedKVPool, start: int, count: int) -> np.ndarray:
    """The sender's side of `object-store`: the run's bytes as an array (Ray copies it into
    its object store when the actor method returns; the blocks are held until released)."""
    if count < 1 or start + count > pool.num_blocks:
        raise ValueError(f"blocks [{start}, {start + count}) are outside the pool of "
                         f"{pool.num_blocks} blocks")
    return pool.host_run(start, count).view(torch.uint8).numpy()  # any dtype: its bytes
