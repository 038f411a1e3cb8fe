"""ARES Alg. 1 phase 3, OPTIMALSELECTION (lines 24-31; `../shared/papers/ares.md`, Eq. 3-4).

The objective is the time-weighted variance of the instances' token loads,
σ̂² = Σ_t β_t Var_i(N̂_i(B_{i,t})) (Eq. 4, with t = 0 the σ_0² term). Moving r from s to t
changes only two loads at each future step: with c = r's tokens at that step,
n Var changes by (L_s - c)² + (L_t + c)² - L_s² - L_t² = 2c(c + L_t - L_s) (the mean is
unchanged), so each candidate costs O(H) from the workers' pre-computed loads
("AggregateSimulations", line 28) -- no re-simulation at the scheduler. The candidate with
the largest reduction wins (line 30); none when no candidate reduces σ̂² by at least
`min_gain` of it (a balanced cluster, or only moves that would not pay).
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.policies.ares.candidates import Candidate
from pdserve.policies.ares.classification import InstanceState


def weighted_variance(states: dict[int, InstanceState], weights: Sequence[float]) -> float:
    """σ̂²: Σ_t β_t Var_i(N̂_i(B_{i,t}))."""
    n = len(states)
    if n == 0:
        return 0.0
    total = 0.0
    for j, beta in enumerate(weights):
        loads = [s.forecast.load_tokens[j] for s in states.values()]
        mean = sum(loads) / n
        total += beta * sum((x - mean) ** 2 for x in loads) / n
    return total


def variance_change(candidate: Candidate, states: dict[int, InstanceState],
                    offsets: Sequence[int], weights: Sequence[float]) -> float:
    """Change of σ̂² if `candidate` moves (negative: better balanced)."""
    source = states[candidate.source].forecast.load_tokens
    target = states[candidate.target].forecast.load_tokens
    change = 0.0
    for j, (step, beta) in enumerate(zip(offsets, weights, strict=True)):
        c = candidate.request.load_at(step)
        if c:
            change += beta * 2.0 * c * (c + target[j] - source[j])
    return change / len(states)


def select_migration(candidates: list[Candidate], states: dict[int, InstanceState],
                     offsets: Sequence[int], weights: Sequence[float],
                     min_gain: float) -> tuple[Candidate | None, float, float]:
    """(best candidate or None, its variance change, σ̂² before)."""
    before = weighted_variance(states, weights)
    best, best_change = None, 0.0
    for candidate in candidates:
        change = variance_change(candidate, states, offsets, weights)
        if change < best_change or (change == best_change and best is not None
                                    and candidate.request.request_id
                                    < best.request.request_id):
            best, best_change = candidate, change
    if best is None or -best_change <= min_gain * before:
        return None, 0.0, before
    return best, best_change, before
