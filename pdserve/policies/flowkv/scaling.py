"""Extreme load (FlowKV Alg. 1 lines 28-30, appendix B.1): elastic scaling of the prefill or
decode side from a reserve of instances.

  scale up    overload (a side's level past eps_high) that has lasted `scale_up_after_s`:
              a drained reserve instance starts for the more overloaded side
              (`StartInstance`); it takes that side's role when the driver reports it
              started (`InstanceStarted`: the simulator's `instance_startup_s`, a live
              worker loading its weights). A reserve instance still running (scaled down,
              not yet stopped) takes the role at once
  scale down  low load (both C^p and C^d under `scale_down_below`) that has lasted
              `scale_down_after_s`: the least-loaded instance of the larger side goes back
              to the reserve (it takes no new work and drains what it holds; once drained
              it is stopped, `StopInstance`); a side keeps at least one instance
Against oscillation (the flaw Dynamo's planner shipped): the duration thresholds, the
classifier's hysteresis, a cooldown of `scale_cooldown_s` after any scaling decision (the
status window must first see the new instance working), and a started instance counting
toward its side already while it starts, so a second one is not started for the same
overload.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.policies.flowkv.context import FlowKVContext
from pdserve.types import Role


@dataclass(frozen=True, slots=True)
class Starting:
    role: Role
    reason: str


def has_work(load: InstanceLoad) -> bool:
    return bool(load.prefill_queue_len or load.running_decodes or load.decode_queue_len
                or load.sending_len)


class ElasticScaler:
    def __init__(self, context: FlowKVContext) -> None:
        self.context = context
        self.starting: dict[int, Starting] = {}
        self.last_scale_s = float("-inf")
        self.overload_since_s: float | None = None
        self.low_since_s: float | None = None
        self.events: list[tuple[float, int, str, str]] = []  # (time, instance, what, reason)

    def on_tick(self, view: ClusterView, board: RoleBoard) -> None:
        self._forget_failed_starts(view, board)
        self._decide(view, board)
        self._stop_drained(view, board)  # after: a drained reserve may serve again at once

    def _decide(self, view: ClusterView, board: RoleBoard) -> None:
        now, context = view.now_s, self.context
        classifier = context.classifier
        overloaded = max(classifier.prefill_level, classifier.decode_level) == 2
        self.overload_since_s = (self.overload_since_s if self.overload_since_s is not None
                                 else now) if overloaded else None
        self.low_since_s = (self.low_since_s if self.low_since_s is not None else now) \
            if classifier.low_load else None
        if now - self.last_scale_s < context.settings.scale_cooldown_s:
            return
        if (self.overload_since_s is not None
                and now - self.overload_since_s >= context.settings.scale_up_after_s):
            self._scale_up(view, board)
        elif (self.low_since_s is not None
              and now - self.low_since_s >= context.settings.scale_down_after_s):
            self._scale_down(view, board)

    def _forget_failed_starts(self, view: ClusterView, board: RoleBoard) -> None:
        """A reserve that failed to start is not waited for: the next scale-up may take
        another."""
        for i in [i for i in self.starting if i in board.failed]:
            del self.starting[i]
            self.events.append((view.now_s, i, "start failed",
                                "flowkv alg1: the reserve instance did not start; "
                                "not waited for"))

    def on_started(self, instance_id: int, view: ClusterView, board: RoleBoard) -> None:
        """The driver reports a started instance: it takes the role it was started for."""
        start = self.starting.get(instance_id)
        if start is not None and instance_id not in board.stopped:
            del self.starting[instance_id]
            self._serve(instance_id, start, view, board)

    def _serve(self, i: int, start: Starting, view: ClusterView, board: RoleBoard) -> None:
        board.set_role(i, start.role, start.reason + "; started")
        self.events.append((view.now_s, i, f"serving as {start.role.value}", start.reason))

    def _stop_drained(self, view: ClusterView, board: RoleBoard) -> None:
        for i in self.context.side(Role.RESERVE, board):
            if (i not in board.stopped and i not in self.starting
                    and board.roles[i] is Role.RESERVE and not has_work(view.instances[i])):
                reason = "flowkv alg1: reserve instance drained; stopped until scaled up"
                board.stop_instance(i, reason)
                self.events.append((view.now_s, i, "stopped", reason))

    def _scale_up(self, view: ClusterView, board: RoleBoard) -> None:
        context, s = self.context, self.context.settings
        to_prefill = context.classifier.overloaded_phase_is_prefill(context.c_prefill,
                                                                    context.c_decode)
        reserve = [i for i in context.side(Role.RESERVE, board)
                   if i not in self.starting and not has_work(view.instances[i])]
        if not reserve:
            return
        # one still running (scaled down, not yet stopped) serves at once
        i = min(reserve, key=lambda j: (j in board.stopped, j))
        role = Role.PREFILL if to_prefill else Role.DECODE
        c = context.c_prefill if to_prefill else context.c_decode
        since = view.now_s - (self.overload_since_s or view.now_s)
        reason = (f"flowkv alg1: extreme load, {role.value} side C={c:.2f} over "
                  f"{s.high_prefill if to_prefill else s.high_decode:g} for {since:.0f}s; "
                  f"scale up from the reserve")
        context.homes[i] = role  # counts toward its side while it starts
        self.last_scale_s = view.now_s
        self.overload_since_s = None
        if i not in board.stopped:
            self._serve(i, Starting(role, reason + " (still running)"), view, board)
            return
        self.starting[i] = Starting(role, reason)
        board.start_instance(i, reason)
        self.events.append((view.now_s, i, f"starting as {role.value}", reason))

    def _scale_down(self, view: ClusterView, board: RoleBoard) -> None:
        context, s = self.context, self.context.settings
        prefill = [i for i in context.side(Role.PREFILL, board) if i not in self.starting]
        decode = [i for i in context.side(Role.DECODE, board) if i not in self.starting]
        side = prefill if len(prefill) >= len(decode) else decode
        if len(side) <= 1:
            return
        i = min(reversed(side), key=lambda j: (has_work(view.instances[j]),
                                               view.instances[j].used_blocks))
        since = view.now_s - (self.low_since_s or view.now_s)
        reason = (f"flowkv alg1: extreme load (low), C^p={context.c_prefill:.2f} and "
                  f"C^d={context.c_decode:.2f} under {s.scale_down_below:g} for {since:.0f}s; "
                  f"{context.homes[i].value} instance back to the reserve")
        context.homes[i] = Role.RESERVE
        board.set_role(i, Role.RESERVE, reason)
        self.last_scale_s = view.now_s
        self.low_since_s = None
        self.events.append((view.now_s, i, "to reserve", reason))
