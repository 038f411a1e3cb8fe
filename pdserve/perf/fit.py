"""Least-squares fits of the fitted performance model from profile samples, with R^2.

Samples are plain tuples so a profiler (live engine) or a model (roofline) can produce them:
  prefill   (new_tokens, prior_tokens, seconds)     one request's chunk per sample
  decode    (batch_size, context_tokens, seconds)   one step per sample
  transfer  (bytes, calls, seconds)
Samples span orders of magnitude (a 16-token chunk to a 2048-token one), so the fit
minimises relative error (each row weighted by 1/seconds), and every coefficient that is a
cost (all but the batch-1 adjustment) is kept non-negative by an active-set loop: a
negative one is pinned to 0 and the rest refitted, so no prediction can go negative. R^2 is
reported on the unweighted residuals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pdserve.perf.fitted import DecodeCoeffs, PrefillCoeffs, TransferCoeffs
from pdserve.types import attn_units


def _least_squares(columns: list[np.ndarray], target: np.ndarray,
                   free: frozenset[int] = frozenset()) -> tuple[np.ndarray, float]:
    """Relative-error least squares with coefficients >= 0 except those in `free`."""
    design = np.column_stack(columns)
    weights = 1.0 / np.maximum(target, 1e-12)
    active = list(range(design.shape[1]))
    coeffs = np.zeros(design.shape[1])
    while active:
        solution, *_ = np.linalg.lstsq(design[:, active] * weights[:, None], target * weights,
                                       rcond=None)
        negative = [i for i, c in zip(active, solution, strict=True) if c < 0 and i not in free]
        if not negative:
            coeffs[:] = 0.0
            coeffs[active] = solution
            break
        active.remove(min(negative, key=lambda i: solution[active.index(i)]))
    residual = target - design @ coeffs
    total = float(((target - target.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    return coeffs, r2


def _as_array(samples: Sequence[tuple[float, float, float]], what: str, minimum: int) -> np.ndarray:
    data = np.asarray(samples, dtype=float)
    if data.ndim != 2 or data.shape[1] != 3:
        raise ValueError(f"{what} samples must be (x, y, seconds) triples")
    if len(data) < minimum:
        raise ValueError(f"need at least {minimum} {what} samples to fit, got {len(data)}")
    return data


def fit_prefill(samples: Sequence[tuple[float, float, float]]) -> PrefillCoeffs:
    data = _as_array(samples, "prefill", 3)
    new, prior, seconds = data.T
    units = np.array([attn_units(int(n), int(p)) for n, p in zip(new, prior, strict=True)],
                     dtype=float)
    (a, b, c), r2 = _least_squares([np.ones_like(new), new, units], seconds)
    return PrefillCoeffs(float(a), float(b), float(c), r2)


def fit_decode(samples: Sequence[tuple[float, float, float]]) -> DecodeCoeffs:
    data = _as_array(samples, "decode", 4)
    batch, context, seconds = data.T
    batch1 = (batch == 1).astype(float)
    columns = [np.ones_like(batch), batch, context]
    if 0 < batch1.sum() < len(batch):
        columns.append(batch1)
    coeffs, r2 = _least_squares(columns, seconds, free=frozenset({3}))
    extra = float(coeffs[3]) if len(coeffs) == 4 else 0.0
    return DecodeCoeffs(float(coeffs[0]), float(coeffs[1]), float(coeffs[2]), extra, r2)


def fit_transfer(samples: Sequence[tuple[float, float, float]]) -> TransferCoeffs:
    data = _as_array(samples, "transfer", 2)
    num_bytes, calls, seconds = data.T
    (alpha, inv_beta), r2 = _least_squares([calls, num_bytes], seconds)
    if inv_beta <= 0:
        raise ValueError("transfer samples do not grow with size; cannot fit a bandwidth")
    return TransferCoeffs(float(alpha), float(1.0 / inv_beta), r2)
