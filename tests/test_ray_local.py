"""`pdserve serve --ray` without an address: a local Ray instance of this server's own, on
loopback only, serving through Ray-hosted workers and stopped with the server. Skipped
without Ray."""

from __future__ import annotations

import threading

import pytest

ray = pytest.importorskip("ray")

from server_helpers import running_server  # noqa: E402
from test_ray_cluster import quiet_port  # noqa: E402
from test_server import PROMPT, local_greedy  # noqa: E402
from test_server_faults import stream_text  # noqa: E402

from pdserve.live.ray_cluster import LOOPBACK, RaySettings  # noqa: E402

LOOPBACK_HEX = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, v4-mapped


def listening_addresses(port: int) -> set[str]:
    """Local addresses (kernel hex) with a listening TCP socket on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


def test_a_local_ray_instance_on_loopback_serves_and_stops_with_the_server(tmp_path):
    assert not ray.is_initialized()
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 1,
                                   "engine.kv_blocks": 128, "server.ray": RaySettings(),
                                   "server.port": quiet_port()}) as (base, driver):
        assert ray.is_initialized() and driver.workers.session.owned
        assert {node["NodeManagerAddress"] for node in ray.nodes()} == {LOOPBACK}
        assert ray.cluster_resources()["CPU"] == 2  # explicit: one per worker
        gcs_host, gcs_port = ray.get_runtime_context().gcs_address.rsplit(":", 1)
        assert gcs_host == LOOPBACK
        bound = listening_addresses(int(gcs_port))
        assert bound and bound <= LOOPBACK_HEX
        out: dict = {}
        stream_text(base, 24, threading.Event(), out)
        assert out["error"] is None and out["text"] == local_greedy(PROMPT, 24)
        assert driver.workers.node_of(0) == driver.workers.node_of(1)  # one node: shm path
    assert not ray.is_initialized()  # stopped with the server
