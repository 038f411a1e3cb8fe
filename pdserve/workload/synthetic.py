"""Synthetic workloads: Poisson or gamma arrivals at a rate, with lengths from a spec.

Length specs (input, then output):
  fixed:IN:OUT                  every request the same
  table:NAME_OR_PATH            rows drawn with replacement from a length table or trace
  uniform:LO-HI:LO-HI           integers uniform in each range (inclusive)
  lognormal:MEAN_IN:MEAN_OUT:SIGMA   log-normal with those means and log-space sigma
Gamma arrivals take a coefficient of variation `cv` (cv=1 is Poisson; larger is burstier).
"""

from __future__ import annotations

import numpy as np

from pdserve.workload.traces import load_length_table
from pdserve.workload.workload import Workload


def sample_lengths(spec: str, count: int, rng: np.random.Generator) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    kind, _, rest = spec.partition(":")
    parts = rest.split(":") if rest else []
    try:
        if kind == "fixed" and len(parts) == 2:
            return (np.full(count, int(parts[0]), dtype=np.int64),
                    np.full(count, int(parts[1]), dtype=np.int64))
        if kind == "table" and len(parts) >= 1:
            inputs, outputs = load_length_table(rest)
            rows = rng.integers(0, len(inputs), size=count)
            return inputs[rows], outputs[rows]
        if kind == "uniform" and len(parts) == 2:
            (lo_in, hi_in), (lo_out, hi_out) = (map(int, p.split("-")) for p in parts)
            return (rng.integers(lo_in, hi_in + 1, size=count),
                    rng.integers(lo_out, hi_out + 1, size=count))
        if kind == "lognormal" and len(parts) == 3:
            mean_in, mean_out, sigma = float(parts[0]), float(parts[1]), float(parts[2])

            def draw(mean: float) -> np.ndarray:
                mu = np.log(mean) - sigma**2 / 2
                return np.maximum(1, np.round(rng.lognormal(mu, sigma, size=count))).astype(
                    np.int64)

            return draw(mean_in), draw(mean_out)
    except ValueError as err:
        raise ValueError(f"bad length spec {spec!r}: {err}") from err
    raise ValueError(f"bad length spec {spec!r}; expected fixed:IN:OUT, table:NAME, "
                     f"uniform:LO-HI:LO-HI or lognormal:MEAN_IN:MEAN_OUT:SIGMA")


def synthetic_workload(num_requests: int, rate_rps: float, lengths: str,
                       arrival: str = "poisson", cv: float = 1.0, seed: int = 0) -> Workload:
    if num_requests < 1:
        raise ValueError(f"num_requests must be at least 1, got {num_requests}")
    if not rate_rps > 0:
        raise ValueError(f"rate_rps must be positive, got {rate_rps}")
    rng = np.random.default_rng(seed)
    if arrival == "poisson":
        gaps = rng.exponential(1.0 / rate_rps, size=num_requests)
    elif arrival == "gamma":
        if not cv > 0:
            raise ValueError(f"cv must be positive, got {cv}")
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate_rps * shape), size=num_requests)
    else:
        raise ValueError(f"arrival must be 'poisson' or 'gamma', got {arrival!r}")
    gaps[0] = 0.0
    inputs, outputs = sample_lengths(lengths, num_requests, rng)
    name = f"synthetic-{arrival}-{rate_rps:g}rps-{lengths}"
    return Workload(name, np.cumsum(gaps), inputs.astype(np.int64), outputs.astype(np.int64))
