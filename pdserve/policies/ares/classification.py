"""ARES Alg. 1 phase 1, INSTANCECLASSIFICATION (lines 11-16; `../shared/papers/ares.md`).

w_i = Σ_t β_t N̂_i(B_{i,t}) comes pre-computed from each worker (line 13,
`instance/decode_forecast.py`); w̄ is their mean over the decode instances (line 4).
Overloaded O = {i | w_i > (1 + θ) w̄} (line 14). Underloaded U uses the *current* load:
U = {i | N_i(B_{i,0}) < (1 + θ) w̄} (line 15), as the paper writes it: an instance that is
light now can take a request now, even if its predicted future load is average.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.instance.decode_forecast import DecodeForecast


@dataclass(frozen=True, slots=True)
class InstanceState:
    """One decode instance as a round sees it."""

    instance_id: int
    forecast: DecodeForecast
    current_tokens: int  # N_i(B_{i,0}): running plus incoming decodes' tokens
    capacity_tokens: int  # C_mem: its KV capacity
    step_s: float  # T_exec: its current decode step time

    @property
    def weighted_load(self) -> float:
        return self.forecast.weighted_load


@dataclass(frozen=True, slots=True)
class Classification:
    mean_load: float  # w̄
    overloaded: tuple[int, ...]  # O, by instance id
    underloaded: tuple[int, ...]  # U


def classify(states: dict[int, InstanceState], theta: float,
             memory_guard: float = 0.0) -> Classification:
    """`memory_guard` > 0 (pdserve's addition, off by default): an instance whose current
    tokens fill at least that fraction of its KV is overloaded too, whatever its w_i."""
    if not states:
        return Classification(0.0, (), ())
    mean = sum(s.weighted_load for s in states.values()) / len(states)
    limit = (1.0 + theta) * mean
    over = tuple(i for i, s in states.items() if s.weighted_load > limit
                 or 0 < memory_guard * s.capacity_tokens <= s.current_tokens)
    under = tuple(i for i, s in states.items() if s.current_tokens < limit)
    return Classification(mean, over, under)
