"""The driver's side of one Ray-hosted worker, shaped like a local worker's pipe and process
so `WorkerProcesses`' event-loop wiring and supervision run unchanged.

`ActorChannel` is the pipe: the worker's messages travel over one authenticated
`multiprocessing.connection` over TCP that the actor opens back to the driver once its model
is loaded (one listening socket per actor start, bound to the driver's node address, the
same challenge as `multiprocessing.connection.Listener`). Until the actor connects,
`fileno()` is the listening socket, which turns readable when it does; the first thing the
actor sends is an `ActorHello` (its PID and node), then the worker's `WorkerReady`.

`ActorProcess` is the process: its `sentinel` is a pipe that turns readable when the
actor's long-running `serve` call ends, and its `exitcode` says how: 0 a clean stop,
`-SIGKILL` killed from outside (`ray.kill`, by us or anyone, or its node left or became
unreachable), and `ACTOR_CRASH_EXIT_CODE` when it died by itself or its loop raised. Ray
does not report a dead worker process's exit code, so a death by itself is blamed as a
crash (the batch it ran fails, never retried: `live/failover.py`), the conservative
reading. Ray says a node is dead only after missing its heartbeats for many seconds, so
the driver does not wait for that: when the channel breaks and Ray has not said how the
actor ended within a short grace (a death by itself is reported within it), the actor is
presumed lost with its node (`presume_lost`, as `-SIGKILL`: its requests are re-run). The
channel's TCP keepalive breaks it within `KEEPALIVE_S` of a peer that vanished silently.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import struct
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

ACTOR_CRASH_EXIT_CODE = 1
HANDSHAKE_TIMEOUT_S = 10.0
KEEPALIVE_S = (5, 2, 3)  # idle seconds, seconds between probes, probes: ~11 s to break


@dataclass(frozen=True)
class ActorHello:
    pid: int
    node_id: str
    node_ip: str


class ActorChannel:
    def __init__(self, host: str, authkey: bytes) -> None:
        self._authkey = authkey
        self._listener: socket.socket | None = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        self._conn: Connection | None = None
        self.hello: ActorHello | None = None
        self.death = ""  # why the actor ended before connecting

    def fileno(self) -> int:
        if self._conn is not None:
            return self._conn.fileno()
        if self._listener is None:
            raise OSError("the channel is closed")
        return self._listener.fileno()

    def _accept(self, timeout_s: float | None) -> bool:
        if self._conn is not None:
            return True
        if self._listener is None:
            raise EOFError(self.death or "the channel is closed")
        ready, _, _ = select.select([self._listener], [], [], timeout_s)
        if not ready:
            return False
        peer, _ = self._listener.accept()
        self._listener.close()
        self._listener = None
        if self.death:  # the wake-up connection of a dead actor
            peer.close()
            raise EOFError(self.death)
        receive_timeout(peer, HANDSHAKE_TIMEOUT_S)  # a blocking fd that gives up
        keep_alive(peer)
        conn = Connection(os.dup(peer.fileno()))
        try:
            deliver_challenge(conn, self._authkey)
            answer_challenge(conn, self._authkey)
            hello = conn.recv()
        except Exception as err:
            conn.close()
            peer.close()
            raise EOFError(f"the actor's connection failed: {err}") from err
        if not isinstance(hello, ActorHello):
            conn.close()
            peer.close()
            raise EOFError(f"the actor sent {type(hello).__name__} before its hello")
        receive_timeout(peer, 0.0)
        peer.close()  # the connection holds its own descriptor
        self._conn, self.hello = conn, hello
        return True

    def poll(self, timeout_s: float = 0.0) -> bool:
        started = time.monotonic()
        if self._conn is None and not self._accept(timeout_s):
            return False
        assert self._conn is not None
        return self._conn.poll(max(0.0, timeout_s - (time.monotonic() - started)))

    def recv(self) -> object:
        self._accept(None)
        assert self._conn is not None
        return self._conn.recv()

    def send(self, message: object) -> None:
        if self._conn is None:
            raise OSError("the actor has not connected")
        self._conn.send(message)

    def wake(self, death: str) -> None:
        """The actor ended before connecting: make the listener readable, so whoever waits
        on it reads the death (from any thread)."""
        if self._conn is not None or self._listener is None:
            return
        self.death = death
        with contextlib.suppress(OSError), socket.create_connection(self.address, timeout=2):
            pass

    def close(self) -> None:
        for closable in (self._conn, self._listener):
            if closable is not None:
                with contextlib.suppress(OSError):
                    closable.close()
        self._conn = self._listener = None


def receive_timeout(sock: socket.socket, seconds: float) -> None:
    """A kernel receive timeout on a blocking socket (0: none): `multiprocessing`'s
    connections need a blocking descriptor, and a silent peer must not stall a reader."""
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                    struct.pack("ll", whole, int((seconds - whole) * 1e6)))


def keep_alive(sock: socket.socket) -> None:
    """TCP keepalive probes (`KEEPALIVE_S`), so a silent peer breaks the connection."""
    idle, interval, count = KEEPALIVE_S
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval),
                          ("TCP_KEEPCNT", count)):
        if hasattr(socket, option):  # Linux; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def authenticate(sock: socket.socket, authkey: bytes, serving: bool) -> None:
    """`multiprocessing.connection`'s mutual challenge over a plain socket (a blocking one;
    raises `AuthenticationError` or `OSError`), which then carries the caller's protocol."""
    conn = Connection(os.dup(sock.fileno()))
    try:
        if serving:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        else:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
    finally:
        conn.close()


def exit_code_of(error: BaseException | None, killed_here: bool) -> int:
    """The local-process exit code that means the same as how the actor's `serve` ended."""
    if error is None:
        return 0
    text = str(error)
    if (killed_here or "killed by `ray.kill`" in text or "node has died" in text
            or type(error).__name__ == "ActorUnavailableError"):  # unreachable, not dead
        return -signal.SIGKILL
    return ACTOR_CRASH_EXIT_CODE


class ActorProcess:
    """A Ray actor running a worker loop, with the parts of `multiprocessing.Process` that
    `WorkerProcesses` uses."""

    def __init__(self, actor: Any, serve_ref: Any, channel: ActorChannel) -> None:
        self.actor = actor
        self.channel = channel
        self.exitcode: int | None = None
        self.cause = ""
        self._killed = False
        self._done = threading.Event()
        self._ending = threading.Lock()  # Ray's thread (`_ended`) or `presume_lost`
        self.sentinel, self._wake_fd = os.pipe()
        serve_ref.future().add_done_callback(self._ended)

    @property
    def pid(self) -> int | None:
        return self.channel.hello.pid if self.channel.hello is not None else None

    @property
    def node_id(self) -> str:
        return self.channel.hello.node_id if self.channel.hello is not None else ""

    @property
    def node_ip(self) -> str:
        return self.channel.hello.node_ip if self.channel.hello is not None else ""

    def _ended(self, future: Future) -> None:
        error = future.exception()
        self._end(exit_code_of(error, self._killed),
                  "" if error is None else str(error).strip().splitlines()[-1])

    def presume_lost(self, cause: str) -> None:
        """Its channel broke and Ray has not said how it ended: take it as lost from
        outside (its node gone or cut off). Ray's later word changes nothing."""
        self._end(-signal.SIGKILL, cause)

    def _end(self, exitcode: int, cause: str) -> None:
        with self._ending:
            if self._done.is_set():
                return
            self.exitcode, self.cause = exitcode, cause
            # no Ray calls here (Ray's own thread may run this): an actor whose loop
            # raised is still alive, and whoever reads the sentinel kills it (`kill`)
            self._done.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_fd, b"x")
        self.channel.wake(f"the worker's actor ended before it was ready: {self.cause}")

    def join(self, timeout_s: float | None = None) -> None:
        self._done.wait(timeout_s)

    def is_alive(self) -> bool:
        return not self._done.is_set()

    def kill(self) -> None:
        self._killed = True
        self._kill_quietly()

    def _kill_quietly(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(self.actor, no_restart=True)

    def close(self) -> None:
        for fd in (self.sentinel, self._wake_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.channel.close()
