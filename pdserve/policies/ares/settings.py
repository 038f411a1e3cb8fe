"""ARES's tunables (`../shared/papers/ares.md`, sec. 5; Alg. 1). The paper fixes the round
interval (1 s, line 3) and the refresh interval (k = 20 tokens, sec. 5.3) but not θ, H or
β_t; pdserve's choices, with the sensitivity study in docs/results/ares.md:

- θ = 0.1: an instance is overloaded when its time-weighted load is 10 % over the mean
  (line 14); smaller θ migrates on noise, larger leaves visible TPOT gaps.
- H = 2000 decode steps sampled at 8 points, β_j ∝ 0.8^j normalised (j = 0 is now):
  long enough to see a 30K-token reasoning request dominate an instance for minutes, short
  enough that predictions far out (the least accurate) weigh little
  (`instance/decode_forecast.py`).
- `predictive=False` is the paper's "vLLM + rescheduling" baseline (`reschedule-current`):
  the same three phases on the current load only (H = 0, no predictor, no lower bound on
  a candidate's remaining tokens, the memory check on its current tokens).
- `min_gain`: a migration must cut the time-weighted variance by at least this fraction
  (default 1 %), so a balanced cluster sees no migrations (sec. 5.1, "whether to migrate").
- `memory_guard` (pdserve's addition, 0 = off, the paper's Alg. 1): an instance whose
  current KV tokens fill at least this fraction of its capacity counts as overloaded
  whatever its predicted load: Alg. 1's memory check protects only the target, and an
  instance that is full now preempts now even if its load is predicted to drain.
- `cooldown_rounds`: a request just moved is not moved again for this many rounds (its KV
  may still be on the wire; moving it back and forth only costs transfers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.instance.decode_forecast import ForecastSettings


@dataclass(frozen=True)
class AresSettings:
    theta: float = 0.1
    interval_s: float = 1.0
    predictive: bool = True
    min_gain: float = 0.01
    cooldown_rounds: int = 10
    memory_guard: float = 0.0
    forecast: ForecastSettings = field(default_factory=ForecastSettings)

    def __post_init__(self) -> None:
        if self.theta < 0:
            raise ValueError(f"ares theta must not be negative, got {self.theta}")
        if not self.interval_s > 0:
            raise ValueError(f"ares interval_s must be positive, got {self.interval_s}")
        if not 0 <= self.min_gain < 1:
            raise ValueError(f"ares min_gain must be in [0, 1), got {self.min_gain}")

    def effective_forecast(self) -> ForecastSettings:
        """What the workers simulate: the current load only when not predictive."""
        if self.predictive:
            return self.forecast
        return ForecastSettings(predictor="none", horizon_steps=0, points=1,
                                refresh_every_tokens=self.forecast.refresh_every_tokens)
