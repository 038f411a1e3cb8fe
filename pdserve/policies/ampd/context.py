"""What AMPD's components share (AMPD sec. 3 and 4.1).

Each prefill worker's windowed TTFT and each decode worker's windowed ITL, by default the
averages over the past 10 seconds (sec. 3, "Online stage"):
  TTFT  recorded when a prefill finishes (the decode router is called then): the time from
        the round's arrival to its first token, for the instance that prefilled it
  ITL   an instance's mean time per decode step over the window, from the monitor's
        snapshots of its cumulative counters (`InstanceMonitor`, observed on every tick)
Every routing decision is logged with its reason (`decisions`, the last `log_size`) and
counted per route kind (`counts`: remote, local, cost-remote, cost-local).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdserve.cluster.monitor import InstanceMonitor
from pdserve.perf.fitted import PerfModel

WINDOW_S = 10.0
ALPHA = 0.9
BETA = 0.85


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    request_id: int
    instance_id: int
    kind: str  # "remote", "local", "cost-remote", "cost-local"
    reason: str


@dataclass
class AmpdContext:
    ttft_slo_s: float
    itl_slo_s: float
    perfs: Sequence[PerfModel]  # per instance (heterogeneous parallelism allowed)
    window_s: float = WINDOW_S
    alpha: float = ALPHA
    beta: float = BETA
    log_size: int = 10_000
    monitor: InstanceMonitor = field(init=False)
    counts: Counter[str] = field(default_factory=Counter)
    decisions: deque[RoutingDecision] = field(init=False)
    _ttft: dict[int, deque[tuple[float, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.alpha > 0 and self.beta > 0):
            raise ValueError(f"ampd alpha and beta must be positive, got {self.alpha}, "
                             f"{self.beta}")
        self.monitor = InstanceMonitor(self.window_s)
        self.decisions = deque(maxlen=self.log_size)

    def use_perf_model(self, perf: PerfModel) -> None:
        """Every instance's model is `perf` from now on (a live server has one model)."""
        self.perfs = [perf] * len(self.perfs)

    def perf(self, instance_id: int) -> PerfModel:
        return self.perfs[instance_id] if len(self.perfs) > 1 else self.perfs[0]

    def record_ttft(self, instance_id: int, now_s: float, ttft_s: float) -> None:
        samples = self._ttft.setdefault(instance_id, deque())
        samples.append((now_s, ttft_s))
        while samples and samples[0][0] < now_s - self.window_s:
            samples.popleft()

    def windowed_ttft_s(self, instance_id: int, now_s: float) -> float:
        """Mean TTFT of the prefills the instance finished in the window (0 if none)."""
        samples = self._ttft.get(instance_id)
        if not samples:
            return 0.0
        while samples and samples[0][0] < now_s - self.window_s:
            samples.popleft()
        return sum(t for _, t in samples) / len(samples) if samples else 0.0

    def windowed_itl_s(self, instance_id: int) -> float:
        """Mean time per decode step of the instance over the window (0 if none ran)."""
        return self.monitor.token_interval_s((instance_id,))

    def log(self, request_id: int, instance_id: int, kind: str, reason: str) -> int:
        self.counts[kind] += 1
        self.decisions.append(RoutingDecision(request_id, instance_id, kind, reason))
        return instance_id
