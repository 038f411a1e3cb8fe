"""A measured latency table on a grid of shapes, interpolated in log space.

Kernel latencies grow as powers of their sizes (a GEMM's time ~ m once compute-bound, an
attention's ~ length^2), so they are interpolated linearly in log(size) -> log(latency):
exact at every measured point, a straight power law between neighbours. The last axis is the
table's size axis (GEMM tokens, attention length, message bytes); a cell left unmeasured
(NaN: a shape the collector ran out of memory on, or a row held out) is filled along that
axis from its measured neighbours in the same log-log way, beyond the last one with the last
segment's slope (clamped to [0, 2]). A query outside the grid's box is answered at the
nearest point inside it (`clamp`); the caller scales that answer to the query with a fitted
curve (`perf/measured_ops.py`).

Held-out check: `without_every(5)` removes every 5th interior measured point of each series
along the size axis (its two ends stay, so what is measured is interpolation), and returns
the removed points, which the grid built without them then predicts (`bench/calibration.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HOLDOUT_EVERY = 5


def _fill_series(sizes: np.ndarray, values: np.ndarray) -> np.ndarray:
    """One series along the size axis in log-log space, holes filled."""
    known = np.isfinite(values) & (values > 0)
    if known.all() or not known.any():
        return values
    x, y = np.log(sizes[known]), np.log(values[known])
    filled = np.exp(np.interp(np.log(sizes), x, y))
    if known.sum() >= 2:
        slope_hi = np.clip((y[-1] - y[-2]) / (x[-1] - x[-2]), 0.0, 2.0)
        slope_lo = np.clip((y[1] - y[0]) / (x[1] - x[0]), 0.0, 2.0)
        lx = np.log(sizes)
        above, below = lx > x[-1], lx < x[0]
        filled[above] = np.exp(y[-1] + slope_hi * (lx[above] - x[-1]))
        filled[below] = np.exp(y[0] + slope_lo * (lx[below] - x[0]))
    return filled


@dataclass(frozen=True)
class LogGrid:
    """Latencies in seconds on the product of sorted `axes` (every axis value > 0)."""

    axes: tuple[np.ndarray, ...]
    seconds: np.ndarray  # NaN where unmeasured
    _filled: np.ndarray = field(init=False, repr=False, compare=False)
    _log_axes: tuple[np.ndarray, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.seconds.shape != tuple(len(a) for a in self.axes):
            raise ValueError("grid values do not match its axes")
        flat = self.seconds.reshape(-1, self.seconds.shape[-1])
        sizes = self.axes[-1].astype(float)
        filled = np.array([_fill_series(sizes, row) for row in flat]).reshape(self.seconds.shape)
        # a series with nothing measured takes its neighbour's (along the first axes)
        if not np.isfinite(filled).all():
            filled = _fill_missing_series(filled)
        object.__setattr__(self, "_filled", np.log(filled))
        object.__setattr__(self, "_log_axes", tuple(np.log(a.astype(float)) for a in self.axes))

    def clamp(self, coords: tuple[float, ...]) -> tuple[float, ...]:
        """The nearest point of the grid's box to `coords`."""
        return tuple(float(min(max(c, a[0]), a[-1])) for c, a in zip(coords, self.axes,
                                                                        strict=True))

    def at(self, coords: tuple[float, ...]) -> float:
        """Seconds at `coords` (clamped into the box), multilinear in log-log space."""
        corners: list[tuple[int, float]] = []  # per axis: lower index, weight of the upper
        for c, log_axis in zip(self.clamp(coords), self._log_axes, strict=True):
            if len(log_axis) == 1:
                corners.append((0, 0.0))
                continue
            lc = np.log(c)
            i = int(np.clip(np.searchsorted(log_axis, lc) - 1, 0, len(log_axis) - 2))
            w = (lc - log_axis[i]) / (log_axis[i + 1] - log_axis[i])
            corners.append((i, float(min(max(w, 0.0), 1.0))))
        block = self._filled
        for i, w in corners:  # contract one axis at a time
            lower = block[i]
            upper = block[i + 1] if block.shape[0] > 1 else lower
            block = lower * (1 - w) + upper * w
        return float(np.exp(block))

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
        return LogGrid(self.axes, kept), removed


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
