"""Where Ray-hosted workers run: the settings of `pdserve serve --ray [ADDRESS]` and the
connection to a Ray cluster (an existing one, or a local instance started here).

Without an address a local Ray instance is started for this server alone, on loopback: Ray
advertises 127.0.0.1 as the node's address, so its GCS, raylet and object manager listen on
127.0.0.1 only (Ray turns 127.0.0.1 into the host's outward address unless its
"no cluster" switch is set, which `use_loopback` sets for this process and its children),
with an explicit CPU count, no dashboard and no usage reporting; it is stopped on shutdown.
Ray's token authentication (its default) stays on. A Ray that this process already joined
(`ray.init` before the server starts, as the tests do) is used as it is and left running.
Imports `ray` only when a server starts on it, so the default install does not need it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

KV_TRANSPORTS = ("tcp", "object-store")  # between nodes (`ray_kv.py`)
LOOPBACK = "127.0.0.1"
RAY_MISSING = "--ray needs Ray: pip install 'pdserve[ray]'"


@dataclass(frozen=True)
class RaySettings:
    address: str = ""  # a running cluster's GCS address; "": a local instance on loopback
    num_cpus: int = 0  # the local instance's CPUs; 0: what the workers need
    cpus_per_worker: float = 1.0  # each worker loop runs one torch thread
    gpus_per_worker: float = 1.0  # when the engines run on a GPU (fractions share one)
    kv_transport: str = "tcp"  # between nodes: "tcp" (the KV stream) or "object-store"
    namespace: str = "pdserve"
    # a custom resource each instance's actor needs (one per instance, or none): pins
    # instances to labelled nodes; otherwise actors are spread over the nodes
    instance_resources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.num_cpus < 0:
            raise ValueError(f"ray setting 'num_cpus' must not be negative, got {self.num_cpus}")
        if not self.cpus_per_worker > 0:
            raise ValueError(f"ray setting 'cpus_per_worker' must be positive, got "
                             f"{self.cpus_per_worker}")
        if self.gpus_per_worker < 0:
            raise ValueError(f"ray setting 'gpus_per_worker' must not be negative, got "
                             f"{self.gpus_per_worker}")
        if self.kv_transport not in KV_TRANSPORTS:
            raise ValueError(f"ray setting 'kv_transport' must be one of {KV_TRANSPORTS}, "
                             f"got {self.kv_transport!r}")

    def resources_of(self, instance: int) -> dict[str, float]:
        if not self.instance_resources:
            return {}
        named = len(self.instance_resources)
        if instance >= named:
            raise ValueError(f"ray setting 'instance_resources' names {named} instances; "
                             f"instance {instance} has none")
        return {self.instance_resources[instance]: 0.001}


def use_loopback() -> None:
    """Make Ray keep 127.0.0.1 as this node's address (for this process and the Ray
    processes it starts), and report no usage statistics."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by ray at import
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray._private.ray_constants as constants

    constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported already


class RaySession:
    """This server's hold on Ray: `open` joins or starts it, `close` stops what it started."""

    def __init__(self, settings: RaySettings, cpus_needed: float) -> None:
        self.settings = settings
        self.cpus_needed = cpus_needed
        self.owned = False

    def open(self) -> None:
        try:
            import ray
        except ImportError as err:
            raise RuntimeError(f"{RAY_MISSING} ({err})") from err
        if ray.is_initialized():
            return
        if self.settings.address:
            ray.init(address=self.settings.address, namespace=self.settings.namespace)
            return
        use_loopback()
        cpus = self.settings.num_cpus or max(1, round(self.cpus_needed + 0.499))
        ray.init(num_cpus=cpus, include_dashboard=False, _node_ip_address=LOOPBACK,
                 namespace=self.settings.namespace, configure_logging=False)
        self.owned = True

    @property
    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def close(self) -> None:
        if self.owned:
            import ray

            ray.shutdown()
            self.owned = False
