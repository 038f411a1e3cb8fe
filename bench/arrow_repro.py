"""Reproduce Arrow's ablation (Figure 8) in the simulator: goodput per policy and trace.

Llama-3.1-8B on 8 x H800 (one GPU per instance), priced by `--backend` (default: the presets'
default, the newest vLLM measured for the H800's tables), Table 1 SLOs:
  azure-code      TTFT 3 s,  TPOT 0.1 s   full trace
  azure-conv      TTFT 2 s,  TPOT 0.15 s  full trace
  mooncake-conv   TTFT 30 s, TPOT 0.1 s   first 10 minutes
Policies: arrow (SLO aware), min-load and round-robin (4P4D), static-pd at its best fixed
split (every xPyD with x + y = 8 is searched), colocated (8 mixed instances). For each, the
goodput search finds the highest rate scale with >= 90 % SLO attainment; at that scale the
script reports P90 TTFT, P90 TPOT and flips per minute. Plots: attainment vs rate per trace,
and Arrow's pool sizes over time at its goodput rate.

    python bench/arrow_repro.py --out docs/results/arrow      # about 10 minutes on 2 cores
    python bench/arrow_repro.py --backend vidur ...          # the Vidur-calibrated model
    python bench/arrow_repro.py --quick --out /tmp/arrow     # each trace's first 20 s, a 30 %
                                                             # search: the test suite's run
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pdserve.config import Config
from pdserve.metrics import plots
from pdserve.metrics.goodput import GoodputResult
from pdserve.perf.presets import DEFAULT_BACKEND, perf_model
from pdserve.sim.runner import Experiment

MODEL, GPU = "llama-3.1-8b", "h800"
TRACES = {
    "azure-code": {"slo.ttft_s": 3.0, "slo.tpot_s": 0.1},
    "azure-conv": {"slo.ttft_s": 2.0, "slo.tpot_s": 0.15},
    "mooncake-conv": {"slo.ttft_s": 30.0, "slo.tpot_s": 0.1, "workload.duration_s": 600.0},
}


@dataclass
class Outcome:
    trace: str
    label: str
    goodput: GoodputResult
    ttft_p90_s: float
    tpot_p90_s: float
    flips_per_min: float
    times_s: list[float]
    roles: list[list[str]]


QUICK_DURATION_S = 20.0  # --quick: each trace's first seconds


def run_job(trace: str, policy: str, prefill: int, tolerance: float, backend: str,
            quick: bool = False) -> Outcome:
    window = {"workload.duration_s": QUICK_DURATION_S} if quick else {}
    config = Config().with_values({
        "perf.model": MODEL, "perf.gpu": GPU, "perf.backend": backend,
        "workload.trace": trace, "policy.name": policy, "cluster.prefill": prefill,
        "cluster.decode": 8 - prefill, "cluster.instances": 8, "goodput.tolerance": tolerance,
        **TRACES[trace], **window})
    experiment = Experiment.from_config(config)
    goodput = experiment.goodput()
    scale = goodput.rate_scale or min(p.rate_scale for p in goodput.points)
    result = experiment.simulate(scale)
    summary = experiment.summarize(result)
    label = f"static-pd {prefill}P{8 - prefill}D" if policy == "static-pd" else policy
    return Outcome(trace, label, goodput, summary.ttft_s.p90, summary.tpot_s.p90,
                   result.flips / (result.end_s / 60) if result.end_s else 0.0,
                   [s.time_s for s in result.samples],
                   [[r.value for r in s.roles] for s in result.samples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    parser.add_argument("--out", type=Path, default=Path("results/arrow"))
    parser.add_argument("--tolerance", type=float, default=0.02, help="goodput bisection")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="performance source: vllm, "
                        "sglang, trtllm (@version optional) or vidur [%(default)s]")
    parser.add_argument("--quick", action="store_true", help=f"each trace's first "
                        f"{QUICK_DURATION_S:g} s, goodput to 30 %% (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.tolerance = 0.3
    args.out.mkdir(parents=True, exist_ok=True)
    priced_by = perf_model(MODEL, GPU, 1, args.backend).name
    print(f"8 x {GPU}, priced by {priced_by}", flush=True)
    jobs = [(trace, policy, 4) for trace in args.traces
            for policy in ("arrow", "min-load", "round-robin", "colocated")]
    jobs += [(trace, "static-pd", x) for trace in args.traces for x in range(1, 8)]
    started = time.perf_counter()
    with ProcessPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(run_job, *zip(*jobs, strict=True),
                                 [args.tolerance] * len(jobs), [args.backend] * len(jobs),
                                 [args.quick] * len(jobs)))
    report: dict[str, object] = {"perf_model": priced_by}
    for trace in args.traces:
        mine = {o.label: o for o in outcomes if o.trace == trace}
        splits = [o for label, o in mine.items() if label.startswith("static-pd")]
        best_split = max(splits, key=lambda o: o.goodput.rate_scale)
        shown = [mine["arrow"], mine["min-load"], mine["round-robin"], best_split,
                 mine["colocated"]]
        print(f"\n{trace} ({TRACES[trace]})")
        print(f"{'policy':<18}{'goodput x':>10}{'req/s':>9}{'P90 TTFT s':>12}"
              f"{'P90 TPOT s':>12}{'flips/min':>10}")
        for o in shown:
            print(f"{o.label:<18}{o.goodput.rate_scale:>10.3f}{o.goodput.rate_rps:>9.2f}"
                  f"{o.ttft_p90_s:>12.3f}{o.tpot_p90_s:>12.4f}{o.flips_per_min:>10.2f}")
        ratio = mine["arrow"].goodput.rate_rps / max(mine["min-load"].goodput.rate_rps, 1e-9)
        print(f"arrow / min-load goodput: {ratio:.2f}x; static-pd splits: " + ", ".join(
            f"{o.label[10:]} {o.goodput.rate_scale:.2f}" for o in splits))
        plots.plot_attainment(args.out / f"attainment_{trace}.png",
                              {o.label: o.goodput for o in shown},
                              f"{trace}: TTFT {TRACES[trace]['slo.ttft_s']:g}s, "
                              f"TPOT {TRACES[trace]['slo.tpot_s']:g}s")
        arrow = mine["arrow"]
        plots.plot_pool_sizes(args.out / f"pools_{trace}.png", arrow.times_s, arrow.roles,
                              f"arrow pools on {trace} at its goodput rate "
                              f"({arrow.goodput.rate_rps:.1f} req/s)")
        report[trace] = {o.label: {"goodput_scale": o.goodput.rate_scale,
                                   "goodput_rps": o.goodput.rate_rps,
                                   "ttft_p90_s": o.ttft_p90_s, "tpot_p90_s": o.tpot_p90_s,
                                   "flips_per_min": o.flips_per_min}
                         for o in mine.values()}
    (args.out / "arrow_repro.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{len(jobs)} goodput searches in {time.perf_counter() - started:.0f} s; "
          f"wrote {args.out}/")


if __name__ == "__main__":
    main()
