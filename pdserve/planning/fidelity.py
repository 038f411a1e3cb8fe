"""The planner's simulated fidelities: a candidate's goodput on a sample of the workload.

How long each run lasts is `run_length.py`'s (`Fidelity`, `SHORT`, `LONG`).
`WorkloadSamples` turns (fidelity, seed, N) into the config values that select
that sample, so every figure the planner reports is a `pdserve simulate` of a config it can
write out:
  a trace      seed k of S is the window of N requests starting at the (k + 1/2)/S point of
               the trace (`workload.start_s`, `workload.max_requests`); a trace shorter
               than 2N is first replayed end to end (`workload.repeat`) to at least 2N
  synthetic    seed k draws N requests with seed base + k
  sessions     seed k draws N/8 sessions with seed base + k
`evaluate(trial)` runs one trial in a worker process: the goodput search
(`metrics.goodput.search_goodput`) started at the trial's guess, stepping by `Fidelity.step`,
and the latencies at the rate found. A step that fails stops as soon as its attainment can no
longer reach the target (`metrics/attainment_watch.py`); a passing step runs to its end, so
the latencies at the rate found are its full run's (stopping it too would save only its
tail, less than the full run of that point again that its latencies would then need). The
verdicts, and so the search's path and rate, are those of full runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from pdserve.config import Config
from pdserve.metrics.goodput import search_goodput
from pdserve.metrics.summary import Summary
from pdserve.planning.candidates import Candidate
from pdserve.planning.run_length import Fidelity, RunScale
from pdserve.sim.runner import Experiment, load_perf_model, load_workload
from pdserve.workload.sessions import is_session_workload
from pdserve.workload.workload import Workload

SESSION_ROUNDS = 8  # requests per session assumed when sizing a session sample
SEARCH_RANGE = 64.0  # the goodput search may end this far from its guess, either way


@dataclass(frozen=True)
class Trial:
    key: int  # the candidate's index in the plan
    candidate: Candidate
    fidelity: Fidelity
    seed: int
    guess_rps: float  # where the goodput search starts (the screen's, or a shorter run's)


@dataclass(frozen=True)
class TrialResult:
    key: int
    fidelity: str
    seed: int
    goodput_rps: float
    ttft_p50_s: float  # at the goodput rate (nan when it is 0)
    ttft_p90_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    runs: int  # simulations the search took
    requests: int  # replayed by the run at the goodput rate
    wall_s: float
    error: str = ""  # why the trial could not run (its goodput is then 0)
    # every rate the search tried met the SLOs (`GoodputResult.ceiling_reached`): the
    # goodput is a lower bound, and its runs likely too short to load the cluster
    ceiling_reached: bool = False
    # the run at the goodput rate judged with the wait for a decode slot counted in TTFT
    # (`Summary.slo_attainment_with_decode_queue`; nan when the goodput is 0)
    attainment_with_decode_queue: float = math.nan


def trace_repeat(base: Config, trace_requests: int, count: int) -> dict[str, Any]:
    """The `workload.repeat` a sample of `count` requests of the base's trace (of
    `trace_requests`) is drawn from: replayed end to end to at least twice the sample's
    length, so the seeds' windows differ and a doubled run still takes in new arrivals; {}
    when the trace holds the sample, or the base chose a window (replayed whole)."""
    w = base.workload
    if trace_requests > count or w.duration_s is not None or w.max_requests is not None:
        return {}
    return {"workload.repeat": w.repeat * math.ceil(2 * count / trace_requests)}


class WorkloadSamples:
    """The base config's workload and its samples by (fidelity, seed); one per process."""

    def __init__(self, base: Config, seeds: int) -> None:
        self.base, self.seeds = base, seeds
        self.full = load_workload(base)
        self.scale = RunScale.of(self.full, base)
        self._cache: dict[tuple[str, int, int], Workload] = {}

    def values(self, fidelity: Fidelity, seed: int, count: int) -> dict[str, Any]:
        """The config values that select sample `seed` of `fidelity`, `count` requests."""
        w = self.base.workload
        if w.trace == "synthetic":
            return {"seed": self.base.seed + seed,
                    "workload.synthetic_requests": min(count, w.synthetic_requests)}
        if is_session_workload(w.trace):
            return {"seed": self.base.seed + seed, "workload.synthetic_requests": max(
                2, min(w.synthetic_requests, count // SESSION_ROUNDS))}
        full, tiled = self.full, {}
        if len(full) <= count:
            if w.duration_s is not None or w.max_requests is not None:
                return {}  # a window the base chose replays whole
            tiled = trace_repeat(self.base, len(full), count)
            full = self._tiled(tiled)
        samples = self.seeds if fidelity.name == "long" else 1
        first = round((seed + 0.5) / samples * (len(full) - count))
        offset = float(full.arrival_s[first] - full.arrival_s[0])
        return {**tiled, "workload.start_s": w.start_s + math.floor(offset * 1e6) / 1e6,
                "workload.duration_s": None, "workload.max_requests": count}

    def _tiled(self, values: dict[str, Any]) -> Workload:
        key = ("tiled", values["workload.repeat"], 0)
        if key not in self._cache:
            self._cache[key] = load_workload(self.base.with_values(values))
        return self._cache[key]

    def workload(self, fidelity: Fidelity, seed: int, count: int) -> Workload:
        key = (fidelity.name, seed, count)
        if key not in self._cache:
            values = self.values(fidelity, seed, count)
            self._cache[key] = (load_workload(self.base.with_values(values)) if values
                                else self.full)
        return self._cache[key]


def run_trial(trial: Trial, samples: WorkloadSamples,
              stop_when_decided: bool = True) -> TrialResult:
    """The goodput search over absolute rates: each rate replays its own sample, long
    enough for `trial.fidelity.duration_s` of arrivals at that rate. `stop_when_decided`:
    a failing step stops once that is decided (the same result as full runs, sooner)."""
    started = time.perf_counter()
    fidelity, seed = trial.fidelity, trial.seed
    reference_rps = samples.full.mean_rate_rps  # the search's scale 1
    config = trial.candidate.config(samples.base)
    perf = load_perf_model(config)
    experiments: dict[int, Experiment] = {}

    def experiment_at(rate_rps: float) -> Experiment:
        count = fidelity.requests(rate_rps, samples.scale)
        if count not in experiments:
            experiments[count] = Experiment(
                config.with_values(samples.values(fidelity, seed, count)),
                samples.workload(fidelity, seed, count), perf)
        return experiments[count]

    def run(scale: float) -> Summary:
        rate_rps = scale * reference_rps
        experiment = experiment_at(rate_rps)
        return experiment.summarize(experiment.simulate(
            rate_rps / experiment.workload.mean_rate_rps,
            decide_attainment=config.goodput.target if stop_when_decided else None,
            stop_on_pass=False))

    result = search_goodput(run, reference_rps, config.goodput.target, fidelity.rel_tol,
                            max_doublings=math.ceil(math.log(SEARCH_RANGE, fidelity.step)),
                            start_scale=max(trial.guess_rps, 1e-3) / reference_rps,
                            step=fidelity.step)
    at = [p.summary for p in result.points if p.rate_scale == result.rate_scale]
    nan = math.nan
    ttft = (at[0].ttft_s.p50, at[0].ttft_s.p90) if at else (nan, nan)
    tpot = (at[0].tpot_s.p50, at[0].tpot_s.p90) if at else (nan, nan)
    requests = len(experiment_at(result.rate_rps).workload) if result.rate_rps > 0 else 0
    return TrialResult(trial.key, fidelity.name, seed, result.rate_rps, *ttft, *tpot,
                       len(result.points), requests, time.perf_counter() - started,
                       ceiling_reached=result.ceiling_reached,
                       attainment_with_decode_queue=(
                           at[0].slo_attainment_with_decode_queue if at else nan))


_SAMPLES: WorkloadSamples | None = None


def init_worker(base: Config, seeds: int) -> None:
    """A worker process's samples, loaded once."""
    global _SAMPLES
    _SAMPLES = WorkloadSamples(base, seeds)


def evaluate(trial: Trial) -> TrialResult:
    """`run_trial` in a worker process set up by `init_worker`."""
    assert _SAMPLES is not None, "evaluate runs in a worker set up by init_worker"
    try:
        return run_trial(trial, _SAMPLES)
    except ValueError as err:  # a config the simulator refuses: reported, not fatal
        nan = math.nan
        return TrialResult(trial.key, trial.fidelity.name, trial.seed, 0.0, nan, nan, nan,
                           nan, 0, 0, 0.0, f"{trial.candidate.space}: {err}")
