"""Live vs simulated with each live run's own step costs: the simulator's structure alone.

`bench/live_fidelity.py` calibrates in separate live runs and compares with later ones. On
this shared 2-core box the machine's speed drifts by tens of per cent within minutes
(docs/results/fidelity.md), so that comparison mixes the simulator's error with the drift.
Every live run of that benchmark also logged its own batches and its requests' TTFT split,
so this script holds the hardware fixed: for each live run it fits the runtime model to
that run's step log (colocated: one fit over both workers; the 1P1D policies: prefill from
the batches run in a prefill role, decode from those in a decode role, as
`fit_step_log_by_role` reads the driver's role log, so Arrow's flips are followed; runs
logged before the role log existed: instance 0's and instance 1's batches), takes that
run's control-plane latency (median and P90 of the client's in + out parts), simulates the
identical workload, and compares per run. What remains is what the simulator gets wrong
given the costs: queueing, batching, routing, hand-offs.
No live run is made; it reads a `live_fidelity.py --out` directory (its `timelines/`, or
`timelines.tar.xz` as the results in docs/ keep them).

    python bench/fidelity_same_run.py docs/results/fidelity/ledger-spread   # 3 s
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from live_fidelity import (
    INSTANCES,
    MAX_BATCH,
    POLICIES,
    STATS,
    error_pct,
    run_model,
    same_run_stats,
    simulate,
    stats_of,
)

from pdserve.perf.fitted import PerfModel
from pdserve.types import SLO
from pdserve.workload.traces import load_trace
from pdserve.workload.workload import Workload

SECTIONS = {"at_knee": "at the benchmark's rate", "below_knee": "below it"}


def offered_load(policy: str, model: PerfModel, workload: Workload,
                 duration_s: float) -> tuple[float, float]:
    """(prefill, decode) utilisation the workload offers an instance, priced by `model`:
    prefill = each prompt's solo prefill time over the duration (an upper bound: a batch
    shares one intercept), decode = the output tokens after the first per second over the
    most a full batch (`MAX_BATCH`, at the workload's mean context) can produce. Colocated:
    both over its 2 instances, shared. Near 1, a queue's wait is a steep function of the
    step cost, so no fit is good enough to reproduce it run to run."""
    prefill_s = sum(model.prefill.time_s(int(n), int(n) * int(n))
                    for n in workload.input_tokens)
    context = float(np.mean(workload.input_tokens) + np.mean(workload.output_tokens) / 2)
    full_batch_tokens_s = MAX_BATCH / model.decode.step_s(MAX_BATCH, int(MAX_BATCH * context))
    decode_s = float(np.sum(workload.output_tokens - 1)) / full_batch_tokens_s
    if policy == "colocated":
        shared = (prefill_s + decode_s) / (INSTANCES * duration_s)
        return shared, shared
    return prefill_s / duration_s, decode_s / duration_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a live_fidelity.py output directory")
    parser.add_argument("--timelines", type=Path, default=None,
                        help="where the per-run logs are (default: OUT/timelines)")
    parser.add_argument("--start", type=float, default=600.0)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--max-input-tokens", type=int, default=512)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    args = parser.parse_args()
    report = json.loads((args.out / "live_fidelity.json").read_text())
    timelines = args.timelines or args.out / "timelines"
    archive = args.out / "timelines.tar.xz"
    if not timelines.exists() and archive.exists():
        unpacked = Path(tempfile.mkdtemp(prefix="pdserve-timelines-"))
        with tarfile.open(archive) as tar:
            tar.extractall(unpacked, filter="data")
        timelines = unpacked / "timelines"
    slo = SLO(report["slo"]["ttft_s"], report["slo"]["tpot_s"])
    base_perf = PerfModel.load(args.out / "tiny-profile-contention1.json")
    trace = (load_trace("azure-conv").window(args.start)
             .clipped(args.max_input_tokens, args.max_output_tokens))
    results: dict[str, object] = {}
    for section, title in SECTIONS.items():
        if section not in report:
            continue
        rate = report[section]["rate_scale"]
        workload = trace.scaled(rate).window(0.0, args.duration)
        print(f"{title} (rate {rate}, {len(workload)} requests): error of the mean of the "
              f"per-run simulations against the live mean; per-run errors in brackets")
        print(f"{'policy':<11}{'stat':<12}{'live mean':>10}{'same run':>10}{'err':>7}"
              f"{'+ spread':>10}{'err':>7}  per run (+ spread)")
        for policy in POLICIES:
            entry = report[section]["policies"][policy]
            sims: dict[str, list[dict[str, float]]] = {"mean": [], "spread": []}
            loads: list[tuple[float, float]] = []
            for repeat, split in enumerate(entry["ttft_split"]):
                directory = timelines / f"{policy}-x{rate:g}-{repeat}"
                model = run_model(policy, directory, base_perf)  # fitted once, used twice
                loads.append(offered_load(policy, model, workload, args.duration))
                sims["mean"].append(stats_of(simulate(policy, slo, workload, model,
                                                      split["control_p50_s"])))
                sims["spread"].append(same_run_stats(policy, slo, workload, model, split))
            results[f"{section}/{policy}"] = sims
            for stat in STATS:
                live = [run[stat] for run in entry["live"]]
                mean_live = float(np.mean(live))
                plain = float(np.mean([s[stat] for s in sims["mean"]]))
                spread = float(np.mean([s[stat] for s in sims["spread"]]))
                per_run = ", ".join(f"{error_pct(s[stat], v):+.0f}"
                                    for s, v in zip(sims["spread"], live, strict=True))
                print(f"{policy:<11}{stat:<12}{mean_live:>10.4f}{plain:>10.4f}"
                      f"{error_pct(plain, mean_live):>6.0f}%{spread:>10.4f}"
                      f"{error_pct(spread, mean_live):>6.0f}%  [{per_run}] %")
            print(f"{'':<11}load by each run's own model: prefill "
                  + "/".join(f"{p:.2f}" for p, _ in loads) + ", decode "
                  + "/".join(f"{d:.2f}" for _, d in loads))
    (args.out / "same_run.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
