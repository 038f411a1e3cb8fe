"""What flows into the global scheduler: events, and the cluster view it decides on.

Both drivers, simulated and live, produce the same events (`cluster/actions.py` holds what
flows out).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.cluster.topology import Topology
from pdserve.instance.stats import InstanceLoad
from pdserve.perf.fitted import PerfModel
from pdserve.types import Request


# Built per request on the simulator's hot path, so not frozen (a frozen dataclass's
# __init__ costs 2.6x a plain one's, `docs/results/sim_speed.md`); never modified after
# construction, and hashable as when frozen.
@dataclass(slots=True, unsafe_hash=True)
class Arrival:
    request: Request


@dataclass(slots=True, unsafe_hash=True)
class PrefillDone:
    """A request's first prefill finished on `instance_id`; its KV is held there."""

    request: Request
    instance_id: int


@dataclass(slots=True, unsafe_hash=True)
class Finished:
    request: Request
    instance_id: int


@dataclass(frozen=True, slots=True)
class Tick:
    """The periodic monitor tick."""


@dataclass(frozen=True, slots=True)
class InstanceFailed:
    instance_id: int


@dataclass(frozen=True, slots=True)
class InstanceRecovered:
    """A failed instance is back (restarted, empty) with the role it had."""

    instance_id: int


@dataclass(frozen=True, slots=True)
class InstanceStarted:
    """An instance a `StartInstance` asked for is up and empty: the world's start-up time
    (a simulated delay, or a real worker loading its weights) has passed."""

    instance_id: int


@dataclass(frozen=True, slots=True)
class PerfModelChanged:
    """The performance model the policies read is now `perf` (a live server's start-up
    profile finished, replacing the provisional model it started on)."""

    perf: PerfModel


Event = (Arrival | PrefillDone | Finished | Tick | InstanceFailed | InstanceRecovered
         | InstanceStarted | PerfModelChanged)


@dataclass(slots=True)
class ClusterView:
    """The cluster as the global scheduler sees it: a time and each instance's load.

    `instances[i]` is instance i. Drivers may reuse one view and update it in place.
    `topology`, when the driver knows it, prices a KV transfer between two instances
    (`topology.transfer_time_s(a, b, bytes)`) for policies' cost estimates."""

    now_s: float
    instances: Sequence[InstanceLoad]
    topology: Topology | None = None
