"""What flows out of the global scheduler: actions, each a decision about the cluster.

Both drivers, simulated and live, apply the same actions. Decisions that change the cluster
(roles, migrations, starts and stops, phase priorities) carry a `reason` that tests, logs and
the dashboard read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.instance.phase_priority import PhasePriority
from pdserve.types import Request, Role


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
