"""How the simulator carries out the global scheduler's actions: dispatches (a prefill
queued at its instance, a decode continued in place or its KV sent), rejections, role and
chunk changes, migrations (at the source's next step boundary), instance starts and stops.
A mixin of `Simulator`, which owns the state it reads and writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pdserve.cluster.actions import (
    Action,
    DispatchDecode,
    DispatchPrefill,
    Migrate,
    Reject,
    SetChunkSize,
    SetPhasePriority,
    SetRole,
    StartInstance,
    StopInstance,
)
from pdserve.sim.records import RoleChange

if TYPE_CHECKING:
    from collections.abc import Callable

    from pdserve.cluster.events import ClusterView
    from pdserve.cluster.scheduler import GlobalScheduler
    from pdserve.sim.instance import SimInstance
    from pdserve.sim.sessions import SessionKV, SessionRounds
    from pdserve.types import Request


class ActionApplier:
    # the simulator's state this part reads and writes
    instances: list[SimInstance]
    view: ClusterView
    scheduler: GlobalScheduler
    _session_kv: SessionKV
    _rounds: SessionRounds
    _role_changes: list[RoleChange]
    _migrations: dict[int, Migrate]
    _outstanding: int
    _completed: int

    # the simulator's other parts this one calls (annotations only: nothing here shadows them)
    _touch: Callable[[SimInstance], None]
    _start_history_reads: Callable[[SimInstance], None]
    _start_migrations: Callable[[SimInstance], None]
    _stop_instance: Callable[[int, str], None]
    _start_instance: Callable[[int, str], None]
    _send_kv: Callable[[Request, int, int], None]

    def _apply(self, actions: list[Action]) -> None:
        now = self.view.now_s
        for action in actions:
            if type(action) is DispatchPrefill:
                instance = self.instances[action.instance_id]
                action.request.prefill_instance = action.instance_id
                if action.request.home_instance >= 0:
                    self._session_kv.on_dispatch_prefill(
                        action.request, action.instance_id,
                        self.scheduler.roles[action.instance_id])
                self._touch(instance)
                instance.local.enqueue_prefill(action.request)
                if instance.local.history_reads and instance.plan is not None:
                    self._start_history_reads(instance)  # idle ones start when kicked
            elif type(action) is DispatchDecode:
                self._dispatch_decode(action)
            elif type(action) is Reject:
                action.request.rejected_reason = action.reason
                self._outstanding -= 1
                self._completed += 1
                if action.request.home_instance >= 0:  # its history is no longer needed
                    self._session_kv.on_dispatch_decode(action.request, -1)
                for later in self._rounds.rest_of_session(action.request):
                    later.rejected_reason = f"an earlier round was rejected: {action.reason}"
                    self._completed += 1
            elif type(action) is SetRole:
                self._role_changes.append(RoleChange(now, action.instance_id, action.role,
                                                    action.reason))
            elif type(action) is SetChunkSize:
                instance = self.instances[action.instance_id]
                self._touch(instance)
                instance.local.chunk_size_tokens = action.chunk_size_tokens
            elif type(action) is SetPhasePriority:
                instance = self.instances[action.instance_id]
                self._touch(instance)
                instance.local.phase_priority = action.priority
            elif type(action) is Migrate:
                source = self.instances[action.source_id]
                self._touch(source)  # the move happens at the source's next step boundary
                self._migrations[action.request.request_id] = action
                if source.plan is None:
                    self._start_migrations(source)
            elif type(action) is StopInstance:
                self._stop_instance(action.instance_id, action.reason)
            elif type(action) is StartInstance:
                self._start_instance(action.instance_id, action.reason)
            else:
                raise ValueError(f"the simulator cannot apply {type(action).__name__} at "
                                 f"t={now:.3f}s")

    def _dispatch_decode(self, action: DispatchDecode) -> None:
        request, source = action.request, self.instances[action.source_id]
        if request.home_instance >= 0:
            self._session_kv.on_dispatch_decode(request, action.target_id)
        if action.target_id == action.source_id:
            request.decode_instance = action.target_id
            request.decode_in_place()
            self._touch(source)
            source.local.continue_in_place(request)
        else:
            self._send_kv(request, action.source_id, action.target_id)
