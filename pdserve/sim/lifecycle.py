"""Elastic scaling in the simulator (a mixin of `Simulator`): instances that stop and start.

`StopInstance` (a drained instance, or a reserve at the start) stops counting the
instance's time and drops its prefix cache, as a stopped worker's memory is gone.
`StartInstance` brings it back after `SimSettings.instance_startup_s` (a worker loading its
weights and warming up), when the scheduler hears `InstanceStarted`. `instance_s_total`
is the instance-seconds the cluster ran, the cost elastic scaling saves; `scaling_events`
lists every stop, start and started as (time, instance, what, reason).
"""

from __future__ import annotations

from collections.abc import Callable

from pdserve.cluster.actions import Action
from pdserve.cluster.events import ClusterView, InstanceStarted
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.sim.instance import SimInstance
from pdserve.sim.records import SimSettings

INSTANCE_STARTED = 4  # event kind on the simulator's heap


class InstanceLifecycle:
    settings: SimSettings
    view: ClusterView
    instances: list[SimInstance]
    scheduler: GlobalScheduler
    _push: Callable[..., None]
    _apply: Callable[[list[Action]], None]

    def _init_lifecycle(self) -> None:
        self._stopped: set[int] = set()
        self._running_since_s = [0.0] * len(self.instances)
        self._instance_s = 0.0  # instance-seconds of instances since stopped
        self.scaling_events: list[tuple[float, int, str, str]] = []

    def _stop_instance(self, instance_id: int, reason: str) -> None:
        if instance_id in self._stopped:
            return
        self.scaling_events.append((self.view.now_s, instance_id, "stop", reason))
        self._stopped.add(instance_id)
        self._instance_s += self.view.now_s - self._running_since_s[instance_id]
        instance = self.instances[instance_id]
        cache = instance.local.prefix_cache
        if cache is not None:
            cache.trim(0)  # a stopped worker's memory is gone
            if instance.blocks is not None:
                instance.blocks.sync_cache()

    def _start_instance(self, instance_id: int, reason: str) -> None:
        if instance_id in self._stopped:
            self.scaling_events.append((self.view.now_s, instance_id, "start", reason))
            self._push(self.view.now_s + self.settings.instance_startup_s, INSTANCE_STARTED,
                       instance_id)

    def _on_instance_started(self, instance_id: int) -> None:
        if instance_id not in self._stopped:
            return
        self._stopped.discard(instance_id)
        self.scaling_events.append((self.view.now_s, instance_id, "started", ""))
        self._running_since_s[instance_id] = self.view.now_s
        self._apply(self.scheduler.handle(InstanceStarted(instance_id), self.view))

    def instance_s_total(self, end_s: float) -> float:
        """Instance-seconds the cluster ran up to `end_s` (stopped time not counted)."""
        return self._instance_s + sum(end_s - since for i, since
                                      in enumerate(self._running_since_s)
                                      if i not in self._stopped)
