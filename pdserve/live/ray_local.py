"""`pdserve ray-local`: a Ray cluster of several nodes on this machine, on loopback only,
with token authentication on: for trying `pdserve serve --ray` and testing across nodes.

`ray start --head` and `ray start --address` cannot build one: kept on 127.0.0.1 (Ray's
"no cluster" switch) the second `ray start` refuses to join, and without the switch the
head listens on every interface. So this runs the nodes Ray's own test clusters run
(`ray.cluster_utils.Cluster`: a head and `nodes - 1` more raylets, each with its own
object store and `cpus_per_node` CPUs, all advertising 127.0.0.1), in the foreground, until
SIGINT or SIGTERM, and then stops them. Token authentication: RAY_AUTH_MODE=token (unless
set) with the token Ray keeps in ~/.ray/auth_token (made if there is none), so a server
on this machine joins with `--ray 127.0.0.1:PORT` and no further setting.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from dataclasses import dataclass
from typing import Any

from pdserve.live.ray_cluster import (
    DEFAULT_TOKEN_PATH,
    LOOPBACK,
    RAY_MISSING,
    token_at_hand,
    use_loopback,
    use_token_auth,
)

NODE_OBJECT_STORE_BYTES = 150 << 20  # per node (Ray's test-cluster default)


@dataclass(frozen=True)
class LocalClusterSettings:
    nodes: int = 2
    cpus_per_node: int = 2
    port: int = 6379  # the head's GCS port: the address is 127.0.0.1:port

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.cpus_per_node < 1:
            raise ValueError(f"ray-local needs at least one node and one CPU per node, got "
                             f"{self.nodes} nodes of {self.cpus_per_node} CPUs")
        if not 1024 <= self.port < 65536:
            raise ValueError(f"ray-local's --port must be 1024-65535, got {self.port}")


class LocalRayCluster:
    """The nodes, from `start` to `stop`."""

    def __init__(self, settings: LocalClusterSettings) -> None:
        self.settings = settings
        self._cluster: Any = None
        self.authenticated = False

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.settings.port}"

    def start(self) -> None:
        use_loopback()
        self.authenticated = use_token_auth(starting=True)
        try:
            from ray._private.authentication.authentication_token_setup import (
                ensure_token_if_auth_enabled,
            )
            from ray.cluster_utils import Cluster
        except ImportError as err:
            raise ValueError(f"{RAY_MISSING} ({err})") from err
        made = not token_at_hand()
        ensure_token_if_auth_enabled(None, create_token_if_missing=True)  # as ray.init does
        if made and self.authenticated and DEFAULT_TOKEN_PATH.is_file():
            DEFAULT_TOKEN_PATH.chmod(0o600)  # Ray writes it readable by all
        s = self.settings
        node = {"num_cpus": s.cpus_per_node, "node_ip_address": LOOPBACK,
                "object_store_memory": NODE_OBJECT_STORE_BYTES}
        self._cluster = Cluster(initialize_head=True, head_node_args={
            **node, "gcs_server_port": s.port, "include_dashboard": False})
        for _ in range(s.nodes - 1):
            self._cluster.add_node(**node)
        self._cluster.wait_for_nodes()

    def node_ids(self) -> list[str]:
        nodes = [self._cluster.head_node, *self._cluster.worker_nodes]
        return [node.node_id for node in nodes]

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None


def add_ray_local_parser(sub: argparse._SubParsersAction) -> None:
    defaults = LocalClusterSettings()
    p = sub.add_parser(
        "ray-local", help="run a Ray cluster of several nodes on this machine (loopback)",
        description="Run a Ray cluster of NODES nodes on this machine, on 127.0.0.1 only, "
        "with token authentication on, until Ctrl-C; `pdserve serve --ray 127.0.0.1:PORT` "
        "then spreads its workers over the nodes (pip install 'pdserve[ray]').")
    p.add_argument("--nodes", type=int, default=defaults.nodes,
                   help=f"nodes (raylets), the head included [{defaults.nodes}]")
    p.add_argument("--cpus-per-node", type=int, default=defaults.cpus_per_node,
                   help=f"CPUs each node offers (one per worker) [{defaults.cpus_per_node}]")
    p.add_argument("--port", type=int, default=defaults.port,
                   help=f"the head's GCS port [{defaults.port}]")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    settings = LocalClusterSettings(args.nodes, args.cpus_per_node, args.port)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda number, frame: stop.set())
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cluster = LocalRayCluster(settings)
    print(f"pdserve ray-local: starting {settings.nodes} nodes of {settings.cpus_per_node} "
          f"CPUs on {LOOPBACK}", flush=True)
    try:
        cluster.start()
        auth = (f"on (token in {token_at_hand()})" if cluster.authenticated
                else "off (RAY_AUTH_MODE says so)")
        print(f"pdserve ray-local: ready: {settings.nodes} nodes at {cluster.address}, "
              f"{settings.nodes * settings.cpus_per_node} CPUs, token authentication {auth}\n"
              f"  serve on it:  pdserve serve --ray {cluster.address} --instances "
              f"{settings.nodes * settings.cpus_per_node}\n"
              f"  Ctrl-C stops the cluster", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        print("pdserve ray-local: stopping", flush=True)
        cluster.stop()
    return 0
