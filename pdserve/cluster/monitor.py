"""Windowed statistics of every instance, from periodic snapshots (Arrow sec. 5.2).

On each monitor tick the owner calls `observe(view)`; the monitor keeps the snapshots of the
last `window_s` seconds and answers windowed questions by differencing the cumulative
counters: an instance's (or a pool's) mean token interval, its decode steps. Queue lengths,
running tokens and memory come from the newest snapshot. It is pure: time comes from views.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from pdserve.cluster.events import ClusterView
from pdserve.instance.stats import InstanceStats


class InstanceMonitor:
    def __init__(self, window_s: float) -> None:
        if not window_s > 0:
            raise ValueError(f"monitor window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._history: deque[tuple[float, list[InstanceStats]]] = deque()

    def observe(self, view: ClusterView) -> None:
        self._history.append((view.now_s, [InstanceStats.of(load) for load in view.instances]))
        # keep one snapshot at or before the window start, as the base of the differences
        while len(self._history) > 2 and self._history[1][0] <= view.now_s - self.window_s:
            self._history.popleft()

    @property
    def ready(self) -> bool:
        return len(self._history) >= 2

    def latest(self, instance_id: int) -> InstanceStats | None:
        return self._history[-1][1][instance_id] if self._history else None

    def token_interval_s(self, instances: Sequence[int]) -> float:
        """Mean time per decode step over the window across `instances` (weighted by steps);
        0 when none of them ran a decode step in the window."""
        if len(self._history) < 2:
            return 0.0
        first, last = self._history[0][1], self._history[-1][1]
        steps = busy = 0.0
        for i in instances:
            if i >= len(first):
                continue
            steps += last[i].decode_steps_total - first[i].decode_steps_total
            busy += last[i].decode_busy_s_total - first[i].decode_busy_s_total
        return busy / steps if steps else 0.0
