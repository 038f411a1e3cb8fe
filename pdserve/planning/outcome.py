"""What a plan concludes, as plain data: a row per search space (its best candidate, goodput
with a 95 % interval over seeds, latencies at that rate), the winner and its margin (a tie
when the intervals overlap), the Pareto points, and the screen's error against the
simulations. Built from the search's records (`multi_fidelity.py`); printed and written by
`report.py` and `plot.py`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from scipy import stats

from pdserve.planning.candidates import Candidate
from pdserve.planning.fidelity import TrialResult
from pdserve.planning.multi_fidelity import CandidateRecord, SearchOutcome


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    samples: int

    @classmethod
    def of(cls, values: list[float], resolution: float = 0.0) -> Interval:
        """Mean and 95 % t-interval over the values (a single value: no width). Each value
        is a goodput search's highest passing rate, the true one up to `resolution` (its
        relative tolerance) above it: the interval's top widens by that much, so seeds that
        land on the same step of the search do not read as no uncertainty. A rate is never
        negative: the bottom stops at 0 (two seeds of 0 and 20 gave [-2.6, 23.9])."""
        mean = statistics.fmean(values)
        if len(values) < 2:
            return cls(mean, mean, mean, len(values))
        half = stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(
            len(values))
        return cls(mean, max(0.0, mean - half), mean + half + resolution * mean, len(values))

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high


@dataclass(frozen=True)
class PolicyRow:
    space: str
    candidate: Candidate
    goodput: Interval  # requests per second, over seeds
    fidelity: str  # "long" (confirmed over seeds) or "short" (not confirmed in time)
    ttft_p50_s: float  # at the goodput rate, mean over seeds
    ttft_p90_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    screen_goodput_rps: float
    screened: int  # candidates of this space the screen priced
    simulated: int  # of them, simulated
    # a run of its goodput met the SLOs at every rate tried (`TrialResult.ceiling_reached`):
    # the goodput is a lower bound
    ceiling_reached: bool = False
    # at the goodput rate, the attainment with the wait for a decode slot counted in TTFT
    # (mean over seeds): well below the target, a decode pool falls behind
    attainment_with_decode_queue: float = math.nan

    @property
    def gpus(self) -> int:
        return self.candidate.gpus

    @property
    def per_gpu(self) -> Interval:
        g = self.goodput
        return Interval(g.mean / self.gpus, g.low / self.gpus, g.high / self.gpus, g.samples)


@dataclass(frozen=True)
class Verdict:
    winner: PolicyRow | None
    runner_up: PolicyRow | None
    margin: float  # winner's goodput per GPU over the runner-up's, minus 1
    tied_with: tuple[str, ...]  # spaces whose intervals overlap the winner's
    twins: tuple[str, ...] = ()  # spaces whose best simulates exactly as the winner


@dataclass(frozen=True)
class ParetoPoint:
    space: str
    label: str
    goodput_per_gpu: float
    ttft_p90_s: float
    tpot_p90_s: float
    fidelity: str


@dataclass(frozen=True)
class ScreenError:
    """Screen goodput over simulated goodput, minus 1, across the simulated candidates."""

    fidelity: str  # against the short runs or the long ones
    candidates: int
    median: float  # signed: above 0 the screen is optimistic
    median_abs: float
    p90_abs: float


def _mean(results: list[TrialResult], name: str) -> float:
    values = [getattr(r, name) for r in results if not math.isnan(getattr(r, name))]
    return statistics.fmean(values) if values else math.nan


def _row(space: str, records: list[CandidateRecord], resolution: float) -> PolicyRow | None:
    confirmed = [r for r in records if r.long]
    shorted = [r for r in records if r.short is not None]
    if confirmed:
        best = max(confirmed, key=lambda r: statistics.fmean(t.goodput_rps for t in r.long))
        results, fidelity = best.long, "long"
    elif shorted:
        best = max(shorted, key=lambda r: r.short.goodput_rps)  # type: ignore[union-attr]
        assert best.short is not None
        results, fidelity = [best.short], "short"
    else:
        return None
    interval = Interval.of([t.goodput_rps for t in results], resolution)
    return PolicyRow(space, best.candidate, interval,
                     fidelity, _mean(results, "ttft_p50_s"), _mean(results, "ttft_p90_s"),
                     _mean(results, "tpot_p50_s"), _mean(results, "tpot_p90_s"),
                     best.screen.goodput_rps, len(records),
                     sum(1 for r in records if r.short is not None or r.long),
                     any(t.ceiling_reached for t in results),
                     _mean(results, "attainment_with_decode_queue"))


def policy_rows(outcome: SearchOutcome, resolution: float = 0.0) -> list[PolicyRow]:
    """A row per space that has a simulated candidate, best goodput per GPU first;
    `resolution`: the long runs' goodput search tolerance (`Interval.of`)."""
    by_space: dict[str, list[CandidateRecord]] = {}
    for record in outcome.records:
        by_space.setdefault(record.candidate.space, []).append(record)
    rows = [row for space, records in by_space.items()
            if (row := _row(space, records, resolution))]
    return sorted(rows, key=lambda r: (r.fidelity != "long", -r.per_gpu.mean))


def verdict(rows: list[PolicyRow]) -> Verdict:
    """The best confirmed row (or the best short one when none was confirmed)."""
    if not rows or rows[0].goodput.mean <= 0:
        return Verdict(None, None, math.nan, ())
    winner = rows[0]
    key = winner.candidate.simulation_key
    twins = tuple(r.space for r in rows[1:] if r.candidate.simulation_key == key)
    contenders = [r for r in rows[1:] if r.fidelity == winner.fidelity
                  and r.candidate.simulation_key != key]
    runner = contenders[0] if contenders else None
    margin = (winner.per_gpu.mean / runner.per_gpu.mean - 1
              if runner and runner.per_gpu.mean > 0 else math.inf)
    tied = tuple(r.space for r in contenders if r.goodput.samples > 1
                 and winner.goodput.samples > 1 and r.per_gpu.overlaps(winner.per_gpu))
    return Verdict(winner, runner, margin, tied, twins)


def pareto_points(outcome: SearchOutcome) -> list[ParetoPoint]:
    """Every simulated candidate at its best fidelity (the plot's data)."""
    points = []
    for record in outcome.records:
        results = record.long or ([record.short] if record.short else [])
        if not results or results[0].goodput_rps <= 0:
            continue
        gpus = record.candidate.gpus
        points.append(ParetoPoint(
            record.candidate.space, record.candidate.describe(),
            statistics.fmean(t.goodput_rps for t in results) / gpus,
            _mean(results, "ttft_p90_s"), _mean(results, "tpot_p90_s"),
            "long" if record.long else "short"))
    return points


def pareto_front(points: list[ParetoPoint], latency: str) -> list[ParetoPoint]:
    """The points no other beats on both goodput per GPU and `latency` (an attribute)."""
    ordered = sorted(points, key=lambda p: (getattr(p, latency), -p.goodput_per_gpu))
    front, best = [], -math.inf
    for point in ordered:
        if point.goodput_per_gpu > best:
            front.append(point)
            best = point.goodput_per_gpu
    return front


def screen_error(outcome: SearchOutcome, fidelity: str = "short") -> ScreenError | None:
    """Against the short runs, or the mean of the long runs (`fidelity` "long")."""
    errors = []
    for record in outcome.records:
        runs = ([record.short] if record.short else []) if fidelity == "short" else record.long
        runs = [r for r in runs if not r.error]
        if runs and (simulated := statistics.fmean(r.goodput_rps for r in runs)) > 0:
            errors.append(record.screen.goodput_rps / simulated - 1)
    if not errors:
        return None
    absolute = sorted(abs(e) for e in errors)
    return ScreenError(fidelity, len(errors), statistics.median(errors),
                       statistics.median(absolute),
                       absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))])
