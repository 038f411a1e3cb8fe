"""The planner's simulated fidelities: a candidate's goodput on a sample of the workload.

A `Fidelity` says how long a run's arrivals last at the rate the trial expects (so a run
reaches the steady state whatever the deployment's rate: N = duration x guessed rate
requests, rounded to a power of 2^(1/4) so samples are shared) and how finely its goodput
search ends. The duration is at least a number of request lifetimes (the decode batch
fills over one), and long enough for an overload to fail the TTFT SLO (`RunScale`): a rate
a fraction e above what the cluster sustains grows its queue by about e seconds a second,
so a request arriving t seconds in waits about e t, and only those arriving before
TTFT SLO / e meet it; the run fails the attainment target a only if that is less than a
of its arrivals, D > TTFT SLO / (a e). Without it a loose TTFT SLO passes overloaded
rates: at TTFT 30 s (FlowKV's setup: 1,024/256 tokens, 2 x A100) runs of 100 s put
colocated's goodput at 26.8 req/s, where runs of 6,500 s settle at 20.1.
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
from pdserve.sim.runner import Experiment, load_perf_model, load_workload
from pdserve.workload.sessions import is_session_workload
from pdserve.workload.workload import Workload

SESSION_ROUNDS = 8  # requests per session assumed when sizing a session sample
SEARCH_RANGE = 64.0  # the goodput search may end this far from its guess, either way


@dataclass(frozen=True)
class Fidelity:
    name: str  # "short" or "long"
    duration_s: float  # of arrivals at the guessed rate, per run, at least
    min_requests: int
    rel_tol: float  # the goodput search stops within this
    step: float = 1.25  # the bracket's growth from the guess
    # and at least this many request lifetimes (mean output tokens x the TPOT SLO): the
    # decode batch fills over one, so a run of a few is mostly steady state
    lifetimes: float = 0.0
    # and long enough that a rate this fraction above what the cluster sustains fails the
    # TTFT SLO by queueing alone (0: no such bound; the planner's fidelities use their
    # search's tolerance, the resolution the goodput they report claims)
    ttft_overload: float = 0.0

    def duration_for(self, scale: RunScale) -> float:
        """Seconds of arrivals a run of this fidelity lasts at least."""
        duration_s = max(self.duration_s, self.lifetimes * scale.lifetime_s)
        if self.ttft_overload > 0:
            duration_s = max(duration_s, scale.ttft_slo_s / (scale.target * self.ttft_overload))
        return duration_s

    def requests(self, guess_rps: float, scale: RunScale | None = None) -> int:
        duration_s = self.duration_for(scale) if scale is not None else self.duration_s
        wanted = max(self.min_requests, duration_s * guess_rps)
        return int(round(2 ** (round(4 * math.log2(wanted)) / 4)))


@dataclass(frozen=True)
class RunScale:
    """What a run's length is measured against: a request's decode lifetime at the TPOT SLO
    (`request_lifetime_s`), the TTFT SLO and the attainment the goodput must reach."""

    lifetime_s: float
    ttft_slo_s: float
    target: float

    @classmethod
    def of(cls, workload: Workload, config: Config) -> RunScale:
        return cls(request_lifetime_s(workload, config.slo.tpot_s),
                   min(config.slo.ttft_s, TTFT_RUN_CAP_S), config.goodput.target)


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


# a decode step no engine takes: the TPOT that sizes runs is the SLO's, up to this (an SLO
# of 1e6 s or inf, "no TPOT target", sized runs of 10^8 s of arrivals and failed them all)
LIFETIME_TPOT_CAP_S = 1.0


# a TTFT SLO sizes runs up to this (the papers' loosest is FlowKV's 30 s): a long run then
# lasts up to 1,667 s of arrivals; an SLO of 1,000 s would ask for 27,800 s (millions of
# requests a run, no plan within minutes), 1e6 s for 10^8 s. Above it the plan says how
# large an overload can still pass
TTFT_RUN_CAP_S = 60.0


def request_lifetime_s(workload: Workload, tpot_slo_s: float) -> float:
    """How long a request holds its decode slot at the TPOT SLO: mean output tokens x TPOT
    (a fidelity's runs last at least a number of these), the TPOT at most
    `LIFETIME_TPOT_CAP_S`."""
    return float(workload.output_tokens.mean()) * min(tpot_slo_s, LIFETIME_TPOT_CAP_S)


# a run's arrivals last this long at the rate expected, and at least this many request
# lifetimes (mean output x TPOT SLO). The decode batch takes a lifetime and more to fill: on
# azure-conv, 8 x H100, colocated, the attainment at 200 req/s falls from 86 % over 1,500
# requests to 34 % over 3,000 and 14 % over 6,000; on 4000/500-token requests, a plan whose
# runs lasted 40 s put the goodput at 32.8 req/s [31.2, 34.5], a run of 4,000 (140 s) at 29.1.
# The long runs last 80 s: on the whole azure-conv trace (115 s of arrivals at its goodput,
# 8 x H100, colocated) the goodput is 168.7 req/s, where 40-s windows gave 200 [174, 235],
# 80-s windows 178 [169, 194] and 120-s ones 170 (docs/results/plan.md). And long enough
# that a rate the search's tolerance above what the cluster sustains fails the TTFT SLO
# (`Fidelity.ttft_overload`): at TTFT 30 s, 2 x A100, 1,024/256 tokens, runs of ~100 s put
# colocated's goodput at 26.8 req/s, where 6,500-s runs settle at 20.1
SHORT = Fidelity("short", duration_s=20.0, min_requests=400, rel_tol=0.1, step=1.2,
                 lifetimes=0.5, ttft_overload=0.1)
LONG = Fidelity("long", duration_s=80.0, min_requests=1000, rel_tol=0.04, step=1.15,
                lifetimes=2.0, ttft_overload=0.04)


def burst_goodput_note(workload: Workload, config: Config, goodput_rps: float) -> str | None:
    """Why a goodput found on `workload` as given (`simulate --goodput`) is likely too high
    (None: it is not): at that rate the workload's arrivals last less than a confirmation
    run of the planner for these SLOs (`LONG`: 80 s, two request lifetimes, long enough for
    an overload to fail the TTFT SLO), so the rate was served as a burst, not sustained.
    The default synthetic workload (1,000 requests) found 2,543 req/s on 4P4D where 100,000
    requests find 386."""
    if goodput_rps <= 0 or workload.mean_rate_rps <= 0:
        return None
    needed_s = LONG.duration_for(RunScale.of(workload, config))
    span_s = workload.span_s * workload.mean_rate_rps / goodput_rps
    if span_s >= needed_s:
        return None
    if config.workload.trace == "synthetic":
        remedy = f"--synthetic-requests {math.ceil(needed_s * goodput_rps):,} or more"
    elif is_session_workload(config.workload.trace):
        remedy = "more sessions (--synthetic-requests)"
    else:
        remedy = "more of the trace (a longer --duration, or --repeat to replay it)"
    return (f"at the goodput rate the workload's arrivals last {span_s:.1f}s, less than the "
            f"{needed_s:.0f}s a run needs for these SLOs to tell a sustained rate from a "
            f"burst (a confirmation run of pdserve plan): this goodput is likely too high; "
            f"give {remedy}")


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
                       ceiling_reached=result.ceiling_reached)


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
