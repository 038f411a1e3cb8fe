"""Prometheus metrics of the live server, in the text exposition format (no dependency).

Every family has HELP and TYPE lines. Counters kept by the driver are here
(`ServerMetrics`); per-instance families come from the workers' latest load snapshots,
which workers send after every step and, when idle, whenever their load changed (so freed KV
shows within a report interval). Cumulative per-instance counters (`preemptions_total`)
restart from 0 when their worker is restarted, which Prometheus reads as a counter reset.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field

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


Labels = dict[str, str]


@dataclass
class Family:
    """One metric family: `kind` is "gauge" or "counter" (a counter's name ends in _total)."""

    name: str
    kind: str
    help_text: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def render(self) -> list[str]:
        name = f"pdserve_{self.name}"
        lines = [f"# HELP {name} {self.help_text}", f"# TYPE {name} {self.kind}"]
        for labels, value in self.samples:
            label = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{label}}} {value}" if label else f"{name} {value}")
        return lines


COUNTERS = {
    "requests": "Requests admitted.",
    "completions": "Requests that finished normally.",
    "rejections": "Requests refused (overload, or no instance could serve them).",
    "cancellations": "Requests cancelled by their client.",
    "retries": "Re-runs of requests whose worker died.",
    "resumed_tokens": "Streamed tokens that re-runs resumed after rather than generated.",
    "transfers": "KV hand-offs from a prefill to a decode instance.",
    "migrations": "Running decodes moved between instances.",
    "flips": "Instance role changes.",
    "worker_failures": "Worker processes that exited unexpectedly.",
    "worker_restarts": "Worker processes started again after an exit.",
    "workers_started": "Stopped workers started on the policy's request (elastic scaling).",
    "workers_stopped": "Workers stopped on the policy's request (drained, or a reserve).",
    "prompt_tokens": "Prompt tokens prefilled (counted once per request).",
    "generation_tokens": "Generated tokens streamed to clients.",
}

FAILURE_REASONS = ("invalid_request", "engine_error", "worker_crash", "retry_budget",
                   "no_instance", "shutdown")


class ServerMetrics:
    def __init__(self) -> None:
        self.ttft = Histogram("pdserve_ttft_seconds", "Time to first token.")
        self.tpot = Histogram("pdserve_tpot_seconds", "Time per output token after the first.")
        self.e2e = Histogram("pdserve_e2e_seconds", "End-to-end request latency.")
        self.counters: dict[str, int] = defaultdict(int, dict.fromkeys(COUNTERS, 0))
        self.failures: dict[str, int] = defaultdict(int, dict.fromkeys(FAILURE_REASONS, 0))

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] += amount

    def count_failure(self, reason: str) -> None:
        self.failures[reason] += 1

    def render(self, families: list[Family]) -> str:
        lines: list[str] = []
        for histogram in (self.ttft, self.tpot, self.e2e):
            lines += histogram.render()
        for name in sorted(self.counters):
            lines += Family(f"{name}_total", "counter", COUNTERS.get(name, name),
                            [({}, self.counters[name])]).render()
        lines += Family("requests_failed_total", "counter",
                        "Requests that ended with an error, by reason.",
                        [({"reason": r}, n) for r, n in sorted(self.failures.items())]).render()
        for family in families:
            lines += family.render()
        return "\n".join(lines) + "\n"
