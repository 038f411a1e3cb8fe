"""A measured latency table on a grid of shapes, interpolated in log space.

Kernel latencies grow as powers of their sizes (a GEMM's time ~ m once compute-bound, an
attention's ~ length^2), so they are interpolated in log(size) -> log(latency), exact at
every measured point. Across the leading axes the interpolation is multilinear. Along the
last axis, the table's size axis (GEMM tokens, attention length, message bytes), it is one
of two, chosen per table by held-out error (`kernel_tables.py`):

- linear (a straight power law between neighbours), where neighbouring sizes can run
  different kernels (GEMMs, decode attention, NCCL's protocols: a smooth curve through a
  kernel switch overshoots);
- `smooth`: a monotone cubic (PCHIP, Fritsch and Carlson), where a latency floor turns into
  a power law (prefill attention, ~ a + b length^2). There the log-log curve is convex and a
  straight line between two measured sizes lies above it; the cubic follows the bend from
  the neighbours' slopes and, being monotone, never overshoots a measured neighbour.

A cell left unmeasured (NaN: a shape the collector ran out of memory on, or a row held out)
is filled along the size axis from its measured neighbours by the same interpolation, beyond
the last one with the last segment's slope (clamped to [0, 2]). A query outside the grid's
box is answered at the nearest point inside it (`clamp`); the caller scales that answer to
the query with a fitted curve (`perf/measured_ops.py`).

Held-out check: `without_every(5)` removes every 5th interior measured point of each series
along the size axis (its two ends stay, so what is measured is interpolation), and returns
the removed points, which the grid built without them then predicts (`bench/calibration.py`).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field

import numpy as np

HOLDOUT_EVERY = 5
Values = float | np.ndarray  # a scalar, or one per series / query


def pchip_slopes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The derivatives at the nodes `x` (increasing, shape (n,)) of the monotone cubic
    through `y` (shape (..., n)), as SciPy's `PchipInterpolator` sets them: inside, the
    weighted harmonic mean of the two secants (0 where they differ in sign or one is flat);
    at the ends, a three-point estimate kept shape-preserving."""
    h = np.diff(x)
    secant = np.diff(y, axis=-1) / h
    slopes = np.zeros_like(y)
    if y.shape[-1] == 2:
        slopes[..., 0] = slopes[..., 1] = secant[..., 0]
        return slopes
    if y.shape[-1] < 2:
        return slopes
    left, right = secant[..., :-1], secant[..., 1:]
    w1, w2 = 2 * h[1:] + h[:-1], h[1:] + 2 * h[:-1]
    flat = (np.sign(left) != np.sign(right)) | (left == 0) | (right == 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = (w1 / left + w2 / right) / (w1 + w2)
        slopes[..., 1:-1] = np.where(flat, 0.0, 1.0 / mean)
    slopes[..., 0] = _end_slope(h[0], h[1], secant[..., 0], secant[..., 1])
    slopes[..., -1] = _end_slope(h[-1], h[-2], secant[..., -1], secant[..., -2])
    return slopes


def _end_slope(h0: float, h1: float, m0: np.ndarray, m1: np.ndarray) -> np.ndarray:
    d = ((2 * h0 + h1) * m0 - h0 * m1) / (h0 + h1)
    d = np.where(np.sign(d) != np.sign(m0), 0.0, d)
    return np.where((np.sign(m0) != np.sign(m1)) & (np.abs(d) > 3 * np.abs(m0)), 3 * m0, d)


def hermite(x0: float, x1: float, y0: Values, y1: Values, d0: Values, d1: Values,
            t: Values) -> Values:
    """The cubic with values y0, y1 and slopes d0, d1 at x0, x1, at `t` in [0, 1] of the way
    (elementwise over arrays)."""
    h = x1 - x0
    t2, t3 = t * t, t * t * t
    return ((2 * t3 - 3 * t2 + 1) * y0 + (t3 - 2 * t2 + t) * h * d0
            + (-2 * t3 + 3 * t2) * y1 + (t3 - t2) * h * d1)


def _interpolate(x: np.ndarray, y: np.ndarray, xq: np.ndarray, smooth: bool) -> np.ndarray:
    """`y` at `xq` inside [x[0], x[-1]]: straight or monotone cubic between the nodes."""
    if not smooth or len(x) < 3:
        return np.interp(xq, x, y)
    slopes = pchip_slopes(x, y)
    i = np.clip(np.searchsorted(x, xq) - 1, 0, len(x) - 2)
    t = (xq - x[i]) / (x[i + 1] - x[i])
    return hermite(x[i], x[i + 1], y[i], y[i + 1], slopes[i], slopes[i + 1], t)


def _fill_series(sizes: np.ndarray, values: np.ndarray, smooth: bool) -> np.ndarray:
    """One series along the size axis in log-log space, holes filled."""
    known = np.isfinite(values) & (values > 0)
    if known.all() or not known.any():
        return values
    x, y = np.log(sizes[known]), np.log(values[known])
    lx = np.log(sizes)
    inside = (lx >= x[0]) & (lx <= x[-1])
    filled = np.exp(np.interp(lx, x, y))
    filled[inside] = np.exp(_interpolate(x, y, lx[inside], smooth))
    if known.sum() >= 2:
        slope_hi = np.clip((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0, 2.0)
        slope_lo = np.clip((y[1] - y[0]) / (x[1] - x[0]), 0.0, 2.0)
        above, below = lx > x[-1], lx < x[0]
        filled[above] = np.exp(y[-1] + slope_hi * (lx[above] - x[-1]))
        filled[below] = np.exp(y[0] + slope_lo * (lx[below] - x[0]))
    return filled


@dataclass(frozen=True)
class LogGrid:
    """Latencies in seconds on the product of sorted `axes` (every axis value > 0).
    `smooth`: a monotone cubic along the size axis (the last) instead of straight lines."""

    axes: tuple[np.ndarray, ...]
    seconds: np.ndarray  # NaN where unmeasured
    smooth: bool = False
    _filled: np.ndarray = field(init=False, repr=False, compare=False)
    _slopes: np.ndarray | None = field(init=False, repr=False, compare=False)
    _log_axes: tuple[np.ndarray, ...] = field(init=False, repr=False, compare=False)
    _bounds: tuple[tuple[float, float, list[float]], ...] = field(init=False, repr=False,
                                                                  compare=False)

    def __post_init__(self) -> None:
        if self.seconds.shape != tuple(len(a) for a in self.axes):
            raise ValueError("grid values do not match its axes")
        flat = self.seconds.reshape(-1, self.seconds.shape[-1])
        sizes = self.axes[-1].astype(float)
        filled = np.array([_fill_series(sizes, row, self.smooth)
                           for row in flat]).reshape(self.seconds.shape)
        # a series with nothing measured takes its neighbour's (along the first axes)
        if not np.isfinite(filled).all():
            filled = _fill_missing_series(filled)
        log_axes = tuple(np.log(a.astype(float)) for a in self.axes)
        object.__setattr__(self, "_filled", np.log(filled))
        object.__setattr__(self, "_slopes", pchip_slopes(log_axes[-1], self._filled)
                           if self.smooth and len(sizes) >= 3 else None)
        object.__setattr__(self, "_log_axes", log_axes)
        # per axis: its range and its log values as floats (`at` runs thousands of times
        # per model fit; Python's scalar arithmetic is several times numpy's on scalars)
        object.__setattr__(self, "_bounds", tuple(
            (float(a[0]), float(a[-1]), la.tolist()) for a, la in zip(self.axes, log_axes,
                                                                       strict=True)))

    def clamp(self, coords: tuple[float, ...]) -> tuple[float, ...]:
        """The nearest point of the grid's box to `coords`."""
        return tuple(float(min(max(c, a[0]), a[-1])) for c, a in zip(coords, self.axes,
                                                                        strict=True))

    def at(self, coords: tuple[float, ...]) -> float:
        """Seconds at `coords` (clamped into the box): multilinear in log-log space over
        the leading axes; along the size axis straight, or the monotone cubic (`smooth`:
        the neighbouring series' values and slopes are blended alike, so the curve is the
        same blend of theirs)."""
        corners: list[tuple[int, float]] = []  # per axis: lower index, weight of the upper
        for c, (low, high, log_axis) in zip(coords, self._bounds, strict=True):
            if len(log_axis) == 1:
                corners.append((0, 0.0))
                continue
            lc = math.log(min(max(c, low), high))
            i = min(max(bisect_left(log_axis, lc) - 1, 0), len(log_axis) - 2)
            w = (lc - log_axis[i]) / (log_axis[i + 1] - log_axis[i])
            corners.append((i, min(max(w, 0.0), 1.0)))
        block, slopes = self._filled, self._slopes
        for i, w in corners[:-1]:  # contract the leading axes one at a time
            upper = i + 1 if block.shape[0] > 1 else i
            block = block[i] * (1 - w) + block[upper] * w
            if slopes is not None:
                slopes = slopes[i] * (1 - w) + slopes[upper] * w
        i, w = corners[-1]
        if block.shape[0] == 1:
            return math.exp(block[0])
        if slopes is None:
            return math.exp(block[i] * (1 - w) + block[i + 1] * w)
        x = self._log_axes[-1]
        return math.exp(hermite(x[i], x[i + 1], block[i], block[i + 1], slopes[i],
                                slopes[i + 1], w))

    def measured_points(self) -> list[tuple[tuple[float, ...], float]]:
        index = np.argwhere(np.isfinite(self.seconds))
        return [(tuple(float(self.axes[d][i]) for d, i in enumerate(idx)),
                 float(self.seconds[tuple(idx)])) for idx in index]

    def without_every(self, every: int = HOLDOUT_EVERY
                      ) -> tuple[LogGrid, list[tuple[tuple[float, ...], float]]]:
        """This grid less every `every`-th interior measured point of each size series, and
        the points removed (coordinates, measured seconds)."""
        kept = self.seconds.copy()
        flat = kept.reshape(-1, kept.shape[-1])
        removed = []
        for row_index, row in enumerate(flat):
            measured = np.flatnonzero(np.isfinite(row))
            for rank, column in enumerate(measured[1:-1], start=1):
                if rank % every == every - 1:
                    idx = np.unravel_index(row_index * kept.shape[-1] + column, kept.shape)
                    removed.append((tuple(float(self.axes[d][i]) for d, i in enumerate(idx)),
                                    float(row[column])))
                    row[column] = np.nan
        return LogGrid(self.axes, kept, self.smooth), removed


def _fill_missing_series(values: np.ndarray) -> np.ndarray:
    """Series (along the last axis) with no measured point at all copy the nearest one
    along the flattened leading axes."""
    flat = values.reshape(-1, values.shape[-1]).copy()
    good = np.flatnonzero(np.isfinite(flat).all(axis=1))
    if not len(good):
        raise ValueError("a measured grid with no complete series")
    for row in np.flatnonzero(~np.isfinite(flat).all(axis=1)):
        flat[row] = flat[good[np.argmin(np.abs(good - row))]]
    return flat.reshape(values.shape)
