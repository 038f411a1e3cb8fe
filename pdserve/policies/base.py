"""Interfaces of policy components and the `Policy` that composes them.

A policy is one of each component (DESIGN.md, "Policies are compositions"):
  PrefillRouter  which instance runs a request's prefill
  DecodeRouter   where decode continues after prefill (in place or elsewhere)
  RoleManager    the initial roles and any flips on a monitor tick
  Rebalancer     moves of running decodes on a monitor tick
  QueueOrder     order inside each instance's prefill queue (applied by the local scheduler)
Components are pure: they read the `ClusterView` and the `RoleBoard`, keep their own small
state, and never read a clock or do I/O.

A component whose decisions read the performance model (a router's queue-time estimate,
Arrow's TTFT predictor, ...) defines `use_perf_model(perf)` (`PerfModelUser`): a live
server that starts on a provisional model hands it the profiled one when that is ready
(`Policy.use_perf_model`). It re-derives what it derived from the model and keeps all other
state. Components that share a context forward to it; the context re-derives once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from pdserve.cluster.actions import Action
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.decode_forecast import ForecastSettings
from pdserve.instance.phase_priority import PhasePriority
from pdserve.instance.queue_order import FCFSOrder, QueueOrder
from pdserve.perf.fitted import PerfModel
from pdserve.types import Request, Role


class RejectRequest(Exception):
    """A prefill router refuses a request for load (early rejection); the scheduler answers
    `Reject(request, reason, overloaded=True)`."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PrefillRouter(Protocol):
    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        """Instance id for `request`'s prefill, among `board.prefill_candidates`."""
        ...


class DecodeRouter(Protocol):
    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        """Instance id where `request` decodes; `prefill_instance` means in place."""
        ...


class RoleManager(Protocol):
    def initial_roles(self, num_instances: int) -> list[Role]: ...

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]: ...

    def on_progress(self, instance_id: int, view: ClusterView, board: RoleBoard) -> None:
        """An instance finished a prefill or a request (its work shrank)."""
        ...


class Rebalancer(Protocol):
    """Moves running decodes on ticks. One that follows decodes may also define
    `on_decode(request, instance_id)`: the scheduler then calls it on every decode
    dispatch (ARES learns its `Request` objects that way, whatever the routers)."""

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]: ...


class PerfModelUser(Protocol):
    """A component (or a context components share) whose decisions read the performance
    model."""

    def use_perf_model(self, perf: PerfModel) -> None:
        """Read `perf` from now on; keep every other piece of state."""
        ...


class NoRebalancing:
    """Running decodes stay where they are."""

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        return []


@dataclass
class Policy:
    name: str
    prefill_router: PrefillRouter
    decode_router: DecodeRouter
    role_manager: RoleManager
    rebalancer: Rebalancer = field(default_factory=NoRebalancing)
    queue_order: Callable[[], QueueOrder] = FCFSOrder
    phase_priority: PhasePriority = PhasePriority.DECODE_FIRST  # every local scheduler's
    chunk_sizes_tokens: tuple[int, ...] = ()  # per instance; 0 or absent: the driver's
    # ARES: instances keep a decode-load forecast (`instance/decode_forecast.py`) for the
    # rebalancer; None (every other policy) costs the instances nothing
    decode_forecast: ForecastSettings | None = None

    def use_perf_model(self, perf: PerfModel) -> None:
        """Every component that reads the performance model (`PerfModelUser`) reads `perf`
        from now on; each component once, whatever it is shared as. The queue order is the
        instances' (a live driver sends them the model)."""
        components = {id(c): c for c in (self.prefill_router, self.decode_router,
                                          self.role_manager, self.rebalancer)}
        for component in components.values():
            use = getattr(component, "use_perf_model", None)
            if use is not None:
                use(perf)
