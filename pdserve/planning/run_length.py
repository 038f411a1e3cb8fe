"""How long a planner's run lasts, and whether a goodput's run was long enough.

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

`SHORT` and `LONG` are the planner's two simulated fidelities; `burst_goodput_note` holds a
goodput found on a workload as given (`simulate --goodput`, TaiChi's slider search) to
`LONG`'s length. The trials themselves: `fidelity.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pdserve.config import Config
from pdserve.workload.sessions import is_session_workload
from pdserve.workload.workload import Workload


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
    """Why a goodput found on `workload` as given (`simulate --goodput`, `plan --policy
    taichi`) is likely too high (None: it is not): at that rate the workload's arrivals last
    less than a confirmation run of the planner for these SLOs (`LONG`: 80 s, two request
    lifetimes, long enough for an overload to fail the TTFT SLO), so the rate was served as
    a burst, not sustained.
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
