"""Verdicts that hold: a comparison of policies, each at its own best deployment, measured over
seeds with a run length shown stationary, reported as mean and 95 % interval; a difference is a
win or a loss only when the intervals separate, otherwise a tie, and the verdict says so.

A `Comparison` is a workload with its SLOs and GPUs (a base `Config`), a GPU count, and the
`Contender`s (search spaces, as `pdserve plan --policy` names them, plus settings of the
contender's own, such as its predictor). `VerdictRun` carries it out in two stages:

1. tune     every contender by the same planner search with the same budget
            (`planner.search`: screen -> short -> long runs, `SearchBudget`); its best row is
            its deployment. With `tune=False` every contender runs at the base config's
            deployment (a paper's fixed setup), and the output says so.
2. measure  that deployment's goodput on `Measurement.seeds` samples (trace windows or
            synthetic seeds, `fidelity.WorkloadSamples`; a trace shorter than a run is
            replayed end to end), each a goodput search bisected to
            `rel_tol` (1 %); the run length is doubled until doubling moves the goodput by less
            than `stationary_tol` (3 %), at most `max_doublings` times
            (`stationary_goodput`); a seed that never settles is flagged.

`Interval.of` (the planner's: mean, Student t 95 %, its top widened by the search's
tolerance) gives each contender's interval; `outcome_of` calls win / tie / loss of the first
contender (the claim's policy) against each other one. Everything is a deterministic function
of the seeds, unless a tuning search stops at its time limit (`TunedContender.stopped_at_limit`
says so). `VerdictRun` is the one writer of the `ContenderResult`s.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pdserve.cluster.hardware import parse_instances
from pdserve.config import Config
from pdserve.planning.candidates import Candidate, Deployment
from pdserve.planning.fidelity import Trial, TrialResult, WorkloadSamples, run_trial
from pdserve.planning.multi_fidelity import SearchBudget
from pdserve.planning.outcome import Interval, policy_rows
from pdserve.planning.planner import search
from pdserve.planning.run_length import Fidelity
from pdserve.policies.search_spaces import SEARCH_SPACES

WIN, TIE, LOSS = "win", "tie", "loss"


@dataclass(frozen=True)
class Contender:
    label: str
    policy: str  # search space(s), comma-separated, as `pdserve plan --policy` takes them
    values: tuple[tuple[str, Any], ...] = ()  # config values of this contender alone

    def config(self, base: Config) -> Config:
        return base.with_values(dict(self.values))


@dataclass(frozen=True)
class Measurement:
    """How a tuned deployment's goodput is measured."""

    seeds: int = 3
    duration_s: float = 40.0  # of arrivals at the goodput rate, at the first run length
    min_requests: int = 400
    lifetimes: float = 2.0  # and at least this many request lifetimes (`Fidelity`)
    rel_tol: float = 0.01  # the goodput search's bisection ends within this
    step: float = 1.1  # the search's bracket from its guess
    stationary_tol: float = 0.03  # doubling the run moves goodput by less than this
    max_doublings: int = 3  # run lengths tried: 1, 2, 4, ... 2^max_doublings

    def __post_init__(self) -> None:
        if self.seeds < 3:
            raise ValueError(f"a verdict needs at least 3 seeds, got {self.seeds}")
        if not (0 < self.rel_tol <= 0.01):
            raise ValueError(f"goodput must be bisected to 1 % or finer, got {self.rel_tol}")
        if self.max_doublings < 1:
            raise ValueError("the stationarity check doubles the run at least once")

    def fidelity(self, factor: int) -> Fidelity:
        """The run length `factor` times the first (named "long": trace windows spread over
        the seeds, `WorkloadSamples.values`)."""
        return Fidelity("long", self.duration_s * factor, self.min_requests * factor,
                        self.rel_tol, self.step, self.lifetimes * factor)


@dataclass(frozen=True)
class Comparison:
    name: str
    base: Config  # workload, SLOs, model and GPU type (and, with tune=False, the deployment)
    gpus: int
    contenders: tuple[Contender, ...]  # the first is the claim's policy
    budget: SearchBudget  # the same search for every contender
    measurement: Measurement = field(default_factory=Measurement)
    tune: bool = True

    def __post_init__(self) -> None:
        if len(self.contenders) < 2:
            raise ValueError("a comparison needs at least two contenders")
        if len({c.label for c in self.contenders}) != len(self.contenders):
            raise ValueError("contender labels must differ")


@dataclass(frozen=True)
class TunedContender:
    contender: Contender
    candidate: Candidate | None  # its best deployment; None: nothing met the SLOs
    description: str  # of the deployment
    tuned_goodput_rps: float  # the search's figure for it
    screened: int  # candidates the search priced
    stopped_at_limit: bool  # the search left trials unfinished (not deterministic then)


@dataclass(frozen=True)
class StationaryGoodput:
    goodput_rps: float  # at the longest run length tried
    factor: int  # that run length, as a multiple of the first
    stationary: bool  # the last doubling moved goodput by less than the tolerance
    history: tuple[float, ...]  # goodput at factors 1, 2, 4, ...


@dataclass(frozen=True)
class SeedResult:
    seed: int
    goodput_rps: float
    factor: int
    stationary: bool
    history: tuple[float, ...]
    requests: int  # replayed by the final run at the goodput rate
    capped: bool  # the workload ran out: the final run replayed fewer requests than asked
    ttft_p90_s: float
    tpot_p90_s: float


@dataclass(frozen=True)
class ContenderResult:
    label: str
    deployment: str
    settings: dict[str, Any]
    goodput: Interval  # req/s over the seeds
    seeds: tuple[SeedResult, ...]
    tuned_goodput_rps: float
    stopped_at_limit: bool

    @property
    def stationary(self) -> bool:
        return all(s.stationary for s in self.seeds)

    @property
    def capped(self) -> bool:
        return any(s.capped for s in self.seeds)

    @property
    def run_requests(self) -> int:
        return max((s.requests for s in self.seeds), default=0)

    @property
    def run_s(self) -> float:
        """Seconds of arrivals of the longest final run, at its goodput rate."""
        return max((s.requests / s.goodput_rps for s in self.seeds if s.goodput_rps > 0),
                   default=0.0)


@dataclass(frozen=True)
class Outcome:
    """The first contender against another: win, tie or loss by the intervals."""

    against: str
    result: str  # WIN, TIE or LOSS
    gain: float  # mean over mean, minus 1


@dataclass(frozen=True)
class VerdictResult:
    comparison: str
    gpus: int
    tuned: bool
    contenders: tuple[ContenderResult, ...]
    outcomes: tuple[Outcome, ...]


def outcome_of(first: Interval, other: Interval) -> str:
    """WIN when `first`'s interval lies wholly above `other`'s, LOSS when wholly below,
    otherwise TIE (intervals that overlap, or touch, cannot tell the two apart)."""
    if first.low > other.high:
        return WIN
    if first.high < other.low:
        return LOSS
    return TIE


def stationary_goodput(goodput_at: Callable[[int, float], float], tolerance: float,
                       max_doublings: int) -> StationaryGoodput:
    """`goodput_at(factor, guess)` measures at `factor` times the first run length (the search
    starting at `guess`, 0 for none). Doubles until a doubling moves the goodput by less than
    `tolerance` (two zeros are stationary), at most `max_doublings` times."""
    history = [goodput_at(1, 0.0)]
    factor = 1
    for _ in range(max_doublings):
        factor *= 2
        history.append(goodput_at(factor, history[-1]))
        before, after = history[-2], history[-1]
        if (before == after == 0.0) or (before > 0 and abs(after / before - 1) < tolerance):
            return StationaryGoodput(after, factor, True, tuple(history))
    return StationaryGoodput(history[-1], factor, False, tuple(history))


def fixed_candidate(base: Config) -> tuple[Candidate, str]:
    """The base config's own deployment as a candidate (`tune=False`), and its description."""
    name, cluster = base.policy.name, base.cluster
    space = SEARCH_SPACES.get(name)
    tp = base.perf.tp or 1
    if isinstance(cluster.instances, str):  # groups name their degree, or take the setup's
        every_degree = all(g.tp for g in parse_instances(cluster.instances))
        text = cluster.instances if every_degree else f"{cluster.instances} TP{tp}"
    elif space is not None and space.shape == "colocated":
        text = f"{cluster.instances} x TP{tp}"
    else:
        text = f"{cluster.prefill}P + {cluster.decode}D TP{tp}" + (
            f" + {cluster.reserve} reserve" if cluster.reserve else "")
    return Candidate(name, (("policy.name", name),), Deployment(())), f"{text} (fixed)"


def tune(comparison: Comparison, contender: Contender) -> TunedContender:
    """The contender's best deployment by the planner's search (`tune=False`: the base's)."""
    base = contender.config(comparison.base)
    if not comparison.tune:
        candidate, text = fixed_candidate(base)
        return TunedContender(contender, candidate, text, 0.0, 0, False)
    outcome, screened = search(base, contender.policy, comparison.gpus, comparison.budget)
    rows = [r for r in policy_rows(outcome, comparison.budget.long.rel_tol)
            if r.goodput.mean > 0]
    if not rows:
        why = ("the search stopped at its time limit before any trial met the SLOs"
               if outcome.stopped_at_limit else "nothing meets the SLOs")
        return TunedContender(contender, None, why, 0.0, screened, outcome.stopped_at_limit)
    best = rows[0]
    return TunedContender(contender, best.candidate, best.candidate.describe(),
                          best.goodput.mean, screened,
                          outcome.stopped_at_limit)


@dataclass(frozen=True)
class _SeedTask:
    base: Config  # the contender's config
    candidate: Candidate
    measurement: Measurement
    seed: int
    guess_rps: float


def _measure_seed(task: _SeedTask) -> SeedResult:
    samples = WorkloadSamples(task.base, task.measurement.seeds)
    m, trials = task.measurement, {}

    def goodput_at(factor: int, guess_rps: float) -> float:
        trial = Trial(0, task.candidate, m.fidelity(factor), task.seed,
                      guess_rps or task.guess_rps or samples.full.mean_rate_rps)
        trials[factor] = run_trial(trial, samples)
        return trials[factor].goodput_rps

    found = stationary_goodput(goodput_at, m.stationary_tol, m.max_doublings)
    last: TrialResult = trials[found.factor]
    # the workload ran out: the final run replayed fewer requests than its length asks for
    # (a synthetic cap, or a window of a trace that the base config fixed)
    capped = 0 < last.requests < m.fidelity(found.factor).requests(last.goodput_rps,
                                                                   samples.scale)
    return SeedResult(task.seed, found.goodput_rps, found.factor, found.stationary,
                      found.history, last.requests, capped, last.ttft_p90_s, last.tpot_p90_s)


def _map(tasks: Sequence[_SeedTask], jobs: int) -> list[SeedResult]:
    if jobs <= 1 or len(tasks) <= 1:
        return [_measure_seed(t) for t in tasks]
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    with context.Pool(min(jobs, len(tasks))) as pool:
        return pool.map(_measure_seed, tasks, chunksize=1)


class VerdictRun:
    """Tunes and measures every contender of one comparison."""

    def __init__(self, comparison: Comparison,
                 on_progress: Callable[[str], None] | None = None) -> None:
        self.comparison = comparison
        self.on_progress = on_progress or (lambda text: None)
        self.results: list[ContenderResult] = []

    def run(self) -> VerdictResult:
        c, m = self.comparison, self.comparison.measurement
        tuned = []
        for contender in c.contenders:
            tuned.append(tune(c, contender))
            t = tuned[-1]
            self.on_progress(f"{c.name}: tuned {contender.label}: "
                             + t.description
                             + (f" ({t.tuned_goodput_rps:.3g} req/s)" if c.tune else ""))
        tasks = [_SeedTask(t.contender.config(c.base), t.candidate, m, seed,
                           t.tuned_goodput_rps)
                 for t in tuned if t.candidate is not None for seed in range(m.seeds)]
        measured = iter(_map(tasks, c.budget.jobs))
        self.results = []
        for t in tuned:
            seeds = tuple(next(measured) for _ in range(m.seeds)) if t.candidate else ()
            values = [s.goodput_rps for s in seeds] or [0.0] * m.seeds
            self.results.append(ContenderResult(
                t.contender.label, t.description,
                t.candidate.settings if t.candidate else {},
                Interval.of(values, m.rel_tol), seeds, t.tuned_goodput_rps,
                t.stopped_at_limit))
        first = self.results[0]
        outcomes = tuple(Outcome(r.label, outcome_of(first.goodput, r.goodput),
                                 first.goodput.mean / r.goodput.mean - 1
                                 if r.goodput.mean > 0 else math.inf)
                         for r in self.results[1:])
        return VerdictResult(c.name, c.gpus, c.tune, tuple(self.results), outcomes)


def format_verdict(result: VerdictResult) -> str:
    """The printed table: a row per contender, then the first contender's outcomes."""
    lines = [f"== {result.comparison} ({result.gpus} GPUs; "
             + ("each contender tuned by the same planner search" if result.tuned
                else "every contender at the same fixed deployment, not tuned") + ")",
             f"{'contender':<26}{'deployment':<40}{'goodput req/s (95% CI)':>30}"
             f"{'seeds':>6}{'run':>18}  stationary"]
    for r in result.contenders:
        g = r.goodput
        half = (g.high - g.low) / 2
        run = f"{r.run_requests} req/{r.run_s:.0f}s"
        flags = "yes" if r.stationary else "NO (cap)"
        if r.capped:
            flags += ", workload ran out"
        if r.stopped_at_limit:
            flags += ", search cut"
        lines.append(f"{r.label:<26}{r.deployment[:39]:<40}"
                     f"{f'{g.mean:.4g} +- {half:.2g} [{g.low:.4g}, {g.high:.4g}]':>30}"
                     f"{len(r.seeds):>6}{run:>18}  {flags}")
    first = result.contenders[0].label
    for o in result.outcomes:
        word = {WIN: "WIN", LOSS: "LOSS", TIE: "TIE (the 95 % intervals overlap)"}[o.result]
        lines.append(f"{first} vs {o.against}: {o.gain:+.1%} -> {word}")
    return "\n".join(lines)


def verdict_json(result: VerdictResult) -> dict[str, Any]:
    data = asdict(result)
    for contender, r in zip(data["contenders"], result.contenders, strict=True):
        contender.update(stationary=r.stationary, capped=r.capped, run_requests=r.run_requests,
                         run_s=r.run_s)
    return data

