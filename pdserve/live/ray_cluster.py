"""Where Ray-hosted workers run: the settings of `pdserve serve --ray [ADDRESS]` and the
environment Ray reads (loopback, token authentication). `ray_session.py` joins or starts
Ray with them.

Without an address a local Ray instance is started for this server alone, on loopback: Ray
advertises 127.0.0.1 as the node's address, so its GCS, raylet and object manager listen on
127.0.0.1 only (Ray turns 127.0.0.1 into the host's outward address unless its
"no cluster" switch is set, which `use_loopback` sets for this process and its children;
it is set too when joining a cluster at a loopback address, so that address is the one
tried). Token authentication is on unless RAY_AUTH_MODE says otherwise (`use_token_auth`).
Imports `ray` only when a server starts on it, so the default install does not need it.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

KV_TRANSPORTS = ("tcp", "object-store")  # between nodes (`ray_kv.py`)
LOOPBACK = "127.0.0.1"
RAY_MISSING = "--ray needs Ray: pip install 'pdserve[ray]'"
AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray's: "token" or "disabled"
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"  # Ray's, in its order
DEFAULT_TOKEN_PATH = Path.home() / ".ray" / "auth_token"  # Ray's (`ray get-auth-token`)


@dataclass(frozen=True)
class RaySettings:
    address: str = ""  # a running cluster's HOST:PORT (its GCS); "": a local instance
    connect_timeout_s: float = 30.0  # joining `address` fails with a clear error past this
    num_cpus: int = 0  # the local instance's CPUs; 0: what the workers need
    cpus_per_worker: float = 1.0  # each worker loop runs one torch thread
    gpus_per_worker: float = 1.0  # when the engines run on a GPU (fractions share one)
    kv_transport: str = "tcp"  # between nodes: "tcp" (the KV stream) or "object-store"
    namespace: str = "pdserve"
    # a custom resource each instance's actor needs (one per instance, or none): pins
    # instances to labelled nodes; otherwise actors are spread over the nodes
    instance_resources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.address:
            parse_address(self.address)  # raises, saying what an address looks like
        if not self.connect_timeout_s > 0:
            raise ValueError(f"ray setting 'connect_timeout_s' must be positive, got "
                             f"{self.connect_timeout_s}")
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


def parse_address(address: str) -> tuple[str, int]:
    """(host, port) of a cluster address HOST:PORT (an IPv6 host in brackets)."""
    host, sep, port = address.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"ray setting 'address' must be HOST:PORT of the cluster's head "
                         f"(its GCS port, 6379 unless `ray start --head --port` said "
                         f"otherwise), e.g. 127.0.0.1:6379; got {address!r}")
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_at_hand() -> str:
    """Where Ray would find an authentication token here (the first of RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH's file and ~/.ray/auth_token), or "" if nowhere."""
    if os.environ.get(TOKEN_ENV):
        return f"${TOKEN_ENV}"
    path = Path(os.environ.get(TOKEN_PATH_ENV) or DEFAULT_TOKEN_PATH).expanduser()
    return str(path) if path.is_file() and path.read_text().strip() else ""


def use_token_auth(starting: bool) -> bool:
    """Turn Ray's token authentication on for this process and the Ray processes it
    starts, unless RAY_AUTH_MODE is set already (then it is respected): always for a Ray
    instance started here (Ray then makes a token if there is none), and when joining a
    cluster if a token is at hand (a cluster without authentication accepts it too).
    Returns whether it is on."""
    if AUTH_MODE_ENV not in os.environ and (starting or token_at_hand()):
        os.environ[AUTH_MODE_ENV] = "token"
        from ray._raylet import Config

        Config.initialize("")  # Ray's cached config reads the mode again (as Ray does)
    return os.environ.get(AUTH_MODE_ENV, "").lower() == "token"


def use_loopback() -> None:
    """Make Ray keep 127.0.0.1 as this node's address (for this process and the Ray
    processes it starts), and report no usage statistics."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by ray at import
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray._private.ray_constants as constants

    constants.ENABLE_RAY_CLUSTER = False  # in case ray was imported already
