"""TaiChi's slider search (TaiChi sec. 3.1: "the optimal configuration for a given workload
and SLO can be determined via offline search").

The grid covers the whole design space with one policy, `taichi`:
  pure aggregation     S_P == S_D == c for every candidate chunk size c
  pure disaggregation  S_D == 0, S_P = `DISAGGREGATED_CHUNK_TOKENS` (chunking off), every
                       R_PD from 1:(N-1) to (N-1):1
  hybrid               every R_PD, S_P, and S_D with 0 < S_D < S_P
Each point's goodput is searched by simulation (`Experiment.goodput`: the highest rate with
>= 90 % SLO attainment). Points run in parallel processes, each holding the workload and the
performance model once; whatever is not done by the time limit is skipped and reported.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pdserve.config import Config
from pdserve.config_flags import config_from_args
from pdserve.planning.run_length import burst_goodput_note
from pdserve.planning.splits import split_counts
from pdserve.sim.runner import Experiment, load_perf_model, load_workload

DISAGGREGATED_CHUNK_TOKENS = 16384  # "S_P = the maximum context" for the workloads shipped


@dataclass(frozen=True)
class SliderPoint:
    p_heavy: int  # R_PD = p_heavy : d_heavy
    d_heavy: int
    chunk_p_tokens: int  # S_P
    chunk_d_tokens: int  # S_D

    @property
    def mode(self) -> str:
        if self.chunk_p_tokens == self.chunk_d_tokens:
            return "aggregation"
        return "disaggregation" if self.chunk_d_tokens == 0 else "hybrid"

    @property
    def label(self) -> str:
        if self.mode == "aggregation":
            return f"aggregation, chunk {self.chunk_p_tokens}"
        if self.mode == "disaggregation":
            return f"disaggregation {self.p_heavy}P:{self.d_heavy}D"
        return (f"{self.p_heavy} P-heavy @{self.chunk_p_tokens} + {self.d_heavy} D-heavy "
                f"@{self.chunk_d_tokens}")

    def config(self, base: Config) -> Config:
        return base.with_values({"policy.name": "taichi", "cluster.prefill": max(1, self.p_heavy),
                                 "cluster.decode": self.d_heavy - (self.p_heavy == 0),
                                 "policy.taichi.chunk_p_tokens": self.chunk_p_tokens,
                                 "policy.taichi.chunk_d_tokens": self.chunk_d_tokens})


def slider_grid(instances: int, chunk_sizes: Sequence[int],
                d_chunk_sizes: Sequence[int]) -> list[SliderPoint]:
    if instances < 2:
        raise ValueError(f"the slider search needs at least 2 instances, got {instances}")
    points = [SliderPoint(0, instances, c, c) for c in sorted(set(chunk_sizes))]
    splits = split_counts(instances)
    if 0 in d_chunk_sizes:
        points += [SliderPoint(p, instances - p, DISAGGREGATED_CHUNK_TOKENS, 0) for p in splits]
    for p in splits:
        for s_p in sorted(set(chunk_sizes)):
            points += [SliderPoint(p, instances - p, s_p, s_d)
                       for s_d in sorted(set(d_chunk_sizes)) if 0 < s_d < s_p]
    return points


@dataclass(frozen=True)
class PlanResult:
    point: SliderPoint
    goodput_rps: float
    attainment: float  # at the goodput rate
    ttft_p90_s: float
    tpot_p90_s: float


_EXPERIMENT: Experiment | None = None


def _init_worker(base: Config) -> None:
    global _EXPERIMENT
    _EXPERIMENT = Experiment.from_config(base)


def evaluate(point: SliderPoint, experiment: Experiment | None = None) -> PlanResult:
    """The goodput of one slider setting (in a worker process: its own experiment)."""
    base = experiment or _EXPERIMENT
    assert base is not None, "evaluate needs an experiment (or a worker initialised with one)"
    trial = Experiment(point.config(base.config), base.workload, base.perf)
    goodput = trial.goodput()
    passing = [p for p in goodput.points if p.rate_scale == goodput.rate_scale]
    summary = passing[0].summary if passing else None
    if passing and passing[0].decided_early:  # its latency over the whole run
        summary = trial.summarize(trial.simulate(goodput.rate_scale))
    return PlanResult(point, goodput.rate_rps,
                      summary.slo_attainment if summary else 0.0,
                      summary.ttft_s.p90 if summary else float("nan"),
                      summary.tpot_s.p90 if summary else float("nan"))


def search(base: Config, points: Sequence[SliderPoint], processes: int = 2,
           time_limit_s: float = 600.0,
           on_result: Callable[[PlanResult], None] | None = None) -> list[PlanResult]:
    """Goodput of every point that finishes within `time_limit_s`, best first."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, got {processes}")
    deadline = time.monotonic() + time_limit_s
    results: list[PlanResult] = []
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes, initializer=_init_worker, initargs=(base,)) as pool:
        pending = pool.imap_unordered(evaluate, points)
        for _ in points:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                result = pending.next(timeout=remaining)
            except multiprocessing.TimeoutError:
                break
            results.append(result)
            if on_result is not None:
                on_result(result)
        pool.terminate()
    return sorted(results, key=lambda r: (-r.goodput_rps, r.point.label))


def plan_defaults() -> Config:
    """Where `pdserve plan --policy taichi` starts: the simulate defaults."""
    return Config()


def _base_config(args: argparse.Namespace) -> Config:
    """The simulate defaults, then `--config FILE`, then the options; policy taichi."""
    return config_from_args(args, plan_defaults()).with_values({"policy.name": "taichi"})


def _sizes(text: str, name: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated token counts, got {text!r}") from None
    if not sizes or min(sizes) < 0:
        raise ValueError(f"{name} must be non-negative token counts, got {text!r}")
    return sizes


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    base = _base_config(args)
    instances = args.instances or base.cluster.prefill + base.cluster.decode
    points = slider_grid(instances, _sizes(args.chunk_sizes, "--chunk-sizes"),
                         _sizes(args.d_chunk_sizes, "--d-chunk-sizes"))
    print(f"taichi slider search: {len(points)} settings of {instances} instances, "
          f"{args.jobs} processes, at most {args.time_limit:g}s; SLO TTFT "
          f"{base.slo.ttft_s:g}s TPOT {base.slo.tpot_s:g}s, {base.perf.model} on {base.perf.gpu}")
    print(f"priced by {load_perf_model(base).name}")
    started = time.monotonic()
    bar = tqdm(total=len(points), unit="setting", desc="plan", disable=True if
               args.no_progress else None)
    results = search(base, points, args.jobs, args.time_limit, lambda r: bar.update())
    bar.close()
    skipped = len(points) - len(results)
    print(f"{len(results)} settings simulated in {time.monotonic() - started:.0f}s"
          + (f"; {skipped} skipped at the time limit" if skipped else ""))
    print(f"{'rank':<5}{'setting':<42}{'goodput req/s':>14}{'attain':>8}{'TTFT p90':>10}"
          f"{'TPOT p90':>10}")
    for rank, result in enumerate(results[:args.top], 1):
        print(f"{rank:<5}{result.point.label:<42}{result.goodput_rps:>14.2f}"
              f"{result.attainment:>8.1%}{result.ttft_p90_s:>9.2f}s"
              f"{result.tpot_p90_s * 1e3:>8.0f}ms")
    if results and (note := burst_goodput_note(load_workload(base), base,
                                                results[0].goodput_rps)) is not None:
        print(f"warning: {note}")
    if results:
        best = results[0].point
        print(f"best: --policy taichi --prefill {max(1, best.p_heavy)} --decode "
              f"{best.d_heavy - (best.p_heavy == 0)} --taichi-chunk-p {best.chunk_p_tokens} "
              f"--taichi-chunk-d {best.chunk_d_tokens}")
    if args.out:
        write_outputs(args.out, base, results)
    return 0 if results else 1


def write_outputs(out: Path, base: Config, results: Sequence[PlanResult]) -> None:
    """summary.json (every setting's result) and report.html: each setting's TTFT and TPOT
    p90 against its SLO at its own goodput rate, the Pareto front of the two, the table."""
    from pdserve.metrics.report_page import write_plan
    from pdserve.metrics.views import pareto_figure, table

    slo = base.slo
    labels = [r.point.label for r in results]
    document = {"config": base.to_dict(), "planner": "taichi", "results": [
        {**asdict(r.point), "label": r.point.label, "mode": r.point.mode,
         "goodput_rps": r.goodput_rps, "attainment": r.attainment,
         "ttft_p90_s": None if math.isnan(r.ttft_p90_s) else r.ttft_p90_s,
         "tpot_p90_s": None if math.isnan(r.tpot_p90_s) else r.tpot_p90_s} for r in results]}
    written = write_plan(out, "pdserve plan: taichi sliders",
               f"{base.perf.model} on {base.perf.gpu}; SLO TTFT {slo.ttft_s:g} s, TPOT "
               f"{slo.tpot_s:g} s; each setting at its own goodput rate", document,
               [("pareto", pareto_figure(
                   "TaiChi settings: latency against the SLOs at their goodput (lower is "
                   "better; colour: goodput)", labels, [r.ttft_p90_s / slo.ttft_s for r in results],
                   [r.tpot_p90_s / slo.tpot_s for r in results], "TTFT p90 / SLO",
                   "TPOT p90 / SLO", [r.goodput_rps for r in results], "goodput req/s"))],
               table("every setting, best goodput first", ["rank", "setting", "mode",
                     "goodput req/s", "attainment", "TTFT p90 s", "TPOT p90 s"],
                     [[rank, r.point.label, r.point.mode, r.goodput_rps, r.attainment,
                       r.ttft_p90_s, r.tpot_p90_s] for rank, r in enumerate(results, 1)]),
               [("settings", str(len(results))),
                ("best goodput", f"{results[0].goodput_rps:.2f} req/s" if results else "-")])
    print(f"wrote {out}/: {', '.join(written)}")
