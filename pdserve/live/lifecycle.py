"""Workers that come and go on the scheduler's request (elastic scaling), and restarts.

`StopInstance` ends an instance's worker process (it holds no work: the policy drained it,
or it is a reserve at start-up, whose worker is never started) and frees its KV pool.
`StartInstance` starts the worker again; once it reports ready the scheduler hears
`InstanceStarted` and the policy gives it a role. A worker that restarts after a crash
is reported as `InstanceRecovered` instead.

`WorkerLifecycle` owns which workers were started on request and are not yet ready; the
live driver calls it and hands the event it returns to the scheduler.
"""

from __future__ import annotations

import logging

from pdserve.cluster.events import InstanceRecovered, InstanceStarted
from pdserve.live.processes import WorkerProcesses
from pdserve.live.server_metrics import ServerMetrics

log = logging.getLogger("pdserve.live")


class WorkerLifecycle:
    def __init__(self, workers: WorkerProcesses, metrics: ServerMetrics) -> None:
        self.workers = workers
        self.metrics = metrics
        self._starting: set[int] = set()  # started on request, not yet ready

    def stop(self, instance_id: int, reason: str) -> None:
        log.info("instance %d: stopping its worker: %s", instance_id, reason)
        self.metrics.add(self.metrics.instance_stops)
        self._starting.discard(instance_id)
        self.workers.stop_worker(instance_id)

    def start(self, instance_id: int, reason: str) -> None:
        log.info("instance %d: starting its worker: %s", instance_id, reason)
        self.metrics.add(self.metrics.instance_starts)
        self._starting.add(instance_id)
        self.workers.start_worker(instance_id)

    def ready(self, instance_id: int) -> InstanceStarted | InstanceRecovered:
        """A started or restarted worker is up, empty: what the scheduler hears."""
        if instance_id in self._starting:
            self._starting.discard(instance_id)
            log.info("worker %d started (pid %d)", instance_id, self.workers.pid(instance_id))
            return InstanceStarted(instance_id)
        self.metrics.add(self.metrics.worker_restarts)
        log.warning("worker %d restarted (pid %d)", instance_id, self.workers.pid(instance_id))
        return InstanceRecovered(instance_id)

    def exited(self, instance_id: int) -> None:
        """A worker exited: a scale-up whose worker never came up is no longer awaited."""
        self._starting.discard(instance_id)
