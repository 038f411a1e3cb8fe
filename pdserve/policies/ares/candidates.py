"""ARES Alg. 1 phase 2, CANDIDATEENUMERATION (lines 17-23; `../shared/papers/ares.md`).

For every source s in O and target t in U (s != t), a decode r running on s is a candidate
when
  line 20: N̂(r) > C_mig / T_exec -- it will still be generating after its move: C_mig is
           the time to send its KV from s to t (the topology's link, else the perf model's
           transfer), T_exec the source's current step time; a decode about to finish is
           not worth moving;
  line 21: N_t(B_{t,0}) + N(r) + N̂(r) <= C_mem -- the target's current load plus the
           request at its predicted end fits the target's KV (the paper writes N̂(r); its
           KV moves along, so pdserve adds its current tokens N(r)); and, as sec. 5.2
           says ("memory safety ensuring no OOM on target instance in the near future"),
           the target's forecast load plus the request stays within C_mem at every
           future step of the horizon.
A request whose KV is still arriving, or that was moved in the last rounds, is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from pdserve.instance.decode_forecast import RequestForecast
from pdserve.policies.ares.classification import Classification, InstanceState


@dataclass(frozen=True, slots=True)
class Candidate:
    request: RequestForecast
    source: int
    target: int
    migration_s: float  # C_mig
    migration_steps: float  # C_mig / T_exec


MigrationCost = Callable[[int, int, int], float]  # (source, target, tokens) -> seconds


def enumerate_candidates(states: dict[int, InstanceState], classes: Classification,
                         migration_cost_s: MigrationCost, offsets: Sequence[int],
                         skip: Collection[int] = ()) -> list[Candidate]:
    """`offsets`: the future steps of the forecasts' loads (`ForecastSettings`)."""
    found: list[Candidate] = []
    for s in classes.overloaded:
        source = states[s]
        for t in classes.underloaded:
            if t == s:
                continue
            target = states[t]
            for r in source.forecast.requests:
                if not r.running or r.request_id in skip:
                    continue
                cost_s = migration_cost_s(s, t, r.tokens)
                steps = cost_s / source.step_s if source.step_s > 0 else math.inf
                if not r.remaining_tokens > steps:  # line 20
                    continue
                final = r.remaining_tokens if math.isfinite(r.remaining_tokens) else 0.0
                if target.current_tokens + r.tokens + final > target.capacity_tokens:
                    continue  # line 21
                if any(load + r.load_at(step) > target.capacity_tokens
                       for step, load in zip(offsets, target.forecast.load_tokens,
                                             strict=True)):
                    continue  # "no OOM on target instance in the near future"
                found.append(Candidate(r, s, t, cost_s, steps))
    return found
