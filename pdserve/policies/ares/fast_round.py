"""ARES Alg. 1 phases 2 and 3 together, vectorised over the targets (numpy): the same
candidates (`candidates.py`) and the same choice (`selection.py`), at the cost a 256-instance
round can afford (`../shared/papers/ares.md`, sec. 5.2 complexity, O(|O| R |U| H)).

For a request r on source s, the variance change of moving it to t splits as
  Σ_t β_t 2c_t (c_t - L_s,t)  +  Σ_t β_t 2c_t L_t,t
(`selection.py`): the first term is r's alone, the second a dot product of β∘2c with the
target's load row, so one matrix-vector product prices r against every underloaded target.
The filters are vector masks over the targets: remaining tokens > migration time / step
time (the migration time affine in bytes per link: `LinkCosts`), the target's memory now,
at r's predicted end and over the horizon. `tests/test_ares_algorithm.py` checks that this
picks what the reference phases pick on random states.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from pdserve.cluster.topology import Topology
from pdserve.perf.fitted import PerfModel
from pdserve.policies.ares.candidates import Candidate
from pdserve.policies.ares.classification import Classification, InstanceState


@dataclass
class LinkCosts:
    """Per (source, target): seconds per transfer call and bytes per second."""

    per_call_s: np.ndarray  # [source, target]
    bytes_per_s: np.ndarray

    @classmethod
    def of(cls, topology: Topology | None, perf: PerfModel, num_instances: int) -> LinkCosts:
        if topology is None:
            shape = (num_instances, num_instances)
            return cls(np.full(shape, perf.transfer.per_call_s),
                       np.full(shape, perf.transfer.bytes_per_s))
        n = topology.num_instances
        per_call, rate = np.empty((n, n)), np.empty((n, n))
        for s in range(n):
            for t in range(n):
                link = topology.link_between(s, t)
                per_call[s, t], rate[s, t] = link.per_call_s, link.bytes_per_s
        return cls(per_call, rate)

    def time_s(self, source: int, target: int, num_bytes: float) -> float:
        return float(self.per_call_s[source, target]
                     + num_bytes / self.bytes_per_s[source, target])


def weighted_variance(loads: np.ndarray, weights: np.ndarray) -> float:
    """Σ_t β_t Var_i over a [instances, points] load matrix."""
    return float(weights @ loads.var(axis=0)) if len(loads) else 0.0


def best_move(states: dict[int, InstanceState], classes: Classification, links: LinkCosts,
              kv_bytes_per_token: int, offsets: Sequence[int], weights: Sequence[float],
              min_gain: float, skip: Collection[int] = ()
              ) -> tuple[Candidate | None, float, float, int]:
    """(best candidate or None, its variance change, σ̂² before, candidates counted)."""
    beta = np.asarray(weights, dtype=float)
    steps = np.asarray(offsets, dtype=float)
    n = len(states)
    before = weighted_variance(np.array([s.forecast.load_tokens for s in states.values()],
                                        dtype=float), beta)
    targets = np.array(classes.underloaded, dtype=int)
    if n == 0 or len(targets) == 0:
        return None, 0.0, before, 0
    target_loads = np.array([states[t].forecast.load_tokens for t in targets], dtype=float)
    current = np.array([states[t].current_tokens for t in targets], dtype=float)
    capacity = np.array([states[t].capacity_tokens for t in targets], dtype=float)
    best: Candidate | None = None
    best_change, best_id, counted = 0.0, -1, 0
    for s in classes.overloaded:
        source = states[s]
        source_loads = np.asarray(source.forecast.load_tokens, dtype=float)
        per_call = links.per_call_s[s, targets]
        rate = links.bytes_per_s[s, targets]
        not_self = targets != s
        for r in source.forecast.requests:
            if not r.running or r.request_id in skip:
                continue
            remaining = r.remaining_tokens
            c = np.where((steps == 0) | (steps < remaining), r.tokens + steps, 0.0)
            cost_s = per_call + r.tokens * kv_bytes_per_token / rate
            move_steps = cost_s / source.step_s if source.step_s > 0 else np.inf
            final = remaining if math.isfinite(remaining) else 0.0
            ok = (not_self & (remaining > move_steps)
                  & (current + r.tokens + final <= capacity)
                  & ((target_loads + c).max(axis=1) <= capacity))
            if not ok.any():
                continue
            counted += int(ok.sum())
            bc = 2.0 * beta * c
            change = (float(bc @ (c - source_loads)) + target_loads @ bc) / n
            change = np.where(ok, change, np.inf)
            k = int(np.argmin(change))
            value = float(change[k])
            if value < best_change or (value == best_change and best is not None
                                       and r.request_id < best_id):
                best_change, best_id = value, r.request_id
                best = Candidate(r, s, int(targets[k]), float(cost_s[k]),
                                 float(move_steps[k]) if source.step_s > 0 else math.inf)
    if best is None or -best_change <= min_gain * before:
        return None, 0.0, before, counted
    return best, best_change, before, counted
