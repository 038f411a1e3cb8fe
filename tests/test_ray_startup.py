"""A newcomer's start of `pdserve serve` (issue 30): a Ray address that cannot be joined
fails within `--ray-connect-timeout`, naming the address and the likely cause; SIGTERM and
SIGINT stop the server at any stage of its start-up (joining Ray, starting workers) and
leave no worker behind; a malformed address is a config error. Each test runs the real
command in a subprocess on loopback (a refused port, or a socket that accepts connections
and never answers, which is how a wrong or unreachable head looks to Ray); none starts a
Ray cluster, so they are cheap. Skipped without Ray."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

pytest.importorskip("ray")

from pdserve.config import serve_defaults  # noqa: E402
from pdserve.live.ray_cluster import RaySettings  # noqa: E402
from pdserve.live.replay_client import free_port  # noqa: E402
from pdserve.worker.faults import START_DELAY_ENV  # noqa: E402

START_BOUND_S = 90.0  # the command's own start-up (imports, model) on a busy 2-core machine
STOP_BOUND_S = 15.0  # from the signal to the process's end


def test_a_malformed_ray_address_is_a_config_error_that_shows_the_form():
    for address in ("head", "head:port", "127.0.0.1:0", ":6379"):
        with pytest.raises(ValueError, match="must be HOST:PORT .* e.g. 127.0.0.1:6379"):
            RaySettings(address=address)
    with pytest.raises(ValueError, match="'connect_timeout_s' must be positive"):
        serve_defaults().with_values({"server.ray": RaySettings(), "server.ray."
                                      "connect_timeout_s": 0})
    assert RaySettings(address="[::1]:6379").address == "[::1]:6379"


@contextmanager
def silent_head() -> Iterator[int]:
    """A port that accepts TCP connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed on return: nothing listens there


class Serve:
    """`pdserve serve` in a subprocess, its log collected in a file."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.log = tmp_path / "serve.log"
        self.out = open(self.log, "w")  # noqa: SIM115 - closed in `wait`
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pdserve.cli", "serve", "--model", "tiny",
             "--kv-blocks", "64", "--port", str(free_port()), *args],
            stdout=self.out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def text(self) -> str:
        return self.log.read_text()

    def wait_for_line(self, fragment: str, timeout_s: float = START_BOUND_S) -> float:
        deadline = time.monotonic() + timeout_s
        while fragment not in self.text():
            assert self.process.poll() is None, f"exited before {fragment!r}:\n{self.text()}"
            assert time.monotonic() < deadline, f"no {fragment!r} in {timeout_s}s"
            time.sleep(0.1)
        return time.monotonic()

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
            self.out.close()


def assert_clear_failure(text: str, *fragments: str) -> None:
    for fragment in fragments:
        assert fragment in text, text
    assert "Traceback" not in text, text  # one line, not a stack


def test_a_refused_ray_address_fails_at_once_naming_it_and_the_likely_cause(tmp_path):
    port = closed_port()
    serve = Serve(tmp_path, "--ray", f"127.0.0.1:{port}", "--ray-connect-timeout", "60")
    joining = serve.wait_for_line("joining the Ray cluster")
    code = serve.wait(STOP_BOUND_S)
    assert code != 0 and time.monotonic() - joining < STOP_BOUND_S
    assert_clear_failure(serve.text(), f"could not join the Ray cluster at 127.0.0.1:{port}",
                         "connection refused", "Likely cause: no Ray head runs there",
                         "pdserve ray-local")


def test_a_silent_ray_address_fails_within_the_deadline(tmp_path):
    with silent_head() as port:
        serve = Serve(tmp_path, "--ray", f"127.0.0.1:{port}", "--ray-connect-timeout", "3")
        joining = serve.wait_for_line("joining the Ray cluster")
        code = serve.wait(3 + STOP_BOUND_S)
        took = time.monotonic() - joining
    assert code != 0 and took < 3 + STOP_BOUND_S
    assert_clear_failure(serve.text(), f"could not join the Ray cluster at 127.0.0.1:{port}",
                         "did not finish joining within 3 s (--ray-connect-timeout)",
                         "Likely causes:")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_joining_ray_stops_the_server(tmp_path, sig):
    with silent_head() as port:
        serve = Serve(tmp_path, "--ray", f"127.0.0.1:{port}", "--ray-connect-timeout", "300")
        serve.wait_for_line("joining the Ray cluster")
        time.sleep(1.0)  # inside ray.init now
        signalled = time.monotonic()
        serve.process.send_signal(sig)
        code = serve.wait(STOP_BOUND_S)
        took = time.monotonic() - signalled
    assert code != 0 and took < STOP_BOUND_S
    assert_clear_failure(serve.text(), f"start-up stopped by {sig.name}")


def test_sigterm_while_workers_start_stops_them_too(tmp_path):
    """Local worker processes, each slowed to stay in its start-up: SIGTERM there ends the
    server and every process it started."""
    serve = Serve(tmp_path, "--instances", "2", env={START_DELAY_ENV: "300"})
    serve.wait_for_line("starting 2 workers")
    server = psutil.Process(serve.process.pid)
    deadline = time.monotonic() + START_BOUND_S
    while len(server.children(recursive=True)) < 3:  # the fork server and its 2 workers
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.2)
    started = server.children(recursive=True)
    signalled = time.monotonic()
    serve.process.send_signal(signal.SIGTERM)
    code = serve.wait(STOP_BOUND_S)
    assert code != 0 and time.monotonic() - signalled < STOP_BOUND_S
    assert_clear_failure(serve.text(), "start-up stopped by SIGTERM")
    gone, alive = psutil.wait_procs(started, timeout=STOP_BOUND_S)
    assert not alive, f"left behind: {alive}"
