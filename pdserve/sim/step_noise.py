"""The spread of batch times a deployment measures around its performance model's mean.

A deterministic simulator prices every batch at its mean, so a TTFT tail made of slow
prefill batches (a worker's period on a shared machine varies with what else runs: the
fidelity runs measured a coefficient of variation of 0.10-0.16 for 512-token chunks and
about 0.2 for few-token ones) never appears in it. An in-situ model carries that spread
(`PerfModel.prefill_step_cv`, `perf/step_log.py`); each simulated batch with prefill work
then takes its modelled time times a mean-1 lognormal factor with that coefficient of
variation, drawn from a generator seeded per instance, so a run is still a pure function
of its configuration. Decode-only spans stay at their mean: a request's TPOT averages its
steps' spread away, and a span's closed form (`PerfModel.span_time_s`) needs fixed steps.
"""

from __future__ import annotations

import math
import random


class StepNoise:
    def __init__(self, cv: float, seed: int) -> None:
        self.sigma = math.sqrt(math.log1p(cv * cv))
        self.mu = -self.sigma * self.sigma / 2  # E[factor] = exp(mu + sigma^2/2) = 1
        self.rng = random.Random(seed)

    def factor(self) -> float:
        return self.rng.lognormvariate(self.mu, self.sigma)


def instance_noise(cv: float, seed: int, instance_id: int) -> StepNoise | None:
    """Instance `instance_id`'s generator (None when the model has no spread)."""
    return StepNoise(cv, seed * 1_000_003 + instance_id) if cv > 0 else None
