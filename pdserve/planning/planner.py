"""`pdserve plan --policy all` (or one search space by name): which policy and which
deployment, for this workload, these SLOs, this many GPUs of this type.

Every search space (`pdserve.policies.search_spaces`: each preset's, and the compositions
across papers) is enumerated on the GPUs (`candidates.py`: one degree for all instances, and
a degree per pool for the disaggregated spaces), AMPD's ILP adds its deployments
(`proposals.py`), those the batch limit holds back come again at a higher one, and the
multi-fidelity search (`multi_fidelity.py`) screens, shortlists
and confirms them with the same budget per space. The outcome (`outcome.py`) is printed
(`report.py`), and with `--out DIR` written as the winner's config (`winner.yaml`), the
Pareto plot (`pareto.png`) and its data (`pareto.json`), the record (`summary.json`) and
`report.html`; `--json FILE` writes the record.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path

from pdserve.config import Config, read_yaml
from pdserve.config_flags import config_from_args, flag_values
from pdserve.perf.fitted import PerfModel
from pdserve.perf.presets import default_tp
from pdserve.planning.candidates import (
    BATCH_LIMIT_SEARCHED,
    DEGREES,
    Candidate,
    enumerate_candidates,
    feasible_degrees,
    mixed_degree_candidates,
    with_batch_limit,
)
from pdserve.planning.fidelity import SESSION_ROUNDS, trace_repeat
from pdserve.planning.multi_fidelity import MultiFidelitySearch, SearchBudget, SearchOutcome
from pdserve.planning.outcome import (
    pareto_points,
    policy_rows,
    screen_error,
    verdict,
)
from pdserve.planning.progress import ProgressLine
from pdserve.planning.proposals import ampd_ilp_candidates
from pdserve.planning.report import (
    format_decode_queue_note,
    format_screen_error,
    format_table,
    format_verdict,
    plan_json,
    winner_config,
    write_config,
    write_plan_report,
)
from pdserve.planning.run_length import LONG, SHORT, TTFT_RUN_CAP_S, RunScale
from pdserve.planning.screen import Screen, WorkloadShape
from pdserve.policies.search_spaces import spaces_for
from pdserve.sim.runner import check_rate_to_scale, load_perf_model, load_workload
from pdserve.workload.sessions import is_session_workload

DEFAULT_GPUS = 8
OUTPUT_S = 3.0  # kept back from the time limit for the outcome (the plot takes seconds)

# a synthetic workload is a length distribution and an arrival process, not a count: unless
# --synthetic-requests (or --config) caps it, each run draws what its fidelity needs, up to
# this. A cap shorter than a run wants turns the goodput into a burst's: 128/1024 tokens on
# 8 x H100 (TPOT 30 ms) "sustained" 341 req/s on 4,000 requests (12 s of arrivals) and
# attains 13 % over 80 s at that rate, where the decode side completes 108 req/s
SYNTHETIC_DRAW_MAX = 400_000


def plan_defaults() -> Config:
    """Where `pdserve plan --policy all` starts: the simulate defaults."""
    return Config()


def uncapped_synthetic(base: Config, args: argparse.Namespace) -> Config:
    """`base` with a synthetic or session workload drawn as long as the runs need, unless
    the command line or its --config file set the count (of requests; of sessions, about
    `SESSION_ROUNDS` requests each). Capped at the default 1,000 sessions, a session plan's
    runs were bursts whose "goodput" reached 1,500,000 req/s on 8 GPUs."""
    sessions = is_session_workload(base.workload.trace)
    if base.workload.trace != "synthetic" and not sessions:
        return base
    if "workload.synthetic_requests" in flag_values(args):
        return base
    if getattr(args, "config", None) and "workload.synthetic_requests" in read_yaml(args.config):
        return base
    return base.with_values({"workload.synthetic_requests": SYNTHETIC_DRAW_MAX // (
        SESSION_ROUNDS if sessions else 1)})


def confirmation_requests(base: Config, goodput_rps: float, scale: RunScale) -> int | None:
    """How many requests a confirmation run of a synthetic workload wants at `goodput_rps`
    (None for traces, replayed whole, and sessions, which keep their count)."""
    if base.workload.trace != "synthetic":
        return None
    return LONG.requests(goodput_rps, scale)


def perf_by_degree(base: Config) -> Callable[[int, int], PerfModel]:
    """An instance's performance model at each degree and batch limit, as the simulator
    loads it."""
    return lru_cache(maxsize=None)(lambda tp, max_batch_size: load_perf_model(
        base.with_values({"perf.tp": tp, "instance.max_batch_size": max_batch_size})))


def build_candidates(base: Config, policy: str, gpus: int, screen: Screen) -> list[Candidate]:
    sessions = is_session_workload(base.workload.trace)
    if base.perf.tp > gpus:
        raise ValueError(f"a tensor-parallel degree of {base.perf.tp} needs {base.perf.tp} GPUs "
                         f"an instance; the plan has {gpus}")
    degrees = ([base.perf.tp] if base.perf.tp else
               feasible_degrees(base.perf.model, gpus, screen.perf))
    if not degrees:
        fitting = [d for d in DEGREES if d <= gpus  # a degree that fits, on fewer GPUs
                   and feasible_degrees(base.perf.model, d, screen.perf)[-1:] == [d]]
        hint = (f"; TP {fitting[0]} fits on {fitting[0] * (gpus // fitting[0])} of them: "
                f"--gpus {fitting[0] * (gpus // fitting[0])}" if fitting else "")
        raise ValueError(f"{base.perf.model} fits no tensor-parallel degree that divides "
                         f"{gpus} {base.perf.gpu} GPUs (the plan puts every GPU to use)"
                         + hint)
    candidates: list[Candidate] = []
    for space in spaces_for(policy, sessions):
        found = (enumerate_candidates(space, gpus, degrees)
                 + mixed_degree_candidates(space, gpus, degrees, base.perf.gpu))
        if space.preset == "ampd" and space.name == "ampd":
            found += ampd_ilp_candidates(space, found, gpus, base.perf.gpu, screen)
        candidates += found
    if not candidates:
        raise ValueError(f"no deployment of {policy!r} fits {gpus} GPUs")
    return candidates


def batch_limit_candidates(base: Config, candidates: list[Candidate], screen: Screen
                           ) -> list[Candidate]:
    """Each deployment whose decodes the plan's batch limit holds back by the screen, again
    at `BATCH_LIMIT_SEARCHED` sequences (screened here): where the TPOT SLO leaves room, an
    engine batches more than 256 sequences (AIConfigurator's answers run 352-512 a worker;
    docs/results/fidelity.md, "Eight MoE decisions"). None where the plan's limit is that
    high already."""
    if base.instance.max_batch_size >= BATCH_LIMIT_SEARCHED:
        return []
    found = [with_batch_limit(c, BATCH_LIMIT_SEARCHED) for c in candidates
             if screen.estimate(c.deployment).batch_limited]
    for candidate in found:
        screen.estimate(candidate.deployment)
    return found


def search(base: Config, policy: str, gpus: int,
           budget: SearchBudget | Callable[[], SearchBudget],
           progress: ProgressLine | None = None,
           deadline: tuple[float, float] | None = None) -> tuple[SearchOutcome, int]:
    """The search's records and the configurations it evaluated (screened). `budget` may be
    made once the candidates are screened (so its time limit counts what that took).
    `deadline`: (the `time.monotonic()` the command started at, its time limit in seconds);
    a screen that runs past it is a ValueError saying so."""
    shape = WorkloadShape.of(load_workload(base))
    screen = Screen(perf_by_degree(base), shape, base.slo.targets(), base.goodput.target,
                    base.instance.max_batch_size)
    candidates = build_candidates(base, policy, gpus, screen)
    for done, candidate in enumerate(candidates):
        if deadline is not None and done % 1000 == 0 and \
                time.monotonic() - deadline[0] > deadline[1]:
            raise ValueError(
                f"the time limit ({deadline[1]:g}s) passed while screening "
                f"{done:,} of the {len(candidates):,} configurations on {gpus} GPUs, before "
                f"any simulation: give --time-limit more, or name one --policy")
        screen.estimate(candidate.deployment)
    candidates += batch_limit_candidates(base, candidates, screen)
    runner = MultiFidelitySearch(base, candidates, screen,
                                 budget if isinstance(budget, SearchBudget) else budget(),
                                 progress.update if progress else None)
    return runner.run(), len(candidates)


def budget_from_args(args: argparse.Namespace, spent_s: float = 0.0) -> SearchBudget:
    """`--time-limit` covers the whole command: the search gets what is left of it after
    `spent_s` (loading, screening) and `OUTPUT_S` (the table, the plot, the files)."""
    return SearchBudget(max(1.0, args.time_limit - spent_s - OUTPUT_S),
                        args.jobs or os.cpu_count() or 1, args.shortlist, args.verify,
                        args.seeds, SHORT, LONG)


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    base = uncapped_synthetic(config_from_args(args, plan_defaults()), args)
    if not (math.isfinite(base.slo.ttft_s) and math.isfinite(base.slo.tpot_s)):
        raise ValueError(f"pdserve plan ranks deployments by the rate that meets both SLOs; "
                         f"an infinite one (TTFT {base.slo.ttft_s:g}s, TPOT "
                         f"{base.slo.tpot_s:g}s) leaves queues free to grow without bound: "
                         f"give each a finite number of seconds")
    gpus = args.gpus or DEFAULT_GPUS
    budget = budget_from_args(args)
    if args.out:  # before the search: an --out that cannot be a directory fails now
        args.out.mkdir(parents=True, exist_ok=True)
    if args.json and not Path(args.json).resolve().parent.is_dir():
        raise ValueError(f"--json {args.json}: its directory does not exist")
    workload = load_workload(base)
    check_rate_to_scale(workload)
    print(f"planning {base.perf.model} on {gpus} x {base.perf.gpu} for "
          f"{base.workload.trace} (TTFT SLO {base.slo.ttft_s:g}s, TPOT SLO "
          f"{base.slo.tpot_s:g}s, goodput at {base.goodput.target:.0%} attainment); policy "
          f"{args.policy}, {budget.jobs} processes, at most {args.time_limit:g}s",
          flush=True)
    tp = base.perf.tp or default_tp(base.perf.model, base.perf.gpu)  # one the model fits
    print(f"priced by {load_perf_model(base.with_values({'perf.tp': tp})).name}", flush=True)
    if base.perf.tp and gpus % base.perf.tp:
        print(f"note: --tp {base.perf.tp} leaves {gpus % base.perf.tp} of the {gpus} GPUs "
              f"idle: the plan deploys {gpus - gpus % base.perf.tp}", flush=True)
    scale = RunScale.of(workload, base)
    long_s = LONG.duration_for(scale)
    if base.slo.ttft_s > TTFT_RUN_CAP_S:
        print(f"note: runs are sized for a TTFT SLO of {TTFT_RUN_CAP_S:g}s (a long one lasts "
              f"{long_s:,.0f}s of arrivals); at {base.slo.ttft_s:g}s a rate up to "
              f"{base.slo.ttft_s / (base.goodput.target * long_s):.0%} above what a "
              f"deployment sustains can still pass its runs", flush=True)
    progress = ProgressLine(enabled=not args.no_progress)
    screened_s = 0.0  # from the start to the end of the screen, when the budget is made

    def budget_after_screen() -> SearchBudget:
        nonlocal screened_s
        screened_s = time.monotonic() - started
        return budget_from_args(args, screened_s)

    outcome, evaluated = search(base, args.policy, gpus, budget_after_screen, progress,
                                (started, args.time_limit))
    progress.close()
    rows = policy_rows(outcome, LONG.rel_tol)
    result = verdict(rows)
    wall_s = time.monotonic() - started
    short = len({r.candidate.simulation_key for r in outcome.records if r.short})
    long = len({(r.candidate.simulation_key, t.seed) for r in outcome.records for t in r.long})
    confirmed = len({r.candidate.simulation_key for r in outcome.records if r.long})
    print(f"{evaluated} configurations screened, {short} simulated short "
          f"(>= {SHORT.duration_for(scale):,.0f}s of arrivals), {long} long runs (>= "
          f"{long_s:,.0f}s, up to {budget.seeds} seeds for each of {confirmed} "
          f"confirmed) in {wall_s:.1f}s"
          + ("; stopped at the time limit" if outcome.stopped_at_limit else ""))
    errors = [r.short.error for r in outcome.records if r.short and r.short.error]
    if errors:
        print(f"{len(errors)} trials could not run, e.g. {errors[0]}")
    # at the winner's sustained rate: a run cut short serves a burst, whose "goodput" can be
    # 1,000x what the cluster sustains; the screen's steady-state estimate is not fooled
    sustained_rps = (min(result.winner.goodput.mean, result.winner.screen_goodput_rps)
                     if result.winner is not None else 0.0)
    wanted = (confirmation_requests(base, sustained_rps, scale) if result.winner is not None
              else None)
    if wanted is not None and wanted > base.workload.synthetic_requests:
        held = base.workload.synthetic_requests
        remedy = (f"give --synthetic-requests {wanted:,} (the planner draws at most {held:,} "
                  f"unless told)" if held >= SYNTHETIC_DRAW_MAX else
                  f"leave --synthetic-requests out (or give {wanted:,} or more)")
        print(f"warning: the synthetic workload holds {held:,} requests and a confirmation at "
              f"the winner's sustained rate wants {wanted:,} ({long_s:,.0f}s of "
              f"arrivals): the runs were cut short, so the goodputs are a burst's, not a "
              f"steady state's; {remedy} for a sustained rate")
    unbounded = [row.space for row in rows if row.ceiling_reached]
    if unbounded:
        print(f"warning: {', '.join(unbounded[:4])}{' ...' if len(unbounded) > 4 else ''}: "
              f"every rate the search tried met the SLOs, up to its ceiling: such a goodput "
              f"is a lower bound, and a run that never loads the cluster (a short trace "
              f"window, few requests) reads as an unbounded rate")
    print(format_table(rows))
    shown = {row.space for row in rows}
    unsimulated = sorted({r.candidate.space for r in outcome.records} - shown)
    if unsimulated and outcome.stopped_at_limit:  # a policy left out is no policy beaten
        print(f"not simulated before the time limit (so not ranked): "
              f"{', '.join(unsimulated[:6])}{' ...' if len(unsimulated) > 6 else ''}")
    if not short and outcome.stopped_at_limit:  # not "nothing meets the SLOs": nothing ran
        print(f"no simulation finished within the time limit ({args.time_limit:g}s; loading "
              f"and screening the {evaluated} configurations took {screened_s:.1f}s): no "
              f"winner; give --time-limit more")
    else:
        print(format_verdict(result, rows))
        note = format_decode_queue_note(result.winner, base.slo.targets(), base.goodput.target)
        if note:
            print(note)
    for fidelity in ("short", "long"):
        print(format_screen_error(screen_error(outcome, fidelity)))
    if args.out:
        out: Path = args.out
        points = pareto_points(outcome)
        (out / "pareto.json").write_text(json.dumps([asdict(p) for p in points], indent=1))
        from pdserve.planning.plot import plot_pareto

        plot_pareto(out / "pareto.png", points, base.slo.targets(),
                    f"{base.perf.model} on {gpus} x {base.perf.gpu}, {base.workload.trace}")
        if result.winner is not None:
            config = winner_config(base, result.winner.candidate)
            if wanted is not None:  # the config replays a run as long as the plan's
                config = config.with_values({"workload.synthetic_requests": min(
                    wanted, base.workload.synthetic_requests)})
            elif not is_session_workload(base.workload.trace):  # a trace: replayed as often
                #  as the confirmations drew it (a 64-GPU plan's winner.yaml replayed
                #  azure-conv once, 7 s of arrivals at its goodput: 36 % above the plan)
                config = config.with_values(trace_repeat(base, len(workload), LONG.requests(
                    sustained_rps, scale)))
            write_config(out / "winner.yaml", config,
                         f"pdserve plan's winner: {result.winner.space}, "
                         f"{result.winner.candidate.describe()}\n"
                         f"pdserve simulate --config {out / 'winner.yaml'}  (goodput search "
                         f"on the whole workload)\npdserve serve --config "
                         f"{out / 'winner.yaml'}")
        written = write_plan_report(out, base, gpus, points, rows, result, plan_json(
            evaluated, time.monotonic() - started, rows, result))
        print(f"wrote {out}/: pareto.png, pareto.json" + (", winner.yaml" if result.winner
                                                          else "")
              + "".join(f", {name}" for name in written))
    if args.json:
        Path(args.json).write_text(json.dumps(
            plan_json(evaluated, time.monotonic() - started, rows, result), indent=1) + "\n")
    return 0 if result.winner is not None else 1
