"""Goodput: the highest rate scale at which SLO attainment stays at or above a target.

Search: evaluate scale 1; double (or halve) until the target is crossed, then bisect between
the highest passing and the lowest failing scale until they are within `rel_tol`. A caller
that has a guess (the planner's screen, a shorter run) starts there and steps by a smaller
factor (`start_scale`, `step`); the defaults are the plain search. This
assumes attainment falls as the rate rises, as the papers do; when it does not, the answer is
still a scale that passed, and every evaluated point is kept for the plot. A `run` may stop
once its verdict is decided (`Experiment.goodput` does: `metrics/attainment_watch.py`); the
search only reads the verdict, so it takes the same path and ends at the same scale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.metrics.summary import Summary


@dataclass(frozen=True)
class GoodputPoint:
    rate_scale: float
    rate_rps: float
    summary: Summary

    @property
    def decided_early(self) -> bool:
        """Its run stopped once its verdict was decided (`metrics/attainment_watch.py`):
        requests were left unfinished, its attainment is a bound on the whole run's (on the
        same side of the target) and its percentiles are over the requests done."""
        summary = self.summary
        return summary.completed + summary.rejected < summary.requests


@dataclass(frozen=True)
class GoodputResult:
    target_attainment: float
    rate_scale: float  # highest passing scale found; 0 when even the lowest tried failed
    rate_rps: float
    points: list[GoodputPoint]  # every evaluated scale, sorted by scale
    # every scale tried passed, up to the search's ceiling (`max_doublings` steps up): the
    # goodput is at least `rate_scale`, the SLOs never bound it within the search
    ceiling_reached: bool = False

    @property
    def rate_text(self) -> str:
        """The goodput as a person should read it: ">= x req/s" when the search's ceiling
        passed, "< x req/s" (x: the lowest rate tried) when nothing passed."""
        if self.ceiling_reached:
            return f">= {self.rate_rps:.2f} req/s"
        if self.rate_scale == 0 and self.points:
            return f"< {self.points[0].rate_rps:.2f} req/s"
        return f"{self.rate_rps:.2f} req/s"


def search_goodput(run: Callable[[float], Summary], base_rate_rps: float,
                   target_attainment: float, rel_tol: float, max_doublings: int = 12,
                   on_point: Callable[[GoodputPoint], None] | None = None,
                   start_scale: float = 1.0, step: float = 2.0,
                   min_scale: float = 0.0) -> GoodputResult:
    """`run(scale)` serves the workload at `scale` times its rate and summarizes it;
    `target_attainment` and `rel_tol` are the config's `goodput.target` and `.tolerance`.
    The bracket starts at `start_scale` and grows (or shrinks) by `step` at most
    `max_doublings` times, and never below `min_scale` (a run that could not be simulated:
    the goodput is then "below" the lowest scale tried)."""
    if not 0 < target_attainment <= 1:
        raise ValueError(f"target_attainment must be in (0, 1], got {target_attainment}")
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be positive, got {rel_tol}")
    if not (start_scale > 0 and step > 1):
        raise ValueError(f"start_scale must be positive and step above 1, got {start_scale}, "
                         f"{step}")
    points: dict[float, GoodputPoint] = {}

    def passes(scale: float) -> bool:
        if scale not in points:
            point = GoodputPoint(scale, scale * base_rate_rps, run(scale))
            points[scale] = point
            if on_point is not None:
                on_point(point)
        return points[scale].summary.slo_attainment >= target_attainment

    low = high = start_scale
    if passes(start_scale):
        for _ in range(max_doublings):
            high *= step
            if not passes(high):
                break
            low = high
        else:
            return _result(target_attainment, low, base_rate_rps, points, ceiling_reached=True)
    else:
        for _ in range(max_doublings):
            if low / step < min_scale:
                return _result(target_attainment, 0.0, base_rate_rps, points)
            low /= step
            if passes(low):
                break
            high = low
        else:
            return _result(target_attainment, 0.0, base_rate_rps, points)
    while high / low - 1 > rel_tol:
        middle = (low + high) / 2
        if passes(middle):
            low = middle
        else:
            high = middle
    return _result(target_attainment, low, base_rate_rps, points)


def _result(target: float, scale: float, base_rate_rps: float,
            points: dict[float, GoodputPoint], ceiling_reached: bool = False) -> GoodputResult:
    return GoodputResult(target, scale, scale * base_rate_rps,
                         [points[s] for s in sorted(points)], ceiling_reached)
