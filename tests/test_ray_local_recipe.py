"""The README's one-machine Ray recipe (docs/serving.md, "Past one machine"), as a newcomer
runs it: `pdserve ray-local --nodes 2` and `pdserve serve --ray 127.0.0.1:PORT` in two
processes. The cluster stays on loopback with token authentication on, the server spreads
its workers over both nodes and serves, and Ctrl-C on each leaves nothing running. Slow:
a cluster and a server from the command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import pytest

pytest.importorskip("ray")

from test_ray_cluster import quiet_port  # noqa: E402
from test_ray_local import LOOPBACK_HEX, listening_addresses  # noqa: E402

BOUND_S = 120.0


def command(*args: str, log) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    return subprocess.Popen([sys.executable, "-m", "pdserve.cli", *args], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ})


def wait_for(path, fragment: str, process: subprocess.Popen) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + BOUND_S
    while fragment not in path.read_text():
        assert process.poll() is None, path.read_text()
        assert time.monotonic() < deadline, path.read_text()
        time.sleep(0.2)


def stop(process: subprocess.Popen) -> list[psutil.Process]:
    """Ctrl-C; returns the processes it had started, to check they are gone."""
    started = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
    return started


@pytest.mark.slow
def test_the_one_machine_recipe_gives_two_nodes_and_a_server_spread_over_them(tmp_path):
    ray_port, http_port = quiet_port(), quiet_port()
    cluster_log, server_log = tmp_path / "ray-local.log", tmp_path / "serve.log"
    with open(cluster_log, "w") as log:
        cluster = command("ray-local", "--nodes", "2", "--port", str(ray_port), log=log)
    server = None
    try:
        wait_for(cluster_log, "ready", cluster)
        assert "token authentication on" in cluster_log.read_text()
        assert listening_addresses(ray_port) <= LOOPBACK_HEX
        with open(server_log, "w") as log:
            server = command("serve", "--model", "tiny", "--kv-blocks", "128", "--ray",
                             f"127.0.0.1:{ray_port}", "--instances", "4", "--port",
                             str(http_port), log=log)
        wait_for(server_log, "Application startup complete", server)
        base = f"http://127.0.0.1:{http_port}"
        health = httpx.get(f"{base}/health").json()
        assert health["status"] == "ok" and len(health["nodes"]) == 4
        assert len({node["node_id"] for node in health["nodes"].values()}) == 2
        answer = httpx.post(f"{base}/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": "Hello", "max_tokens": 8})
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 8
        text = server_log.read_text()
        assert "token authentication on" in text and "joined the Ray cluster" in text
        assert "WARNING" not in text and "Traceback" not in text, text
    finally:
        left = []
        if server is not None:
            left += stop(server)
        left += stop(cluster)
        _, alive = psutil.wait_procs(left, timeout=30)
        assert not alive, f"left running: {alive}"
