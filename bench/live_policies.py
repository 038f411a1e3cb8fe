"""Live vs simulated: the same replay on 4 `tiny` workers and in the simulator.

1. `pdserve profile` the engine (full grid) twice: alone, and with 3 other workers decoding
   (`--contention 3`, the CPU sharing of 4 workers on this machine).
2. SLOs calibrated from that profile, for this machine: TTFT SLO = 4x the predicted prefill
   time of the clip's P90 prompt; TPOT SLO = 4x a decode step of 8 sequences at the clip's
   median context (prompt + half the output cap).
3. For colocated (4 mixed), static-pd 2P2D and arrow (2P2D start): start `pdserve serve` as
   a subprocess, replay the clip with real HTTP streaming (`pdserve bench`'s client), stop.
4. Simulate the identical workload on each profile with the same instance settings.
Prints attainment and latency percentiles side by side; writes JSON to --out.

    python bench/live_policies.py --out docs/results/live      # about 6 minutes
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from pdserve.config import Config
from pdserve.engine.profile import ProfileGrid, profile_engine
from pdserve.live.serve_and_replay import serve_and_replay
from pdserve.metrics.summary import Summary, summarize
from pdserve.perf.fitted import PerfModel
from pdserve.sim.runner import Experiment
from pdserve.types import SLO
from pdserve.workload.traces import load_trace

POLICIES = {"colocated": [], "static-pd": ["--prefill", "2", "--decode", "2"],
            "arrow": ["--prefill", "2", "--decode", "2"]}
KV_BLOCKS, CHUNK, MAX_BATCH = 2048, 512, 64


def live_run(policy: str, perf_file: Path, slo: SLO, workload, timeout_s: float):
    return serve_and_replay("tiny", 4, ["--policy", policy, *POLICIES[policy]], perf_file, slo,
                            workload, timeout_s, KV_BLOCKS, CHUNK, MAX_BATCH)


def row(label: str, summary: Summary) -> str:
    return (f"{label:<36}{summary.slo_attainment:>8.1%}{summary.ttft_s.p50:>9.3f}"
            f"{summary.ttft_s.p90:>9.3f}{summary.tpot_s.p50:>9.4f}{summary.tpot_s.p90:>9.4f}"
            f"{summary.completed:>6}/{summary.requests}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/live"))
    parser.add_argument("--start", type=float, default=600.0, help="trace second to start at")
    parser.add_argument("--rate-scale", type=float, default=0.4)
    parser.add_argument("--duration", type=float, default=60.0, help="replay seconds")
    parser.add_argument("--max-input-tokens", type=int, default=512)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    perf_file = args.out / "tiny-profile.json"
    contended_file = args.out / "tiny-profile-contention3.json"
    started = time.perf_counter()
    perf = profile_engine("tiny", KV_BLOCKS, ProfileGrid())
    perf.save(perf_file)
    profile_engine("tiny", KV_BLOCKS, ProfileGrid(), contention=3).save(contended_file)
    print(f"profiled tiny alone and under contention in {time.perf_counter() - started:.0f}s: "
          f"prefill R2 {perf.prefill.r2:.4f}, decode R2 {perf.decode.r2:.4f}")
    workload = (load_trace("azure-conv").window(args.start).scaled(args.rate_scale)
                .window(0.0, args.duration)
                .clipped(args.max_input_tokens, args.max_output_tokens))
    p90_prompt = int(np.percentile(workload.input_tokens, 90))
    median_context = int(np.median(workload.input_tokens)) + args.max_output_tokens // 2
    slo = SLO(4 * perf.prefill.time_s(p90_prompt, p90_prompt**2),
              4 * perf.decode.step_s(8, 8 * median_context))
    print(f"clip: {len(workload)} requests over {workload.span_s:.0f}s; SLOs (4x profile): "
          f"TTFT {slo.ttft_s:.3f}s (P90 prompt {p90_prompt}), TPOT {slo.tpot_s:.4f}s "
          f"(8 x {median_context} tokens)")
    report = {"slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
              "requests": len(workload), "policies": {}}
    print(f"{'run':<36}{'attain':>8}{'TTFT50':>9}{'TTFT90':>9}{'TPOT50':>9}{'TPOT90':>9}"
          f"{'done':>10}")
    for policy in POLICIES:
        live = summarize(live_run(policy, perf_file, slo, workload, args.duration + 180), slo)
        prefill, decode = (2, 2) if POLICIES[policy] else (4, 4)
        config = Config().with_values({"policy.name": policy, "cluster.instances": 4,
                                       "cluster.prefill": prefill, "cluster.decode": decode,
                                       "instance.chunk_size_tokens": CHUNK,
                                       "instance.max_batch_size": MAX_BATCH,
                                       "slo.ttft_s": slo.ttft_s, "slo.tpot_s": slo.tpot_s,
                                       "monitor.interval_s": 0.5})
        runs = {"live": live}
        for kind, model_file in (("sim, profile alone", perf_file),
                                 ("sim, profile contended", contended_file)):
            experiment = Experiment(config, workload, PerfModel.load(model_file))
            runs[kind] = summarize(experiment.simulate(1.0).requests, slo)
        for kind, summary in runs.items():
            print(row(f"{policy} {kind}", summary))
        report["policies"][policy] = {
            kind: {"slo_attainment": s.slo_attainment, "ttft_p50_s": s.ttft_s.p50,
                   "ttft_p90_s": s.ttft_s.p90, "tpot_p50_s": s.tpot_s.p50,
                   "tpot_p90_s": s.tpot_s.p90, "completed": s.completed}
            for kind, s in runs.items()}
    (args.out / "live_policies.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"total {time.perf_counter() - started:.0f}s; wrote {args.out}/")


if __name__ == "__main__":
    main()
