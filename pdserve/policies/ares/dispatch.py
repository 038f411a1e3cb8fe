"""Predicted-length-aware dispatch from prefill to decode: a prefilled request goes to the
decode instance whose KV, with it added, peaks lowest over the request's predicted life
(`../shared/papers/ares.md`, sec. 3 and 5.2; an addition of pdserve's, issue 26).

The paper's baselines place a prefilled request by the decode instances' current KV load
("prefill-decode real-time KV cache load balancing", sec. 6.1: the `min-running-tokens`
router) and ARES repairs the imbalance that follows with decode-to-decode migrations
(Alg. 1). Sec. 3 names the cause: that dispatch "overlooks the varying workloads of
different requests" and "the evolving nature of requests" -- it places a request by the
present while the load it brings, and the load already there, live in the future. ARES
specifies no dispatch rule. pdserve's, from the same ingredients as Alg. 1:

- a decode's load model (`RequestForecast.load_at`, the workers' forecast): N(r) tokens
  now, one more per step until its predicted remaining length N̂(r) runs out, then 0 (KV
  freed). The instance's residents are those its workers' report lists (sec. 5.2) plus
  the requests this router sent there that the report does not list yet (a live report
  can predate the dispatch); an instance that has not reported holds its current tokens;
- the peak: over t in [0, N̂(r)) of the new request, the residents' load plus its own,
  as a fraction of the instance's KV capacity. The load grows between ends and drops at
  each, so the peak is at t = 0 or just before an end; all are evaluated, exactly;
- the instance with the lowest peak fraction (over 1: it would run out of KV and preempt,
  which Alg. 1 line 21's memory check forbids a migration to); ties by Eq. 4's
  time-weighted overlap Σ_j β_j N̂_i(t_j) x(t_j) over the forecast horizon (the only part
  of the time-weighted variance after the assignment that depends on the instance),
  then by fewer current tokens, then the lower id.
Why the peak and not Eq. 4 alone: the imbalance ARES fights costs preemptions when an
instance runs out of KV, and the variance objective (tried first) spreads load evenly over
the forecast horizon (2,000 steps) while a 30K-token request's KV peaks beyond it. On
ShareGPT long outputs at 0.17 req/s (seed 0, oracle, 600 requests) dispatch by current load
left 277 preemptions, Eq. 4's overlap 198, the peak 0 (docs/results/ares.md, table 5, for
the other rates and seeds, and where it does not help).

The request's N̂(r) comes from the same predictor the workers run (the forecast settings'
spec; in the simulator `oracle` and `noisy` read the true length, live they see only
`max_tokens`; `history` learns from the requests this router dispatched once they finish).
Live with `hidden-state` the scheduler has no hidden vector for a request that has just
prefilled (it stays on the prefill worker), so the MLP answers its prior (the training
requests' median): that dispatch is no better informed than `history`. Carrying the
prefill's last hidden state with the KV handoff would close that; it is not built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.decode_forecast import (
    DecodeForecast,
    DecodeLoadTracker,
    ForecastSettings,
    RequestForecast,
)
from pdserve.types import KV_BLOCK_TOKENS, Request

_WATCHED_MAX = 65536  # dispatched requests followed until they finish (oldest dropped)


@dataclass(frozen=True, slots=True)
class _Sent:
    """A request this router dispatched, until its decode instance's report counts it."""

    request: Request
    forecast: RequestForecast  # N(r) and N̂(r) at dispatch


class PredictedLoadDecodeRouter:
    """Decode instance by the lowest predicted KV peak (see the module docstring)."""

    def __init__(self, settings: ForecastSettings, output_lengths_known: bool = True) -> None:
        """`settings`: the forecast the instances keep (its offsets and β_t weigh the
        tie-break); `output_lengths_known`: a simulated request's `output_tokens` is its
        true length, a live one's only `max_tokens` (`DecodeLoadTracker`)."""
        if settings.predictor == "none":
            raise ValueError("predicted-load dispatch needs a length predictor; the "
                             "forecast's predictor is 'none'")
        self.settings = settings
        self.offsets = settings.step_offsets()
        self.weights = settings.weights()
        self.predictor = DecodeLoadTracker(settings, knows_true_length=output_lengths_known)
        self._sent: dict[int, dict[int, _Sent]] = {}  # instance -> request id -> what it sent
        self._watched: list[Request] = []  # dispatched and not finished: `history` learns
        self.dispatches = 0
        self.memory_fallbacks = 0  # dispatches where no instance was memory-safe

    def predicted_remaining_tokens(self, request: Request) -> float:
        """N̂(r) for a request that has just prefilled."""
        remaining = self.predictor.remaining([(request, request.generated_tokens)])[0]
        self.predictor.forget(request.request_id)
        return remaining

    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        self._learn_from_finished()
        remaining = self.predicted_remaining_tokens(request)
        own = RequestForecast(request.request_id, request.sequence_tokens, remaining, False)
        trajectory = [own.load_at(step) for step in self.offsets]
        best, best_key = -1, (0.0, 0.0, 0, 0)
        for i in board.decode_candidates:
            load = view.instances[i]
            current = load.running_tokens + load.decode_queue_tokens
            residents = self._residents(i, load.decode_forecast, current)
            capacity = max(1, load.total_blocks * KV_BLOCK_TOKENS)
            peak = peak_tokens(residents, own)
            future = [sum(r.load_at(step) for r in residents) for step in self.offsets]
            overlap = sum(b * f * x for b, f, x in zip(self.weights, future, trajectory,
                                                         strict=True))
            key = (peak / capacity, overlap, current, i)
            if best < 0 or key < best_key:
                best, best_key = i, key
        if best < 0:
            return best
        self.dispatches += 1
        self.memory_fallbacks += best_key[0] > 1.0  # preemptions predicted wherever it goes
        self._sent.setdefault(best, {})[request.request_id] = _Sent(request, own)
        self._watched.append(request)
        if len(self._watched) > _WATCHED_MAX:
            del self._watched[0]
        return best

    def _residents(self, instance: int, forecast: DecodeForecast | None,
                   current: int) -> list[RequestForecast]:
        """The decodes the instance will hold: its report's (its current tokens, held for
        good, when it has not reported), plus what this router sent that the report does
        not list yet."""
        if forecast is None:
            residents = [RequestForecast(-1, current, math.inf, True)] if current else []
        else:
            residents = list(forecast.requests)
        sent = self._sent.get(instance)
        if sent:
            listed = {r.request_id for r in residents}
            for request_id in [rid for rid, s in sent.items()
                               if rid in listed or s.request.finished
                               or s.request.rejected_reason]:
                del sent[request_id]
            residents += [s.forecast for s in sent.values()]
        return residents

    def _learn_from_finished(self) -> None:
        """`history` learns each dispatched request's output length once it finished (the
        other predictors ignore it)."""
        watched = self._watched
        if not any(r.finished or r.rejected_reason for r in watched):
            return
        keep = []
        for request in watched:
            if not (request.finished or request.rejected_reason):
                keep.append(request)
                continue
            if request.finished:
                self.predictor.observe_finished(request)
            for sent in self._sent.values():  # an instance no longer a decode candidate
                sent.pop(request.request_id, None)  # is never pruned in `_residents`
        self._watched = keep


def peak_tokens(residents: list[RequestForecast], own: RequestForecast) -> float:
    """The most KV tokens `residents` plus `own` hold at any step t in [0, own's predicted
    end) (at least t = 0). Each decode holds tokens + t while t < its remaining length
    (`RequestForecast.load_at`), so the total grows between ends and drops at each: the
    peak is at t = 0 or at the last step before an end. The ends are sorted once and the
    tokens of the decodes still alive summed from the back."""
    # own holds KV for t < its remaining length (no prediction: 2^31 steps, for good)
    horizon = min(max(1.0, own.remaining_tokens), float(2**31))
    decodes = sorted([*residents, own], key=lambda r: max(1.0, r.remaining_tokens))
    alive_tokens = float(sum(r.tokens for r in decodes))  # all hold KV at t = 0
    peak = alive_tokens
    alive = len(decodes)
    for r in decodes:  # ascending ends: at the step before r's end, r and later ones live
        end = max(1.0, r.remaining_tokens)
        if end > horizon or not math.isfinite(end):
            break
        t = math.ceil(end) - 1  # the last step r holds KV
        peak = max(peak, alive_tokens + alive * t)
        alive_tokens -= r.tokens
        alive -= 1
    if alive:  # decodes alive through the window's last step
        t = math.ceil(horizon) - 1
        peak = max(peak, alive_tokens + alive * t)
    return peak
