"""What flows out of the global scheduler: actions, each a decision about the cluster, and
the one contract by which both worlds carry them out.

Decisions that change the cluster (roles, migrations, starts and stops, phase priorities)
carry a `reason` that tests, logs and the dashboard read. `World` is the contract: a method
per action, implemented by the simulator and by the live driver; `apply_actions` is the one
function that applies a list of actions to a world, taking the decisions both worlds share
on the way (where a session round's history comes from: `cluster/sessions.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pdserve.cluster.history import ClusterHistory, DecisionKind
from pdserve.cluster.sessions import HistorySource, history_source
from pdserve.instance.phase_priority import PhasePriority
from pdserve.types import Request, Role

# read per dispatch: an enum member's lookup on its class is a descriptor call in 3.11
_NO_HISTORY = HistorySource.NONE


# Built per request on the simulator's hot path, so not frozen (a frozen dataclass's
# __init__ costs 2.6x a plain one's, `docs/results/sim_speed.md`); never modified after
# construction, and hashable as when frozen.
@dataclass(slots=True, unsafe_hash=True)
class DispatchPrefill:
    request: Request
    instance_id: int


@dataclass(slots=True, unsafe_hash=True)
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
    """`instance_id`'s per-step token budget becomes `chunk_size_tokens` (TaiChi's S_P/S_D)."""

    instance_id: int
    chunk_size_tokens: int

    def __post_init__(self) -> None:  # a bad action fails in the policy, not in a worker
        if self.chunk_size_tokens <= 0:
            raise ValueError(f"chunk_size_tokens must be positive, got {self.chunk_size_tokens}")


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


class World(Protocol):
    """What a driver does to carry out each action: a method per action. The simulator
    (`sim/simulator.py`) and the live driver (`live/driver.py`) implement it; `apply_actions`
    is the one place that turns actions into these calls, so an action added here and not
    carried out by a world is a type error (and `tests/test_actions.py` checks both worlds at
    run time)."""

    def serving(self, instance_id: int) -> bool:
        """Whether the instance is up (not stopped, not failed)."""

    def dispatch_prefill(self, action: DispatchPrefill, history: HistorySource) -> None:
        """Queue the prefill on its instance; `history` says where a session round's
        history KV comes from (`cluster/sessions.py`)."""

    def dispatch_decode(self, action: DispatchDecode) -> None:
        """Continue the prefilled request on the target: in place, or its KV sent there."""

    def reject(self, action: Reject) -> None:
        """End the request unserved, with the reason."""

    def set_role(self, action: SetRole) -> None:
        """Record the instance's new role (the scheduler's board already has it)."""

    def set_chunk_size(self, action: SetChunkSize) -> None:
        """The instance's per-step token budget."""

    def set_phase_priority(self, action: SetPhasePriority) -> None:
        """Which phase the instance's local scheduler serves first."""

    def migrate(self, action: Migrate) -> None:
        """Move a running decode and its KV at the source's next step boundary."""

    def start_instance(self, action: StartInstance) -> None:
        """Bring a stopped instance up; announce `InstanceStarted` once it serves."""

    def stop_instance(self, action: StopInstance) -> None:
        """Stop an instance that holds no work."""


def apply_actions(actions: Iterable[Action], world: World, roles: Sequence[Role],
                  history: ClusterHistory | None = None, now_s: float = 0.0) -> None:
    """Carry out the scheduler's actions in order. `roles`: the instances' roles as the
    scheduler's board has them now (a dispatched session round's history decision needs
    its instance's role). `history`: where the decisions that change the cluster are
    logged, at `now_s` on the world's clock (`cluster/history.py`)."""
    for action in actions:
        kind = type(action)
        if kind is DispatchPrefill:
            request, instance = action.request, action.instance_id  # type: ignore[union-attr]
            world.dispatch_prefill(action, history_source(  # type: ignore[arg-type]
                request, instance, roles[instance], world.serving(request.home_instance))
                if request.history_tokens > 0 else _NO_HISTORY)
        elif kind is DispatchDecode:
            world.dispatch_decode(action)  # type: ignore[arg-type]
        elif kind is SetChunkSize:
            world.set_chunk_size(action)  # type: ignore[arg-type]
        else:  # a decision that changes the cluster: logged, then carried out
            if history is not None:
                _record(history, action, now_s)
            if kind is Reject:
                world.reject(action)  # type: ignore[arg-type]
            elif kind is SetRole:
                world.set_role(action)  # type: ignore[arg-type]
            elif kind is SetPhasePriority:
                world.set_phase_priority(action)  # type: ignore[arg-type]
            elif kind is Migrate:
                world.migrate(action)  # type: ignore[arg-type]
            elif kind is StartInstance:
                world.start_instance(action)  # type: ignore[arg-type]
            elif kind is StopInstance:
                world.stop_instance(action)  # type: ignore[arg-type]
            else:
                raise ValueError(f"no world can apply {kind.__name__}")


def _record(history: ClusterHistory, action: Action, now_s: float) -> None:
    """The one mapping of an action to its decision-log entry."""
    if isinstance(action, SetRole):
        history.record(now_s, DecisionKind.FLIP, action.instance_id, action.reason,
                       role=action.role)
    elif isinstance(action, Migrate):
        history.record(now_s, DecisionKind.MIGRATE, action.source_id, action.reason,
                       target_id=action.target_id, request_id=action.request.request_id)
    elif isinstance(action, Reject):
        history.record(now_s, DecisionKind.REJECT, action.request.prefill_instance,
                       action.reason, request_id=action.request.request_id)
    elif isinstance(action, StopInstance):
        history.record(now_s, DecisionKind.STOP, action.instance_id, action.reason)
    elif isinstance(action, StartInstance):
        history.record(now_s, DecisionKind.START, action.instance_id, action.reason)
    elif isinstance(action, SetPhasePriority):
        history.record(now_s, DecisionKind.PRIORITY, action.instance_id,
                       f"{action.priority.value} first: {action.reason}")
    # anything else is not an action: apply_actions refuses it
