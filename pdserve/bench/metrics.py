"""Request metrics, the papers' definitions, for simulated and live runs alike.

  TTFT   first token time - arrival time (all queueing included)
  TPOT   (last token time - first token time) / (n - 1) for n output tokens; 0 when n == 1
  E2E    last token time - arrival time
  SLO attainment   fraction of all requests (rejected and unfinished ones included, as
                   misses) that meet both the TTFT and the TPOT target
Latency percentiles are over completed requests. Throughput is completed requests (and their
output tokens) per second from the first arrival to the last finish.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pdserve.types import SLO, Request


def ttft_s(request: Request) -> float:
    return request.first_token_s - request.arrival_s


def output_count(request: Request) -> int:
    return request.generated_tokens or request.output_tokens


def tpot_s(request: Request) -> float:
    n = output_count(request)
    return (request.finish_s - request.first_token_s) / (n - 1) if n > 1 else 0.0


def e2e_s(request: Request) -> float:
    return request.finish_s - request.arrival_s


def meets_slo(request: Request, slo: SLO) -> bool:
    return request.finished and ttft_s(request) <= slo.ttft_s and tpot_s(request) <= slo.tpot_s


@dataclass(frozen=True)
class Percentiles:
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: np.ndarray) -> Percentiles:
        if len(values) == 0:
            return cls(math.nan, math.nan, math.nan, math.nan)
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return cls(float(values.mean()), float(p50), float(p90), float(p99))


@dataclass(frozen=True)
class Summary:
    requests: int
    completed: int
    rejected: int
    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    slo_attainment: float
    ttft_attainment: float
    tpot_attainment: float
    throughput_rps: float
    output_tokens_per_s: float
    preemptions: int
    duration_s: float


def summarize(requests: Sequence[Request], slo: SLO) -> Summary:
    done = [r for r in requests if r.finished]
    total = len(requests)
    ttft = np.array([ttft_s(r) for r in done])
    tpot = np.array([tpot_s(r) for r in done])
    e2e = np.array([e2e_s(r) for r in done])
    if done:
        start = min(r.arrival_s for r in requests)
        duration = max(r.finish_s for r in done) - start
    else:
        duration = 0.0
    out_tokens = sum(output_count(r) for r in done)

    def share(hits: int) -> float:
        return hits / total if total else 0.0

    return Summary(
        requests=total, completed=len(done),
        rejected=sum(1 for r in requests if r.rejected_reason),
        ttft_s=Percentiles.of(ttft), tpot_s=Percentiles.of(tpot), e2e_s=Percentiles.of(e2e),
        slo_attainment=share(int(np.sum((ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)))),
        ttft_attainment=share(int(np.sum(ttft <= slo.ttft_s))),
        tpot_attainment=share(int(np.sum(tpot <= slo.tpot_s))),
        throughput_rps=len(done) / duration if duration > 0 else 0.0,
        output_tokens_per_s=out_tokens / duration if duration > 0 else 0.0,
        preemptions=sum(r.preemptions for r in requests),
        duration_s=duration)
