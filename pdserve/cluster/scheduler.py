"""The global scheduler: pure logic from events and a cluster view to actions.

It owns the role table and the policy's components, and nothing else: no clock, no I/O, no
knowledge of whether the instances are simulated. Both drivers call `handle` for every event
and apply the returned actions in order.

Admission: a request whose prompt plus output cannot fit in the KV memory of any instance is
rejected at arrival (it would otherwise wait forever); so is any request when no instance
can take prefills.

Failures: a failed instance leaves the pools; `PhaseCoverage` then moves a live instance if
a phase has none left, and undoes such moves when the instance recovers
(`InstanceRecovered`), so every policy keeps serving while any instance lives. A router
whose own pools are empty (its answer is not a live instance of the phase) falls back to the
least-loaded candidate of the phase.

A new performance model (`PerfModelChanged`: a live server switching from its provisional
model to the profiled one) reaches every policy component that reads one
(`Policy.use_perf_model`); the roles, pools and every component's own state stay as they
are, so only decisions made after the event differ.

Elastic scaling: an instance whose first role is `RESERVE` starts stopped (the first
actions stop it: a live driver never starts its worker); a policy starts and stops
instances through the role board, and a started instance is announced by the driver's
`InstanceStarted`, which the role manager sees through `on_progress`.
"""

from __future__ import annotations

from pdserve.cluster.actions import (
    Action,
    DispatchDecode,
    DispatchPrefill,
    Reject,
    SetChunkSize,
    StopInstance,
)
from pdserve.cluster.coverage import PhaseCoverage
from pdserve.cluster.events import (
    Arrival,
    ClusterView,
    Event,
    Finished,
    InstanceFailed,
    InstanceRecovered,
    InstanceStarted,
    PerfModelChanged,
    PrefillDone,
    Tick,
)
from pdserve.cluster.roles import RoleBoard
from pdserve.policies.base import Policy, RejectRequest
from pdserve.types import KV_BLOCK_TOKENS, Request, Role, blocks_for


class GlobalScheduler:
    def __init__(self, policy: Policy, num_instances: int) -> None:
        self.policy = policy
        self.board = RoleBoard(policy.role_manager.initial_roles(num_instances))
        self.coverage = PhaseCoverage()
        # a rebalancer that follows decodes (ARES) hears where each one was dispatched
        self._decode_observer = getattr(policy.rebalancer, "on_decode", None)
        self._handlers = {
            Arrival: self._on_arrival,
            PrefillDone: self._on_prefill_done,
            Finished: self._on_finished,
            Tick: self._on_tick,
            InstanceFailed: self._on_failed,
            InstanceRecovered: self._on_recovered,
            InstanceStarted: self._on_started,
            PerfModelChanged: self._on_perf_model,
        }
        self.board.stopped.update(i for i, role in enumerate(self.board.roles)
                                  if role is Role.RESERVE)

    def initial_actions(self) -> list[Action]:
        """What drivers apply before the first event: reserve instances stopped, the
        policy's per-instance chunk sizes."""
        stops: list[Action] = [StopInstance(i, "reserve: held back for elastic scaling")
                               for i in sorted(self.board.stopped)]
        return [*stops, *self._chunk_sizes()]

    def _chunk_sizes(self) -> list[Action]:
        return [SetChunkSize(i, chunk) for i, chunk in enumerate(self.policy.chunk_sizes_tokens)
                if chunk > 0]

    @property
    def roles(self) -> list[Role]:
        return self.board.roles

    def handle(self, event: Event, view: ClusterView) -> list[Action]:
        actions = self._handlers[type(event)](event, view)
        changes = self.board.take_changes()
        return [*changes, *actions] if changes else actions

    def _on_arrival(self, event: Arrival, view: ClusterView) -> list[Action]:
        request = event.request
        reason = self._admission_error(request, view)
        if reason:
            return [Reject(request, reason)]
        try:
            instance = self.policy.prefill_router.route(request, view, self.board)
        except RejectRequest as refusal:
            return [Reject(request, refusal.reason, overloaded=True)]
        if not self._serves(instance, prefill=True):
            instance = min(self.board.prefill_candidates,
                           key=lambda i: view.instances[i].prefill_queue_tokens)
        return [DispatchPrefill(request, instance)]

    def _serves(self, instance: int, prefill: bool) -> bool:
        board = self.board
        if not (board.failed or self.coverage.moved) and instance >= 0:
            return True  # no failure, no coverage move: the router's own pools are right
        if not 0 <= instance < len(board.roles) or instance in board.failed:
            return False
        role = board.roles[instance]
        return role.takes_prefill if prefill else role.takes_decode

    def _admission_error(self, request: Request, view: ClusterView) -> str:
        board = self.board
        if not board.prefill_candidates or not board.decode_candidates:
            return "no instance is available to serve the request"
        instances = view.instances
        needed = blocks_for(request.input_tokens + request.output_tokens)
        for i in board.decode_candidates:
            if instances[i].total_blocks >= needed:
                return ""  # fits somewhere (the largest capacity matters only for the reason)
        capacity = max(instances[i].total_blocks for i in board.decode_candidates)
        return (f"prompt ({request.input_tokens} tokens) plus output "
                f"({request.output_tokens} tokens) exceeds the KV capacity of every "
                f"instance ({capacity * KV_BLOCK_TOKENS} tokens)")

    def _on_prefill_done(self, event: PrefillDone, view: ClusterView) -> list[Action]:
        self.policy.role_manager.on_progress(event.instance_id, view, self.board)
        target = self.policy.decode_router.route(event.request, event.instance_id, view,
                                                 self.board)
        if not self._serves(target, prefill=False):
            if not self.board.decode_candidates:
                return [Reject(event.request, "no instance is available to serve the request")]
            target = event.instance_id if self._serves(event.instance_id, prefill=False) \
                else min(self.board.decode_candidates,
                         key=lambda i: view.instances[i].running_tokens)
        if self._decode_observer is not None:
            self._decode_observer(event.request, target)
        return [DispatchDecode(event.request, event.instance_id, target)]

    def _on_finished(self, event: Finished, view: ClusterView) -> list[Action]:
        self.policy.role_manager.on_progress(event.instance_id, view, self.board)
        return []

    def _on_tick(self, event: Tick, view: ClusterView) -> list[Action]:
        return [*self.policy.role_manager.on_tick(view, self.board),
                *self.policy.rebalancer.on_tick(view, self.board)]

    def _on_failed(self, event: InstanceFailed, view: ClusterView) -> list[Action]:
        self.coverage.on_failed(event.instance_id, self.board)
        self.board.mark_failed(event.instance_id)
        self.coverage.ensure(view, self.board, f"instance {event.instance_id} failed")
        return []

    def _on_recovered(self, event: InstanceRecovered, view: ClusterView) -> list[Action]:
        self.board.mark_recovered(event.instance_id)
        self.coverage.on_recovered(event.instance_id, view, self.board)
        self.coverage.ensure(view, self.board, f"instance {event.instance_id} recovered")
        return self._own_chunk_size(event.instance_id)

    def _on_started(self, event: InstanceStarted, view: ClusterView) -> list[Action]:
        self.board.mark_started(event.instance_id)
        self.policy.role_manager.on_progress(event.instance_id, view, self.board)
        return self._own_chunk_size(event.instance_id)

    def _on_perf_model(self, event: PerfModelChanged, view: ClusterView) -> list[Action]:
        self.policy.use_perf_model(event.perf)
        return []

    def _own_chunk_size(self, instance_id: int) -> list[Action]:
        """A (re)started instance runs the driver's chunk size: give it its own again."""
        return [a for a in self._chunk_sizes()
                if isinstance(a, SetChunkSize) and a.instance_id == instance_id]
