"""The ILP of AMPD's deployment planning (sec. 5, Eq. 5), solved with HiGHS.

    minimise Z  subject to
      (C1) Z >= tau_pre(n)  for each degree n with x(n) >= 1
      (C2) Z >= tau_dec(n)  for each degree n with y(n) >= 1
      (C3) sum_n n * x(n) + sum_n n * y(n) <= N

Two changes make the formulation exact for what it models (issue 13):
  * "where x(n) >= 1" is not linear; it becomes binary indicators. u[n, k] = 1 when the
    prefill side runs k replicas of degree n; (C1) is Z >= tau_pre(n, k) * u[n, k], so a
    configuration's latency bounds Z only when it is used.
  * Eq. 5's tau(n) ignores the replica count, although k replicas split the load k ways;
    here tau(n, k) is the latency of one replica of degree n carrying 1/k of the load.
Each phase uses one degree (sum_k,n u = 1, likewise for decode): with mixed degrees the
split of the load between unequal replicas is itself a decision the paper does not model.
The top configurations come from re-solving with a cut that excludes each found pair. Ties
in Z (the bottleneck phase decides it) are broken towards the lower latency of the other
phase: the objective adds TIE_BREAK times the chosen configurations' tau.
`tau` values are normalised by the phase's SLO (p95 TTFT / TTFT SLO, p95 ITL / ITL SLO), so
the two phases' latencies are comparable in one Z.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

INFEASIBLE = 1e6  # tau of a configuration that cannot serve the load at all
TIE_BREAK = 1e-4


@dataclass(frozen=True)
class Deployment:
    prefill_degree: int
    prefill_replicas: int
    decode_degree: int
    decode_replicas: int
    z: float  # the objective: the worse of the two normalised p95 latencies
    tau_prefill: float
    tau_decode: float

    @property
    def gpus(self) -> int:
        return (self.prefill_degree * self.prefill_replicas
                + self.decode_degree * self.decode_replicas)

    def describe(self) -> str:
        return (f"{self.prefill_replicas}P x TP{self.prefill_degree} + "
                f"{self.decode_replicas}D x TP{self.decode_degree} ({self.gpus} GPUs)")


def solve(tau_prefill: Mapping[tuple[int, int], float],
          tau_decode: Mapping[tuple[int, int], float], gpus: int,
          top: int = 3) -> list[Deployment]:
    """The `top` best deployments on `gpus` GPUs; tau maps (degree, replicas) to the
    normalised p95 latency of one replica of that degree carrying 1/replicas of the load."""
    pre = [key for key in sorted(tau_prefill) if key[0] * key[1] < gpus]
    dec = [key for key in sorted(tau_decode) if key[0] * key[1] < gpus]
    if not pre or not dec:
        raise ValueError(f"no prefill and decode configuration fits in {gpus} GPUs")
    n_vars = 1 + len(pre) + len(dec)  # Z, u (prefill), v (decode)
    rows: list[np.ndarray] = []
    lower: list[float] = []
    upper: list[float] = []

    def add(row: np.ndarray, lo: float, hi: float) -> None:
        rows.append(row)
        lower.append(lo)
        upper.append(hi)

    one_prefill, one_decode, capacity = (np.zeros(n_vars) for _ in range(3))
    one_prefill[1:1 + len(pre)] = 1
    one_decode[1 + len(pre):] = 1
    add(one_prefill, 1, 1)
    add(one_decode, 1, 1)
    for j, (degree, count) in enumerate(pre):
        capacity[1 + j] = degree * count
    for j, (degree, count) in enumerate(dec):
        capacity[1 + len(pre) + j] = degree * count
    add(capacity, 0, gpus)  # (C3)
    for offset, keys, tau in ((1, pre, tau_prefill), (1 + len(pre), dec, tau_decode)):
        for j, key in enumerate(keys):  # (C1), (C2): tau * indicator - Z <= 0
            row = np.zeros(n_vars)
            row[0] = -1
            row[offset + j] = min(tau[key], INFEASIBLE)
            add(row, -np.inf, 0)
    cost = np.zeros(n_vars)
    cost[0] = 1
    cost[1:1 + len(pre)] = [TIE_BREAK * min(tau_prefill[key], INFEASIBLE) for key in pre]
    cost[1 + len(pre):] = [TIE_BREAK * min(tau_decode[key], INFEASIBLE) for key in dec]
    integrality = np.ones(n_vars)
    integrality[0] = 0
    bounds = Bounds(np.zeros(n_vars), np.r_[np.inf, np.ones(n_vars - 1)])
    found: list[Deployment] = []
    for _ in range(top):
        result = milp(cost, constraints=LinearConstraint(np.array(rows), lower, upper),
                      integrality=integrality, bounds=bounds)
        if result.x is None:
            break
        u = int(np.argmax(result.x[1:1 + len(pre)]))
        v = int(np.argmax(result.x[1 + len(pre):]))
        (pd, pk), (dd, dk) = pre[u], dec[v]
        found.append(Deployment(pd, pk, dd, dk, float(result.x[0]), tau_prefill[pre[u]],
                                tau_decode[dec[v]]))
        cut = np.zeros(n_vars)  # exclude this pair: u + v <= 1
        cut[1 + u] = cut[1 + len(pre) + v] = 1
        add(cut, 0, 1)
    return found
