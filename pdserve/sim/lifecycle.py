"""Elastic scaling in the simulator: which instances are stopped, and what they cost.

`stop` (a drained instance, or a reserve at the start) stops counting the instance's time
and drops its prefix cache, as a stopped worker's memory is gone. `start` returns when the
instance will serve, `SimSettings.instance_startup_s` later (a worker loading its weights
and warming up); the simulator then calls `started` and tells the scheduler
(`InstanceStarted`). `instance_s_total` is the instance-seconds the cluster ran, the cost
elastic scaling saves. The decision log (`cluster/history.py`) records every stop, start
and started.

`InstanceLifecycle` owns the stopped set and the time accounting; the simulator owns the
clock and the event heap and asks it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.sim.instance import SimInstance

INSTANCE_STARTED = 4  # event kind on the simulator's heap


class InstanceLifecycle:
    def __init__(self, instances: Sequence[SimInstance], startup_s: float) -> None:
        self.instances = instances
        self.startup_s = startup_s
        self.stopped: set[int] = set()
        self._running_since_s = [0.0] * len(instances)
        self._instance_s = 0.0  # instance-seconds of instances since stopped

    def stop(self, instance_id: int, now_s: float) -> None:
        if instance_id in self.stopped:
            return
        self.stopped.add(instance_id)
        self._instance_s += now_s - self._running_since_s[instance_id]
        instance = self.instances[instance_id]
        cache = instance.local.prefix_cache
        if cache is not None:
            cache.trim(0)  # a stopped worker's memory is gone
            if instance.blocks is not None:
                instance.blocks.sync_cache()

    def start(self, instance_id: int, now_s: float) -> float | None:
        """When a stopped instance will serve (None: it is not stopped)."""
        if instance_id not in self.stopped:
            return None
        return now_s + self.startup_s

    def started(self, instance_id: int, now_s: float) -> bool:
        """The instance's start-up time has passed: True if it now serves (it was stopped)."""
        if instance_id not in self.stopped:
            return False
        self.stopped.discard(instance_id)
        self._running_since_s[instance_id] = now_s
        return True

    def instance_s_total(self, end_s: float) -> float:
        """Instance-seconds the cluster ran up to `end_s` (stopped time not counted)."""
        return self._instance_s + sum(end_s - since for i, since
                                      in enumerate(self._running_since_s)
                                      if i not in self.stopped)
