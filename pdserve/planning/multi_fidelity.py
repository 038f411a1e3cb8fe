"""The planner's search: three fidelities of one performance model, the same budget for every
search space, parallel across processes, within a time limit.

1. screen     every candidate, analytically (`screen.py`), in this process
2. short      per space the `shortlist` best by the screen (the best deployments with the
              policy's default-order knobs first, then the knob variants of the best), one
              short sample each (`fidelity.py`), the goodput search starting at the screen's
3. long       the top few: the best short run of each of the `verify` spaces whose best
              short run is best (goodput per GPU; different deployments first), on `seeds`
              long samples each, the search starting at the short run's goodput; then, while
              time lasts, any space whose short run beats the best confirmed one, in turn
The screen and the short trials give every space the same budget; short trials go
round-robin over the spaces (each space's first, then each one's second, ...), so when the
time runs out every space has had the same share. The short stage takes new trials
until `SHORT_SHARE` of the time is gone; whatever runs at the deadline is stopped (the pool
is terminated), and the plan reports what finished. Candidates that simulate alike
(`Candidate.simulation_key`: TaiChi's aggregation points are `colocated`) share their trials,
and the long stage confirms distinct ones. `MultiFidelitySearch` is the one writer
of the `CandidateRecord`s.
"""

from __future__ import annotations

import math
import multiprocessing
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.pool import AsyncResult

from pdserve.config import Config
from pdserve.planning.candidates import Candidate
from pdserve.planning.fidelity import Trial, TrialResult, evaluate, init_worker
from pdserve.planning.run_length import Fidelity
from pdserve.planning.screen import Screen, ScreenEstimate

SHORT_SHARE = 0.4  # of the time limit, for the short stage's new trials
RESERVE_S = 1.0  # kept back from the time limit to write the outcome


@dataclass(frozen=True)
class SearchBudget:
    time_limit_s: float
    jobs: int  # worker processes
    shortlist: int  # short trials per space
    verify: int  # spaces whose best short run long runs confirm
    seeds: int  # long samples per confirmed candidate
    short: Fidelity
    long: Fidelity

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise ValueError(f"the time limit must be positive, got {self.time_limit_s}")
        if self.jobs < 1 or self.shortlist < 1 or self.verify < 0 or self.seeds < 1:
            raise ValueError(f"jobs, shortlist and seeds must be at least 1 and verify at "
                             f"least 0, got {self.jobs}, {self.shortlist}, {self.verify}, "
                             f"{self.seeds}")


@dataclass
class CandidateRecord:
    """What the plan learned of one candidate, fidelity by fidelity."""

    candidate: Candidate
    screen: ScreenEstimate
    short: TrialResult | None = None
    long: list[TrialResult] = field(default_factory=list)


@dataclass
class SearchOutcome:
    records: list[CandidateRecord]
    wall_s: float
    stopped_at_limit: bool  # trials were left unfinished at the time limit

    @property
    def simulated(self) -> int:
        return sum(1 for r in self.records if r.short is not None or r.long)


class MultiFidelitySearch:
    def __init__(self, base: Config, candidates: Sequence[Candidate], screen: Screen,
                 budget: SearchBudget,
                 on_progress: Callable[[str], None] | None = None) -> None:
        self.base, self.screen, self.budget = base, screen, budget
        self.records = [CandidateRecord(c, screen.estimate(c.deployment)) for c in candidates]
        self._twins: dict[object, list[int]] = {}  # candidates that simulate alike
        for key, candidate in enumerate(candidates):
            self._twins.setdefault(candidate.simulation_key, []).append(key)
        self.on_progress = on_progress or (lambda text: None)
        self._started = 0.0

    # ---- which candidates each stage takes ----
    def _spaces(self) -> dict[str, list[int]]:
        spaces: dict[str, list[int]] = {}
        for key, record in enumerate(self.records):
            spaces.setdefault(record.candidate.space, []).append(key)
        return spaces

    def shortlist(self) -> list[int]:
        """Per space: its best deployments by the screen (first knob setting of each), then
        the other knob settings of the best; interleaved across spaces. A deployment the
        screen prices exactly as a better-placed one with the same chunk sizes goes after
        every distinct one: the screen cannot tell them apart (they differ in a pool that
        does not limit the rate: 4P + 4D TP1 and 4P TP1 + 2D TP2 at chunk 8,192, both 172
        req/s by the screen and 131.4 simulated), so a slot is worth more on the next
        distinct deployment (5P + 3D TP1, 170 and 170). Chunk sizes the screen prices alike
        are not ties: the simulation tells them apart (TaiChi's chat SLO2 static-pd: 33.1
        req/s at 8,192, 32.6 at 2,048)."""
        lists = []
        for keys in self._spaces().values():
            by_deployment: dict[object, list[int]] = {}
            for key in sorted(keys, key=lambda k: self._screen_rank(k)):
                by_deployment.setdefault(self.records[key].candidate.deployment, []).append(key)
            groups = _distinct_prices_first(
                list(by_deployment.values()),
                lambda group: (self.records[group[0]].screen.goodput_rps, tuple(
                    g.chunk_tokens for g in self.records[group[0]].candidate.deployment.groups)))
            half = (self.budget.shortlist + 1) // 2
            chosen = [group[0] for group in groups[:half]]
            for group in groups:
                chosen += [k for k in group[1:]]
                if len(chosen) >= self.budget.shortlist:
                    break
            chosen += [g[0] for g in groups[half:]]
            lists.append(list(dict.fromkeys(chosen))[:self.budget.shortlist])
        return _interleave(lists)

    def _screen_rank(self, key: int) -> tuple[float, float]:
        """Best first by the screen's goodput; where the screen meets the SLOs at no rate,
        by the rate the deployment keeps up with (its short run checks the screen's zero)."""
        screen = self.records[key].screen
        return (-screen.goodput_rps, -screen.capacity_rps if screen.goodput_rps <= 0 else 0.0)

    def _space_bests(self) -> list[int]:
        """Each space's best short run, best first, twins of a better one left out."""
        bests = []
        for keys in self._spaces().values():
            done = [k for k in keys if (short := self.records[k].short) is not None
                    and short.goodput_rps > 0]
            if done:
                bests.append(max(done, key=self._per_gpu))
        bests.sort(key=self._per_gpu, reverse=True)
        distinct: list[int] = []
        for key in bests:  # a twin's runs are its twin's: confirm the next policy instead
            if not any(self._twin(key, other) for other in distinct):
                distinct.append(key)
        return distinct

    def confirm_list(self) -> list[tuple[int, int]]:
        """(candidate, seed) pairs of the long stage: the best short run of each of the
        `verify` spaces whose best short run has the highest goodput per GPU, preferring
        different deployments (two routers on one split say less than two splits), seed by
        seed (every contender's first seed, then every second, ...)."""
        bests = self._space_bests()
        contenders: list[int] = []
        for key in bests:
            deployment = self.records[key].candidate.deployment
            if all(self.records[k].candidate.deployment != deployment for k in contenders):
                contenders.append(key)
        contenders += [k for k in bests if k not in contenders]
        return self._seeds(contenders[:self.budget.verify])

    def _seeds(self, contenders: list[int]) -> list[tuple[int, int]]:
        return [(key, seed) for seed in range(self.budget.seeds) for key in contenders]

    def challengers(self) -> list[tuple[int, int]]:
        """After the long runs: the unconfirmed spaces whose best short run beats the best
        confirmed goodput per GPU, best first (short runs run optimistic: a confirmed
        winner may fall below another's short run; that one is confirmed next)."""
        confirmed = [r for r in self.records if r.long]
        if not confirmed:
            return []
        best = max(statistics.fmean(t.goodput_rps for t in r.long) / r.candidate.gpus
                   for r in confirmed)
        for key in self._space_bests():
            if not self.records[key].long and self._per_gpu(key) > best:
                return self._seeds([key])
        return []

    def _per_gpu(self, key: int) -> float:
        record = self.records[key]
        assert record.short is not None
        return record.short.goodput_rps / record.candidate.gpus

    # ---- running ----
    def _trial(self, key: int, fidelity: Fidelity, seed: int) -> Trial:
        record = self.records[key]
        if fidelity is self.budget.long and record.short:
            guess = record.short.goodput_rps
        elif record.screen.goodput_rps > 0:
            guess = record.screen.goodput_rps
        else:  # the screen's SLOs fail at every rate: search down from what keeps up, not
            #    down from 0.001 req/s, where each step replays days of near-idle arrivals
            guess = record.screen.capacity_rps
        return Trial(key, record.candidate, fidelity, seed, guess)

    def _twin(self, key: int, other: int) -> bool:
        return (self.records[key].candidate.simulation_key
                == self.records[other].candidate.simulation_key)

    def _store(self, result: TrialResult) -> None:
        """The result, for the candidate and every twin of it."""
        for key in self._twins[self.records[result.key].candidate.simulation_key]:
            record = self.records[key]
            if result.fidelity == "short":
                record.short = replace(result, key=key)
            elif all(r.seed != result.seed for r in record.long):
                record.long.append(replace(result, key=key))

    def run(self) -> SearchOutcome:
        budget = self.budget
        self._started = time.monotonic()
        deadline = self._started + max(0.0, budget.time_limit_s - RESERVE_S)
        short_until = self._started + SHORT_SHARE * budget.time_limit_s
        queue = [self._trial(key, budget.short, 0) for key in self.shortlist()]
        total_short, stage, stopped = len(queue), "short", False
        in_flight: list[AsyncResult] = []
        submitted: set[tuple[object, str, int]] = set()
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        pool = context.Pool(budget.jobs, initializer=init_worker,
                            initargs=(self.base, budget.seeds))
        try:
            while True:
                now = time.monotonic()
                if now >= deadline:
                    stopped = self._unfinished(stage, len(in_flight), len(queue))
                    break
                if stage == "short" and (not queue or now >= short_until):
                    queue, stage = [], "draining"  # the short stage takes nothing new
                if stage == "draining" and not in_flight:  # the shortlist is complete
                    queue = [self._trial(k, budget.long, s) for k, s in self.confirm_list()]
                    stage = "long"
                while queue and len(in_flight) < budget.jobs:
                    trial = queue.pop(0)
                    identity = (trial.candidate.simulation_key, trial.fidelity.name, trial.seed)
                    if identity not in submitted:  # a twin's trial gives this one's result
                        submitted.add(identity)
                        in_flight.append(pool.apply_async(evaluate, (trial,)))
                still = []
                for pending in in_flight:
                    if pending.ready():
                        self._store(pending.get())
                    else:
                        still.append(pending)
                in_flight = still
                self._report(total_short, stage, len(in_flight), len(queue))
                if stage == "long" and not queue and not in_flight:
                    queue = [self._trial(k, budget.long, s) for k, s in self.challengers()]
                    if not queue:
                        break
                time.sleep(0.02)
        finally:
            pool.terminate()
            pool.join()
        return SearchOutcome(self.records, time.monotonic() - self._started, stopped)

    def _unfinished(self, stage: str, running: int, queued: int) -> bool:
        """Whether work was left at the deadline: trials running or queued, or, before the
        long stage began, confirmations to run (the last short trial may end just before
        the deadline, with nothing running or queued and the long stage not yet built)."""
        return bool(running or queued) or (stage != "long" and bool(self.confirm_list()))

    def _report(self, total_short: int, stage: str, running: int, queued: int) -> None:
        short = sum(1 for r in self.records if r.short is not None)
        long = sum(len(r.long) for r in self.records)
        self.on_progress(f"screened {len(self.records)} | short {short}/{total_short} | long "
                         f"{long} | {stage}: {running} running, {queued} queued | "
                         f"{time.monotonic() - self._started:.0f}/"
                         f"{self.budget.time_limit_s:.0f}s")


def _distinct_prices_first(groups: list[list[int]],
                           price: Callable[[list[int]], tuple[float, tuple[int, ...]]]
                           ) -> list[list[int]]:
    """`groups` (best first) with each group priced like an earlier one (the same screen
    goodput and the same chunk sizes) moved behind every distinct group, in order."""
    seen: list[tuple[float, tuple[int, ...]]] = []
    distinct, tied = [], []
    for group in groups:
        value = price(group)
        if any(math.isclose(value[0], other[0], rel_tol=1e-9) and value[1] == other[1]
               for other in seen):
            tied.append(group)
        else:
            seen.append(value)
            distinct.append(group)
    return distinct + tied


def _interleave(lists: list[list[int]]) -> list[int]:
    out = []
    for rank in range(max((len(x) for x in lists), default=0)):
        out += [x[rank] for x in lists if rank < len(x)]
    return out
