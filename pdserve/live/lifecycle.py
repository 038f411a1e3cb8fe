"""Workers that come and go on the scheduler's request (elastic scaling), and restarts.

`StopInstance` ends an instance's worker process (it holds no work: the policy drained it,
or it is a reserve at start-up, whose worker is never started) and frees its KV pool.
`StartInstance` starts the worker again; once it reports ready the scheduler hears
`InstanceStarted` and the policy gives it a role. A worker that restarts after a crash
is reported as `InstanceRecovered` instead. Mixed into `LiveDriver`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pdserve.cluster.actions import StartInstance, StopInstance
from pdserve.cluster.events import ClusterView, InstanceRecovered, InstanceStarted
from pdserve.instance.stats import InstanceStats
from pdserve.live.processes import WorkerProcesses
from pdserve.live.server_metrics import ServerMetrics

if TYPE_CHECKING:
    from pdserve.live.driver import LiveDriver

log = logging.getLogger("pdserve.live")


class WorkerLifecycle:
    workers: WorkerProcesses
    metrics: ServerMetrics
    view: ClusterView
    _starting: set[int]

    def _apply_lifecycle(self: LiveDriver, action: StartInstance | StopInstance) -> None:
        i = action.instance_id
        if isinstance(action, StopInstance):
            log.info("instance %d: stopping its worker: %s", i, action.reason)
            self.metrics.count("workers_stopped")
            self._starting.discard(i)
            self.workers.stop_worker(i)
            self.set_load(i, InstanceStats.empty(i, self.view.instances[i].total_blocks))
        else:
            log.info("instance %d: starting its worker: %s", i, action.reason)
            self.metrics.count("workers_started")
            self._starting.add(i)
            self.workers.start_worker(i)

    def _on_ready(self: LiveDriver, instance: int, stats: InstanceStats,
                  pool_name: str) -> None:
        """A started or restarted worker is up, empty: the scheduler may use it."""
        self.set_load(instance, stats)
        if instance in self._starting:
            self._starting.discard(instance)
            log.info("worker %d started (pid %d)", instance, self.workers.pid(instance))
            self._handle(InstanceStarted(instance))
            return
        self.metrics.count("worker_restarts")
        log.warning("worker %d restarted (pid %d)", instance, self.workers.pid(instance))
        self._handle(InstanceRecovered(instance))
