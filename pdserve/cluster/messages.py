"""What flows into the global scheduler (events) and out of it (actions).

Both drivers, simulated and live, produce the same events and apply the same actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pdserve.cluster.topology import Topology
from pdserve.instance.phase_priority import PhasePriority
from pdserve.instance.stats import InstanceLoad
from pdserve.types import Request, Role

# ---- events ----


@dataclass(frozen=True, slots=True)
class Arrival:
    request: Request


@dataclass(frozen=True, slots=True)
class PrefillDone:
    """A request's first prefill finished on `instance_id`; its KV is held there."""

    request: Request
    instance_id: int


@dataclass(frozen=True, slots=True)
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


Event = (Arrival | PrefillDone | Finished | Tick | InstanceFailed | InstanceRecovered
         | InstanceStarted)

# ---- actions ----


@dataclass(frozen=True, slots=True)
class DispatchPrefill:
    request: Request
    instance_id: int


@dataclass(frozen=True, slots=True)
class DispatchDecode:
    """Continue `request` on `target_id`; its KV moves there unless target == source."""

    request: Request
    source_id: int
    target_id: int


@dataclass(frozen=True, slots=True)
class Reject:
    """`overloaded`: refused for load, not for the request itself (early rejection; the
    live server answers 429, retry later)."""

    request: Request
    reason: str
    overloaded: bool = False


@dataclass(frozen=True, slots=True)
class SetRole:
    """`instance_id` now takes the work of `role`; `reason` says which rule decided it."""

    instance_id: int
    role: Role
    reason: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class SetChunkSize:
    instance_id: int
    chunk_size_tokens: int


@dataclass(frozen=True, slots=True)
class SetPhasePriority:
    """`instance_id`'s local scheduler serves `priority` first (`instance.phase_priority`);
    `reason` says which rule decided it."""

    instance_id: int
    priority: PhasePriority
    reason: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move a running decode and its KV from `source_id` to `target_id`: it leaves the
    source's batch at the next step boundary and continues on the target with no gap and no
    repeated token. Ignored if the request is not decoding on the source by then.
    `reason` says which rule decided it."""

    request: Request
    source_id: int
    target_id: int
    reason: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class StartInstance:
    """Bring a stopped instance up (elastic scaling); the driver answers `InstanceStarted`
    once it serves. `reason` says which rule decided it."""

    instance_id: int
    reason: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class StopInstance:
    """Stop an instance that holds no work (elastic scaling; a reserve at start-up): the
    simulator stops counting its time, the live driver ends its worker process and frees
    its KV pool. `reason` says which rule decided it."""

    instance_id: int
    reason: str = field(default="", compare=False)


Action = (DispatchPrefill | DispatchDecode | Reject | SetRole | SetChunkSize | Migrate
          | SetPhasePriority | StartInstance | StopInstance)


@dataclass(slots=True)
class ClusterView:
    """The cluster as the global scheduler sees it: a time and each instance's load.

    `instances[i]` is instance i. Drivers may reuse one view and update it in place.
    `topology`, when the driver knows it, prices a KV transfer between two instances
    (`topology.transfer_time_s(a, b, bytes)`) for policies' cost estimates."""

    now_s: float
    instances: Sequence[InstanceLoad]
    topology: Topology | None = None
