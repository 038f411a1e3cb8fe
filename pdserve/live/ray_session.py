"""This server's hold on Ray: join a running cluster within a deadline, or start a local
instance on loopback; stop what was started here.

`ray.init(address=...)` never gives up on an address it cannot use: it retries its GCS
connection forever (logging every 30 s) and blocks the thread that called it. So `open`
first checks the address (HOST:PORT; a loopback one stays on loopback, `use_loopback`),
then opens a TCP connection to it (refused, unresolvable, silent: a `RayJoinError` at once
or at the deadline, naming the address and the likely cause), then runs `ray.init` in a
daemon thread and awaits it until `connect_timeout_s` has passed since `open` began; past
it, or when the await is cancelled (a signal during start-up), the thread is abandoned
(it is a daemon: the exiting server does not wait for it). The thread lives until `close`,
as the Ray processes it starts die with it. A local instance is started the
same way (it can take many seconds on a small machine), with an explicit CPU count, no
dashboard and no usage reporting. Token authentication: `ray_cluster.use_token_auth`.

Ray warns, when `ray.init` runs off the main thread, that it did not set its SIGTERM
handler: that is intended (the HTTP server owns SIGTERM), so the warning is filtered out.
A Ray that this process already joined (`ray.init` before the server starts, as the tests
do) is used as it is and left as it is; a cluster joined here is left on `close` (it runs
on), and a local instance started here is stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from pdserve.live.processes import StartupError
from pdserve.live.ray_cluster import (
    AUTH_MODE_ENV,
    LOOPBACK,
    RAY_MISSING,
    RaySettings,
    is_loopback,
    parse_address,
    token_at_hand,
    use_loopback,
    use_token_auth,
)

log = logging.getLogger("pdserve.live")
T = TypeVar("T")
LIKELY_REFUSED = (
    "no Ray head runs there (start one: `pdserve ray-local --nodes 2` on this machine, or "
    "`ray start --head --port PORT` on the head's), or it listens on another port or "
    "address (a head started without --node-ip-address listens on its machine's outward "
    "address, not on 127.0.0.1)")
LIKELY_STALLED = (
    "the port is not a Ray head's GCS port; the head advertises an address this machine "
    "cannot reach (start it with --node-ip-address set to the address given here); the "
    "cluster wants a token this server lacks or has another one (RAY_AUTH_MODE=token and "
    "RAY_AUTH_TOKEN or ~/.ray/auth_token, the head's); or the two sides run different Ray "
    "versions (this side: {version})")
AUTH_HINT = ("the cluster uses token authentication: set RAY_AUTH_MODE=token and give its "
             "token (RAY_AUTH_TOKEN, or the file ~/.ray/auth_token, copied from the head)")


class RayJoinError(StartupError):
    """This server could not join (or start) Ray; the message names the address and the
    likely cause."""


class _SigtermWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("SIGTERM handler is not set")


def in_daemon_thread(call: Callable[[], T], keep_until: threading.Event | None = None
                     ) -> asyncio.Future[T]:
    """Run `call` in a daemon thread; its outcome lands in the returned future. Unlike
    `asyncio.to_thread`'s, the thread does not hold the process up at exit if `call`
    never returns. With `keep_until` the thread then lives on until that is set: Ray's
    processes started by `ray.init` die with the thread that started them (their parent
    death signal is per thread)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: tuple[T | None, BaseException | None]) -> None:
        if done.done():
            return
        value, error = outcome
        if error is None:
            done.set_result(value)  # type: ignore[arg-type]
        else:
            done.set_exception(error)

    def run() -> None:
        outcome: tuple[T | None, BaseException | None]
        try:
            outcome = (call(), None)
        except BaseException as err:  # noqa: BLE001 - handed to the awaiting task
            outcome = (None, err)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, outcome)
        if keep_until is not None:
            keep_until.wait()

    threading.Thread(target=run, name="pdserve-ray-call", daemon=True).start()
    return done


class RaySession:
    def __init__(self, settings: RaySettings, cpus_needed: float) -> None:
        self.settings = settings
        self.cpus_needed = cpus_needed
        self.owned = False  # a local instance started here (stopped by `close`)
        self.joined = False  # a running cluster joined here (left by `close`)
        self._closed = threading.Event()  # ends the thread that called `ray.init`
        self.authenticated = False  # token authentication on for this connection

    async def open(self) -> None:
        try:
            import ray
        except ImportError as err:
            raise RuntimeError(f"{RAY_MISSING} ({err})") from err
        if ray.is_initialized():
            return
        logging.getLogger("ray._private.worker").addFilter(_SigtermWarning())
        if self.settings.address:
            await self._join(ray)
        else:
            await self._start(ray)

    async def _start(self, ray) -> None:  # type: ignore[no-untyped-def]
        use_loopback()
        self.authenticated = use_token_auth(starting=True)
        cpus = self.settings.num_cpus or max(1, round(self.cpus_needed + 0.499))
        log.info("starting a local Ray instance on %s (%d CPUs, token authentication %s)",
                 LOOPBACK, cpus, "on" if self.authenticated else "off")
        await in_daemon_thread(lambda: ray.init(
            address="local",  # a new instance, even where another one runs
            num_cpus=cpus, include_dashboard=False, _node_ip_address=LOOPBACK,
            namespace=self.settings.namespace, configure_logging=False), self._closed)
        self.owned = True

    async def _join(self, ray) -> None:  # type: ignore[no-untyped-def]
        address, timeout_s = self.settings.address, self.settings.connect_timeout_s
        host, port = parse_address(address)
        deadline = time.monotonic() + timeout_s
        if is_loopback(host):
            use_loopback()  # else Ray tries the host's outward address instead
        self.authenticated = use_token_auth(starting=False)
        log.info("joining the Ray cluster at %s (within %.0f s, --ray-connect-timeout; "
                 "token authentication %s)", address, timeout_s,
                 f"on, token from {token_at_hand() or 'nowhere'}" if self.authenticated
                 else "off")
        await in_daemon_thread(lambda: _reach(host, port, address, timeout_s))
        try:
            await asyncio.wait_for(in_daemon_thread(lambda: ray.init(
                address=address, namespace=self.settings.namespace,
                configure_logging=False), self._closed), max(0.0, deadline - time.monotonic()))
        except TimeoutError:
            raise RayJoinError(
                f"could not join the Ray cluster at {address}: it answers, but Ray did not "
                f"finish joining within {timeout_s:.0f} s (--ray-connect-timeout). Likely "
                f"causes: {LIKELY_STALLED.format(version=ray.__version__)}") from None
        except Exception as err:  # noqa: BLE001 - Ray's own error, with its cause kept
            hint = AUTH_HINT if "authentic" in f"{type(err).__name__} {err}".lower() else (
                LIKELY_STALLED.format(version=ray.__version__))
            raise RayJoinError(f"could not join the Ray cluster at {address}: "
                               f"{type(err).__name__}: {err}. Likely cause: {hint}") from err
        self.joined = True
        nodes = [node for node in ray.nodes() if node.get("Alive")]
        log.info("joined the Ray cluster at %s: %d nodes, %.0f CPUs", address, len(nodes),
                 ray.cluster_resources().get("CPU", 0))
        if not self.authenticated:
            log.warning("the Ray cluster at %s runs without token authentication (%s "
                        "unset and no token here): anyone who reaches its ports can run "
                        "code on its nodes; see docs/serving.md, \"Past one machine\"",
                        address, AUTH_MODE_ENV)

    @property
    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def close(self) -> None:
        """Stop the local instance started here, or leave the cluster joined here."""
        if self.owned or self.joined:
            import ray

            ray.shutdown()
            self.owned = self.joined = False
        self._closed.set()


def _reach(host: str, port: int, address: str, timeout_s: float) -> None:
    """A TCP connection to the head's GCS port, or a `RayJoinError` saying why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except socket.gaierror as err:
        raise RayJoinError(f"could not join the Ray cluster at {address}: the host name "
                           f"{host!r} does not resolve ({err})") from None
    except ConnectionRefusedError:
        raise RayJoinError(f"could not join the Ray cluster at {address}: nothing listens "
                           f"there (connection refused). Likely cause: {LIKELY_REFUSED}"
                           ) from None
    except OSError as err:
        raise RayJoinError(f"could not join the Ray cluster at {address}: no connection "
                           f"within {timeout_s:.0f} s ({err}). Likely cause: a firewall "
                           f"between here and the head, or the wrong host") from None
