"""The global scheduler: pure logic from events and a cluster view to actions.

It owns the role table and the policy's components, and nothing else: no clock, no I/O, no
knowledge of whether the instances are simulated. Both drivers call `handle` for every event
and apply the returned actions in order.

Admission: a request whose prompt plus output cannot fit in the KV memory of any instance is
rejected at arrival (it would otherwise wait forever); so is any request when no instance
can take prefills.
"""

from __future__ import annotations

from pdserve.cluster.messages import (
    Action,
    Arrival,
    ClusterView,
    DispatchDecode,
    DispatchPrefill,
    Event,
    Finished,
    InstanceFailed,
    PrefillDone,
    Reject,
    Tick,
)
from pdserve.cluster.roles import RoleBoard
from pdserve.policies.base import Policy
from pdserve.types import KV_BLOCK_TOKENS, Request, Role, blocks_for


class GlobalScheduler:
    def __init__(self, policy: Policy, num_instances: int) -> None:
        self.policy = policy
        self.board = RoleBoard(policy.role_manager.initial_roles(num_instances))
        self._handlers = {
            Arrival: self._on_arrival,
            PrefillDone: self._on_prefill_done,
            Finished: self._on_finished,
            Tick: self._on_tick,
            InstanceFailed: self._on_failed,
        }

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
        instance = self.policy.prefill_router.route(request, view, self.board)
        return [DispatchPrefill(request, instance)]

    def _admission_error(self, request: Request, view: ClusterView) -> str:
        if not self.board.prefill_candidates or not self.board.decode_candidates:
            return "no instance is available to serve the request"
        capacity = max(view.instances[i].total_blocks for i in self.board.decode_candidates)
        needed = blocks_for(request.input_tokens + request.output_tokens)
        if needed > capacity:
            return (f"prompt ({request.input_tokens} tokens) plus output "
                    f"({request.output_tokens} tokens) exceeds the KV capacity of every "
                    f"instance ({capacity * KV_BLOCK_TOKENS} tokens)")
        return ""

    def _on_prefill_done(self, event: PrefillDone, view: ClusterView) -> list[Action]:
        self.policy.role_manager.on_progress(event.instance_id, view, self.board)
        target = self.policy.decode_router.route(event.request, event.instance_id, view,
                                                 self.board)
        return [DispatchDecode(event.request, event.instance_id, target)]

    def _on_finished(self, event: Finished, view: ClusterView) -> list[Action]:
        self.policy.role_manager.on_progress(event.instance_id, view, self.board)
        return []

    def _on_tick(self, event: Tick, view: ClusterView) -> list[Action]:
        return [*self.policy.role_manager.on_tick(view, self.board),
                *self.policy.rebalancer.on_tick(view, self.board)]

    def _on_failed(self, event: InstanceFailed, view: ClusterView) -> list[Action]:
        self.board.mark_failed(event.instance_id)
        return []
