"""Arrow against the paper's baselines (Arrow sec. 7.1-7.2, Fig. 7), and a TPOT-SLO sweep.

Llama-3.1-8B on 8 x H800 (`pdserve.perf.presets.perf_model("llama-3.1-8b", "h800", tp,
backend)`, `--backend`: the presets' default unless given; the capacity table names it):
  vllm-tp8       vLLM: one colocated instance over all 8 GPUs (TP 8), chunked prefill
  vllm-1p1d-tp4  vLLM-disaggregated: 1 prefill + 1 decode instance, TP 4 each
  best-xpyd      DistServe-like: the best fixed xPyD split (x + y = 8, TP 1), found offline by
                 a goodput search of every split for each workload and SLO
  colocated-8    8 independent colocated TP 1 instances (not in the paper)
  arrow          Arrow, 8 TP 1 instances starting 4P4D (a flipped instance dwells 5 s)
  arrow-no-dwell the same without the dwell time (pdserve's addition, measured both ways)
Workloads and SLOs from Table 1 (azure-code TTFT 3 s / TPOT 0.1 s, azure-conv 2 s / 0.15 s,
mooncake-conv 30 s / 0.1 s on its first 10 minutes). Goodput: the highest rate scale with
>= 90 % SLO attainment (`pdserve.metrics.goodput`), bisected to --tolerance.

1. Paper table: each policy on the full workloads at the paper's SLOs; at its goodput rate
   the P90 TTFT/TPOT, TTFT and TPOT attainment (which target binds) and flips per minute.
   Plots: attainment against rate (baselines_<workload>.png), Arrow's pools over time at its
   goodput rate (pools_<workload>.png).
2. Diagnosis: every policy at the best policy's goodput rate, plus Arrow's per-instance load
   (time on the prefill side, prefills and decodes served, P90 TPOT of its decodes, running
   tokens) and its flips by rule.
3. TPOT-SLO sweep (25-150 ms, TTFT SLO fixed) on the first --sweep-duration seconds of each
   trace (default 600: the full Azure hours at every SLO take too long on 2 shared cores),
   bisected to --sweep-tolerance, plotted as goodput against the TPOT SLO.

    python bench/arrow_baselines.py --out docs/results/arrow   # see docs/results/arrow.md
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from pdserve.config import Config
from pdserve.metrics import plots
from pdserve.metrics.goodput import GoodputResult
from pdserve.metrics.summary import tpot_s
from pdserve.perf.presets import DEFAULT_BACKEND, perf_model
from pdserve.sim.runner import Experiment
from pdserve.sim.simulator import SimResult

WORKLOADS = {  # trace, TTFT SLO, the paper's TPOT SLO, duration (None: whole trace)
    "azure-code": ("azure-code", 3.0, 0.10, None),
    "azure-conv": ("azure-conv", 2.0, 0.15, None),
    "mooncake-conv": ("mooncake-conv", 30.0, 0.10, 600.0),
}
TPOT_SWEEP_S = (0.025, 0.05, 0.075, 0.10, 0.15)


@dataclass(frozen=True)
class Setup:
    name: str
    policy: str
    tp: int
    instances: int = 8  # colocated
    prefill: int = 4  # disaggregated
    decode: int = 4
    min_dwell_s: float = 5.0  # arrow
    backend: str = DEFAULT_BACKEND  # the performance source (`perf.backend`)

    def config(self, workload: str, tpot_slo_s: float, duration_s: float | None,
               tolerance: float) -> Config:
        trace, ttft_slo_s, _, _ = WORKLOADS[workload]
        return Config().with_values({
            "workload.trace": trace, "workload.duration_s": duration_s,
            "policy.name": self.policy, "perf.tp": self.tp, "perf.model": "llama-3.1-8b",
            "perf.gpu": "h800", "perf.backend": self.backend,
            "cluster.instances": self.instances,
            "cluster.prefill": self.prefill, "cluster.decode": self.decode,
            "slo.ttft_s": ttft_slo_s, "slo.tpot_s": tpot_slo_s, "goodput.tolerance": tolerance,
            "policy.arrow.min_dwell_s": self.min_dwell_s})


SETUPS = [Setup("vllm-tp8", "colocated", 8, instances=1),
          Setup("vllm-1p1d-tp4", "static-pd", 4, prefill=1, decode=1),
          *[Setup(f"xpyd-{x}p{8 - x}d", "static-pd", 1, prefill=x, decode=8 - x)
            for x in range(1, 8)],
          Setup("colocated-8", "colocated", 1, instances=8),
          Setup("arrow", "arrow", 1),
          Setup("arrow-no-dwell", "arrow", 1, min_dwell_s=0.0)]
SHOWN = ("vllm-tp8", "vllm-1p1d-tp4", "best-xpyd", "colocated-8", "arrow", "arrow-no-dwell")


@dataclass
class RunStats:
    """One run at one rate scale."""

    rate_scale: float
    rate_rps: float
    attainment: float
    ttft_attainment: float
    tpot_attainment: float
    ttft_p90_s: float
    tpot_p90_s: float
    flips_per_min: float
    flips_by_rule: dict[str, int]


@dataclass
class Searched:
    workload: str
    tpot_slo_s: float
    setup: str
    goodput: GoodputResult
    at_goodput: RunStats
    pool_times_s: list[float]  # roles at each monitor tick of the run at goodput
    pool_roles: list[list[str]]


def run_stats(experiment: Experiment, result: SimResult, scale: float) -> RunStats:
    summary = experiment.summarize(result)
    rules = Counter(c.reason.split(":")[0] for c in result.role_changes
                    if not c.reason.startswith("settle"))
    return RunStats(scale, scale * experiment.workload.mean_rate_rps, summary.slo_attainment,
                    summary.ttft_attainment, summary.tpot_attainment, summary.ttft_s.p90,
                    summary.tpot_s.p90, result.flips / (result.end_s / 60) if result.end_s
                    else 0.0, dict(rules))


def search(workload: str, tpot_slo_s: float, duration_s: float | None, setup: Setup,
           tolerance: float) -> Searched:
    experiment = Experiment.from_config(setup.config(workload, tpot_slo_s, duration_s,
                                                     tolerance))
    goodput = experiment.goodput()
    scale = goodput.rate_scale or min(p.rate_scale for p in goodput.points)
    result = experiment.simulate(scale)
    return Searched(workload, tpot_slo_s, setup.name, goodput,
                    run_stats(experiment, result, scale), [x.time_s for x in result.samples],
                    [[role.value for role in x.roles] for x in result.samples])


def per_instance(result: SimResult) -> list[dict[str, float]]:
    """Each instance's share of time on the prefill side, work served, decode TPOT, load."""
    rows = []
    for i in range(len(result.initial_roles)):
        decoded = [tpot_s(r) for r in result.requests
                   if r.decode_instance == i and r.finished and r.output_tokens > 1]
        samples = result.samples
        rows.append({
            "instance": i,
            "prefill_side_share": float(np.mean([s.roles[i].takes_prefill for s in samples])),
            "prefills": sum(r.prefill_instance == i for r in result.requests),
            "decodes": len(decoded),
            "tpot_p90_ms": 1e3 * float(np.percentile(decoded, 90)) if decoded else 0.0,
            "running_tokens_mean": float(np.mean([s.running_tokens[i] for s in samples])),
            "prefill_queue_tokens_mean": float(np.mean([s.prefill_queue_tokens[i]
                                                        for s in samples]))})
    return rows


def diagnose(workload: str, setup: Setup, scale: float) -> tuple[RunStats, list[dict]]:
    _, _, tpot_slo_s, duration_s = WORKLOADS[workload]
    experiment = Experiment.from_config(setup.config(workload, tpot_slo_s, duration_s, 0.02))
    result = experiment.simulate(scale)
    return run_stats(experiment, result, scale), per_instance(result)


def print_capacity(backend: str, chunk_tokens: int = 2048, batch: int = 64,
                   context: int = 1500) -> None:
    """What the performance model gives each setup: prefill capacity, decode and mixed step."""
    print(f"priced by {perf_model('llama-3.1-8b', 'h800', 1, backend).name}")
    print(f"model capacity (perf_model('llama-3.1-8b', 'h800', tp); a {chunk_tokens}-token "
          f"chunk; a decode batch of {batch} x {context} context tokens)")
    print(f"{'setup':<15}{'inst x TP':>10}{'P-side inst':>12}{'prefill tok/s':>14}"
          f"{'all P-side':>11}{'decode ms':>10}{'mixed ms':>9}{'KV tok/inst':>12}")
    rows = [("vllm-tp8", 1, 8, 1), ("vllm-1p1d-tp4", 2, 4, 1), ("xpyd 7p1d", 8, 1, 7),
            ("colocated-8", 8, 1, 8), ("arrow (max)", 8, 1, 7)]
    for name, count, tp, prefill_side in rows:
        perf = perf_model("llama-3.1-8b", "h800", tp, backend)
        per_instance = chunk_tokens / perf.prefill.time_s(chunk_tokens, chunk_tokens ** 2)
        decode_s = perf.decode.step_s(batch, batch * context)
        prefill_tokens = chunk_tokens - batch  # the token budget left beside the decodes
        mixed_s = perf.batch_time_s(batch, batch * context, prefill_tokens, prefill_tokens ** 2)
        print(f"{name:<15}{f'{count} x {tp}':>10}{prefill_side:>12}{per_instance:>14.0f}"
              f"{prefill_side * per_instance:>11.0f}{1e3 * decode_s:>10.1f}{1e3 * mixed_s:>9.1f}"
              f"{perf.kv_capacity_tokens:>12}")


def best_split(found: list[Searched]) -> Searched:
    splits = [s for s in found if s.setup.startswith("xpyd-")]
    return max(splits, key=lambda s: s.goodput.rate_scale)


def shown(found: list[Searched]) -> dict[str, Searched]:
    by_name = {s.setup: s for s in found}
    best = best_split(found)
    return {name: best if name == "best-xpyd" else by_name[name] for name in SHOWN}


def print_table(title: str, rows: dict[str, Searched]) -> None:
    print(f"\n{title}")
    print(f"{'policy':<24}{'goodput x':>10}{'req/s':>9}{'P90 TTFT s':>11}{'P90 TPOT ms':>12}"
          f"{'TTFT att':>9}{'TPOT att':>9}{'flips/min':>10}")
    for name, s in rows.items():
        label = f"{name} ({s.setup[5:]})" if name == "best-xpyd" else name
        st = s.at_goodput
        print(f"{label:<24}{s.goodput.rate_scale:>10.3f}{s.goodput.rate_rps:>9.2f}"
              f"{st.ttft_p90_s:>11.3f}{1e3 * st.tpot_p90_s:>12.1f}"
              f"{100 * st.ttft_attainment:>8.1f}%{100 * st.tpot_attainment:>8.1f}%"
              f"{st.flips_per_min:>10.2f}")


def print_diagnosis(workload: str, scale: float, rate_rps: float,
                    runs: dict[str, tuple[RunStats, list[dict]]]) -> None:
    print(f"\n{workload}: every policy at {scale:.3f}x ({rate_rps:.2f} req/s), the best "
          "goodput rate")
    print(f"{'policy':<24}{'attain':>8}{'TTFT att':>9}{'TPOT att':>9}{'P90 TTFT s':>11}"
          f"{'P90 TPOT ms':>12}  flips by rule")
    for name, (st, _) in runs.items():
        print(f"{name:<24}{100 * st.attainment:>7.1f}%{100 * st.ttft_attainment:>8.1f}%"
              f"{100 * st.tpot_attainment:>8.1f}%{st.ttft_p90_s:>11.3f}"
              f"{1e3 * st.tpot_p90_s:>12.1f}  {st.flips_by_rule or '-'}")
    for name in ("arrow", "arrow-no-dwell", "colocated-8"):
        print(f"{name} per instance: prefill-side share, prefills, decodes, P90 TPOT ms, "
              "mean running tokens, mean prefill queue tokens")
        for row in runs[name][1]:
            print(f"  {row['instance']}: {row['prefill_side_share']:.2f} {row['prefills']:>5}"
                  f" {row['decodes']:>5} {row['tpot_p90_ms']:>7.1f}"
                  f" {row['running_tokens_mean']:>9.0f} {row['prefill_queue_tokens_mean']:>9.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS),
                        choices=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=Path("results/arrow"))
    parser.add_argument("--tolerance", type=float, default=0.02, help="goodput bisection")
    parser.add_argument("--sweep-duration", type=float, default=600.0,
                        help="seconds of each trace in the TPOT sweep (Mooncake: <= 600)")
    parser.add_argument("--sweep-tolerance", type=float, default=0.05)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--capacity-only", action="store_true",
                        help="print the model's capacity per setup and stop")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="performance source: vllm, "
                        "sglang, trtllm (@version optional) or vidur [%(default)s]")
    args = parser.parse_args()
    print_capacity(args.backend)
    setups = [replace(s, backend=args.backend) for s in SETUPS]
    if args.capacity_only:
        return
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    jobs = []  # (workload, tpot, duration, setup, tolerance, kind)
    for workload in args.workloads:
        _, _, paper_tpot_s, duration_s = WORKLOADS[workload]
        clip_s = min(duration_s or args.sweep_duration, args.sweep_duration)
        jobs += [(workload, paper_tpot_s, duration_s, s, args.tolerance, "paper")
                 for s in setups]
        for tpot in TPOT_SWEEP_S:
            if (tpot, clip_s, args.sweep_tolerance) == (paper_tpot_s, duration_s,
                                                         args.tolerance):
                continue  # the paper table's searches are this sweep point
            jobs += [(workload, tpot, clip_s, s, args.sweep_tolerance, "sweep")
                     for s in setups]
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(search, *job[:5]) for job in jobs]
        for done, future in enumerate(as_completed(futures), 1):
            s = future.result()
            print(f"[{time.perf_counter() - started:6.0f} s] {done}/{len(jobs)} {s.workload} "
                  f"TPOT {1e3 * s.tpot_slo_s:g} ms {s.setup}: {s.goodput.rate_rps:.2f} req/s",
                  file=sys.stderr, flush=True)
        found = [future.result() for future in futures]
    kinds = [j[5] for j in jobs]
    report: dict = {"paper": {}, "diagnosis": {}, "sweep": {}}
    for workload in args.workloads:
        _, ttft_slo_s, paper_tpot_s, duration_s = WORKLOADS[workload]
        mine = [s for s, kind in zip(found, kinds, strict=True)
                if kind == "paper" and s.workload == workload]
        rows = shown(mine)
        span = f"first {duration_s:g} s" if duration_s else "full trace"
        print_table(f"{workload} (TTFT {ttft_slo_s:g} s, TPOT {1e3 * paper_tpot_s:g} ms, "
                    f"{span})", rows)
        print("fixed splits, goodput x: " + ", ".join(
            f"{s.setup[5:]} {s.goodput.rate_scale:.2f}" for s in mine
            if s.setup.startswith("xpyd-")))
        plots.plot_attainment(args.out / f"baselines_{workload}.png",
                              {n: s.goodput for n, s in rows.items()},
                              f"{workload}: TTFT {ttft_slo_s:g}s, TPOT {paper_tpot_s:g}s")
        report["paper"][workload] = {n: {"setup": s.setup, "goodput_scale":
                                         s.goodput.rate_scale, "goodput_rps":
                                         s.goodput.rate_rps, **asdict(s.at_goodput)}
                                     for n, s in rows.items()}
        arrow = rows["arrow"]
        plots.plot_pool_sizes(args.out / f"pools_{workload}.png", arrow.pool_times_s,
                              arrow.pool_roles, f"arrow pools on {workload} at its goodput "
                              f"rate ({arrow.goodput.rate_rps:.1f} req/s)")
        winner = max(rows.values(), key=lambda s: s.goodput.rate_scale)
        by_name = {s.name: s for s in setups}
        probes = {n: diagnose(workload, by_name[s.setup], winner.goodput.rate_scale)
                  for n, s in rows.items()}
        print_diagnosis(workload, winner.goodput.rate_scale, winner.goodput.rate_rps, probes)
        report["diagnosis"][workload] = {
            "rate_scale": winner.goodput.rate_scale,
            "runs": {n: {**asdict(st), "instances": inst} for n, (st, inst) in probes.items()}}
    print("\nTPOT-SLO sweep: goodput req/s (clips; best-xpyd split in brackets)")
    panels: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for workload in args.workloads:
        swept = {s.tpot_slo_s for s, kind in zip(found, kinds, strict=True)
                 if kind == "sweep" and s.workload == workload}
        sweep = [s for s, kind in zip(found, kinds, strict=True) if s.workload == workload
                 and (kind == "sweep" or s.tpot_slo_s not in swept)]
        curves: dict[str, list[tuple[float, float]]] = {n: [] for n in SHOWN}
        print(f"{workload:<14}" + "".join(f"{n:>16}" for n in SHOWN))
        for tpot in TPOT_SWEEP_S:
            rows = shown([s for s in sweep if s.tpot_slo_s == tpot])
            cells = []
            for n, s in rows.items():
                curves[n].append((1e3 * tpot, s.goodput.rate_rps))
                tag = f"[{s.setup[5:]}]" if n == "best-xpyd" else ""
                cells.append(f"{tag}{s.goodput.rate_rps:.2f}")
            print(f"{f'{1e3 * tpot:g} ms':<14}" + "".join(f"{c:>16}" for c in cells))
            report["sweep"].setdefault(workload, {})[f"{1e3 * tpot:g}"] = {
                n: {"setup": s.setup, "goodput_rps": s.goodput.rate_rps,
                    **asdict(s.at_goodput)} for n, s in rows.items()}
        clip = sweep[0].goodput.points[0].rate_rps / sweep[0].goodput.points[0].rate_scale
        panels[f"{workload} (TTFT {WORKLOADS[workload][1]:g} s, "
               f"{clip:.2f} req/s at 1x)"] = curves
    plots.plot_slo_sweep(args.out / "tpot_sweep.png", panels)
    (args.out / "arrow_baselines.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{len(jobs)} goodput searches in {time.perf_counter() - started:.0f} s; "
          f"wrote {args.out}/")


if __name__ == "__main__":
    main()
