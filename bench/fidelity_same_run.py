"""Live vs simulated with each live run's own step costs: the simulator's structure alone.

`bench/live_fidelity.py` calibrates in separate live runs and compares with later ones. On
this shared 2-core box the machine's speed drifts by tens of per cent within minutes
(docs/results/fidelity.md), so that comparison mixes the simulator's error with the drift.
Every live run of that benchmark also logged its own batches and its requests' TTFT split,
so this script holds the hardware fixed: for each live run it fits the runtime model to
that run's step log (colocated: one fit over both workers; the 1P1D policies: prefill from
instance 0's batches, decode from instance 1's, as `fit_step_log_by_role`; Arrow's flips
blur that split), takes that run's control-plane latency (median and P90 of the client's
in + out parts), simulates the identical workload, and compares per run. What remains is
what the simulator gets wrong given the costs: queueing, batching, routing, hand-offs.
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
    POLICIES,
    STATS,
    error_pct,
    run_model,
    same_run_stats,
    simulate,
    stats_of,
)

from pdserve.bench.traces import load_trace
from pdserve.perf.fitted import PerfModel
from pdserve.types import SLO

SECTIONS = {"at_knee": "at the benchmark's rate", "below_knee": "below it"}


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
            for repeat, split in enumerate(entry["ttft_split"]):
                directory = timelines / f"{policy}-x{rate:g}-{repeat}"
                model = run_model(policy, directory, base_perf)  # fitted once, used twice
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
    (args.out / "same_run.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
