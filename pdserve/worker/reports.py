"""A worker's load reports to the driver (`LoadReporter`, owned by `worker/worker.py`).

Every step ends with a `StepDone` carrying the load after it; an idle worker sends a
`StatsReport` when its load changed, when a dispatch arrived since its last report, and at
least every `IDLE_REPORT_S`. Each report carries `dispatches_received`, the `AddRequest` and
`AdoptKV` commands handled before the snapshot, which the driver's `DispatchLedger` uses to
keep the dispatches still in the pipe in its view (`live/dispatch_ledger.py`).

The reporter decides what a report carries and when an idle one is due; the worker sends it.
"""

from __future__ import annotations

import time

from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.stats import InstanceStats
from pdserve.worker.forecast import WorkerForecast
from pdserve.worker.messages import Command, StatsReport, is_dispatch

IDLE_REPORT_S = 0.5  # an idle worker's load report interval (when its load changed)


class LoadReporter:
    def __init__(self, instance_id: int, local: LocalScheduler,
                 forecast: WorkerForecast | None) -> None:
        """`forecast`: ARES's decode-load forecast to report with the load, if kept."""
        self.instance_id, self.local, self.forecast = instance_id, local, forecast
        self._reported: InstanceStats | None = None
        self._reported_at = 0.0
        self.dispatches_received = 0  # AddRequest/AdoptKV handled
        self._acknowledged = 0  # the count the last report carried

    def stats(self) -> InstanceStats:
        if self.forecast is None:
            return InstanceStats.of(self.local)
        return InstanceStats.of(self.local, self.forecast.report())

    def count_dispatch(self, command: Command) -> None:
        """Called for every command before it is handled: a dispatch counts even if it then
        fails (its load is not queued here either way)."""
        if is_dispatch(command):
            self.dispatches_received += 1

    def idle_report(self) -> StatsReport | None:
        """While idle: the report to send when the load changed or a dispatch arrived (one
        that failed changes no load, but the driver counts it in flight until told), and at
        least every IDLE_REPORT_S; else None."""
        stats, now = self.stats(), time.monotonic()
        if (stats != self._reported or self.dispatches_received != self._acknowledged
                or now - self._reported_at >= IDLE_REPORT_S):
            self._reported, self._reported_at = stats, now
            self._acknowledged = self.dispatches_received
            return StatsReport(self.instance_id, stats, self._acknowledged)
        return None

    def step_report(self) -> tuple[InstanceStats, float, int]:
        """What a `StepDone` carries: the load now, the time (the batch's end) and the
        dispatches it acknowledges."""
        self._reported, self._reported_at = self.stats(), time.monotonic()
        self._acknowledged = self.dispatches_received
        return self._reported, self._reported_at, self._acknowledged

    def ready_report(self) -> InstanceStats:
        self._reported = self.stats()
        return self._reported
