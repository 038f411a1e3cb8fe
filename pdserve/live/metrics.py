"""Prometheus metrics of the live server, in the text exposition format (no dependency)."""

from __future__ import annotations

import bisect
from collections import defaultdict

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help_text = name, help_text
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, value)] += 1
        self.total += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, count in zip(LATENCY_BUCKETS_S, self.counts, strict=False):
            running += count
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {running}')
        running += self.counts[-1]
        lines += [f'{self.name}_bucket{{le="+Inf"}} {running}', f"{self.name}_sum {self.total}",
                  f"{self.name}_count {running}"]
        return lines


COUNTERS = ("requests", "completions", "rejections", "cancellations", "retries", "transfers",
            "migrations", "flips", "worker_failures")


class ServerMetrics:
    def __init__(self) -> None:
        self.ttft = Histogram("pdserve_ttft_seconds", "Time to first token.")
        self.tpot = Histogram("pdserve_tpot_seconds", "Time per output token after the first.")
        self.e2e = Histogram("pdserve_e2e_seconds", "End-to-end request latency.")
        self.counters: dict[str, int] = defaultdict(int, dict.fromkeys(COUNTERS, 0))

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] += amount

    def render(self, gauges: dict[str, list[tuple[dict[str, str], float]]]) -> str:
        lines: list[str] = []
        for histogram in (self.ttft, self.tpot, self.e2e):
            lines += histogram.render()
        for name in sorted(self.counters):
            lines += [f"# TYPE pdserve_{name}_total counter",
                      f"pdserve_{name}_total {self.counters[name]}"]
        for name, samples in sorted(gauges.items()):
            lines.append(f"# TYPE pdserve_{name} gauge")
            for labels, value in samples:
                label = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"pdserve_{name}{{{label}}} {value}" if label
                             else f"pdserve_{name} {value}")
        return "\n".join(lines) + "\n"
