"""Request metrics, the papers' definitions, for simulated and live runs alike.

All come from the same `Request` records. pdserve streams a request's first token when its
prefill ends, wherever it then decodes.

  TTFT   first token time - arrival time (all queueing included; DistServe, Arrow)
  TTFT with decode queue (TaiChi sec. 2.3.2, as vLLM measures a disaggregated deployment):
         the decode instance's first token time - arrival time, so the KV transfer and the
         wait for a decode slot count too. A request decoded where it was prefilled (or with
         one output token) has the same value as TTFT.
  TPOT   (last token time - first token time) / (n - 1) for n output tokens; 0 when n == 1
  TPOT from the decode instance (TaiChi, with the TTFT above): the mean gap between the
         tokens its decode instance emitted, (last - decode first) / (gaps), where the gaps
         are n - 2 after a hand-off (the prefill emitted token 1) and n - 1 in place; 0 when
         there is no gap. TaiChi's attainment pairs this with its TTFT.
  ITL    (AMPD) the gaps between consecutive tokens. Mean ITL is over every gap of every
         completed request (sum of (last - first) / sum of (n - 1)); max ITL is a request's
         widest gap from its decode instance's first token on (the hand-off is in TaiChi's
         TTFT, not here); its percentiles are over requests. Per-gap percentiles would need
         every token's time, which the simulator does not keep.
  E2E    last token time - arrival time (FlowKV)
  interference intensity (TaiChi sec. 2.3.1) prefill tokens co-batched with a request's
         decode steps / its output tokens: how much prefill work slowed its decode. Counted
         by the local scheduler; the live driver's records do not carry it (workers keep it).
  SLO attainment   fraction of all requests (rejected and unfinished ones included, as
                   misses) that meet both the TTFT and the TPOT target: on TTFT and TPOT, or
                   on TaiChi's pair when the SLO says so (`SLO.counts_decode_queue`,
                   `slo.counts_decode_queue`); the goodput search uses the same
  goodput (ARES)   SLO-meeting requests per second at the run's rate (over the throughput
                   window); the highest rate with >= 90 % attainment is `bench.goodput`
  throughput (ARES, FlowKV)   completed requests, output tokens and all (input + output)
                   tokens of completed requests per second from the first arrival to the last
                   finish
Latency percentiles are over completed requests.
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


def _decode_first_s(request: Request) -> float:
    first = request.decode_first_token_s
    return request.first_token_s if math.isnan(first) else first


def ttft_with_decode_queue_s(request: Request) -> float:
    """TaiChi's TTFT: until the decode instance's first token."""
    return _decode_first_s(request) - request.arrival_s


def tpot_from_decode_s(request: Request) -> float:
    """TaiChi's TPOT: the mean gap between the tokens of the decode instance."""
    first = _decode_first_s(request)
    gaps = output_count(request) - (2 if first > request.first_token_s else 1)
    return (request.finish_s - first) / gaps if gaps > 0 else 0.0


def interference_intensity(request: Request) -> float:
    """TaiChi's interference intensity: co-batched prefill tokens per output token."""
    n = output_count(request)
    return request.cobatched_prefill_tokens / n if n else 0.0


def slo_latencies_s(request: Request, slo: SLO, shift_s: float = 0.0) -> tuple[float, float]:
    """(TTFT, TPOT) of a finished request as `slo` defines them; `shift_s`: a control latency
    not yet added to its times (`types.add_control_latency` adds it to every token time)."""
    if slo.counts_decode_queue:
        return ttft_with_decode_queue_s(request) + shift_s, tpot_from_decode_s(request)
    return ttft_s(request) + shift_s, tpot_s(request)


def meets_slo(request: Request, slo: SLO) -> bool:
    if not request.finished:
        return False
    ttft, tpot = slo_latencies_s(request, slo)
    return ttft <= slo.ttft_s and tpot <= slo.tpot_s


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
    # the papers' variants (see the module docstring)
    ttft_with_decode_queue_s: Percentiles  # TaiChi
    tpot_from_decode_s: Percentiles  # TaiChi
    slo_attainment_with_decode_queue: float  # TaiChi's TTFT and TPOT both met
    itl_mean_s: float  # AMPD: over all gaps
    itl_max_s: Percentiles  # AMPD: each request's widest gap
    goodput_rps: float  # ARES: SLO-meeting requests per second at this rate
    total_tokens_per_s: float  # FlowKV: input + output tokens of completed requests
    interference_intensity: Percentiles  # TaiChi: co-batched prefill tokens / output tokens


def summarize(requests: Sequence[Request], slo: SLO) -> Summary:
    done = [r for r in requests if r.finished]
    total = len(requests)
    ttft = np.array([ttft_s(r) for r in done])
    tpot = np.array([tpot_s(r) for r in done])
    e2e = np.array([e2e_s(r) for r in done])
    ttft_dq = np.array([ttft_with_decode_queue_s(r) for r in done])
    tpot_dq = np.array([tpot_from_decode_s(r) for r in done])
    itl_max = np.array([r.max_itl_s for r in done])
    gaps = sum(output_count(r) - 1 for r in done)
    gap_time = sum(r.finish_s - r.first_token_s for r in done if output_count(r) > 1)
    if done:
        start = min(r.arrival_s for r in requests)
        duration = max(r.finish_s for r in done) - start
    else:
        duration = 0.0
    out_tokens = sum(output_count(r) for r in done)
    in_tokens = sum(r.input_tokens for r in done)
    met_dq = int(np.sum((ttft_dq <= slo.ttft_s) & (tpot_dq <= slo.tpot_s)))
    # the attainment (and the goodput's) on the SLO's definitions (`SLO.counts_decode_queue`)
    slo_ttft, slo_tpot = (ttft_dq, tpot_dq) if slo.counts_decode_queue else (ttft, tpot)
    met = int(np.sum((slo_ttft <= slo.ttft_s) & (slo_tpot <= slo.tpot_s)))

    def per_s(count: float) -> float:
        return count / duration if duration > 0 else 0.0

    def share(hits: int) -> float:
        return hits / total if total else 0.0

    return Summary(
        requests=total, completed=len(done),
        rejected=sum(1 for r in requests if r.rejected_reason),
        ttft_s=Percentiles.of(ttft), tpot_s=Percentiles.of(tpot), e2e_s=Percentiles.of(e2e),
        slo_attainment=share(met),
        ttft_attainment=share(int(np.sum(slo_ttft <= slo.ttft_s))),
        tpot_attainment=share(int(np.sum(slo_tpot <= slo.tpot_s))),
        throughput_rps=per_s(len(done)),
        output_tokens_per_s=per_s(out_tokens),
        preemptions=sum(r.preemptions for r in requests),
        duration_s=duration,
        ttft_with_decode_queue_s=Percentiles.of(ttft_dq),
        tpot_from_decode_s=Percentiles.of(tpot_dq),
        slo_attainment_with_decode_queue=share(met_dq),
        itl_mean_s=gap_time / gaps if gaps else math.nan,
        itl_max_s=Percentiles.of(itl_max),
        goodput_rps=per_s(met),
        total_tokens_per_s=per_s(in_tokens + out_tokens),
        interference_intensity=Percentiles.of(
            np.array([interference_intensity(r) for r in done])))
