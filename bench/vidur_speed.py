"""Vidur side by side: requests per second of event loop on the Azure conversation trace.

Vidur (microsoft/vidur at 7d47513, MIT) replays the same 19,366 requests
(`data/processed_traces/splitwise_conv.csv`, the trace pdserve ships as `azure-conv`) on 8
replicas of Llama-3-8B on A100 at TP 1 with its Sarathi scheduler (chunk 512, batch cap 512),
or vLLM's (`--vidur-scheduler vllm`, batches up to 16,384 tokens: at its default 4,096 the
1,612 longer requests never schedule). pdserve runs the same trace twice: its
`bench/sim_speed.py` setup (static-pd 4P4D, H800) and the closest analogue of Vidur's
(colocated, 8 x A100, chunk 512), both priced by the Vidur-calibrated model. Each side's
figure is the CPU time of the event loop alone (Vidur: `Simulator.run`, after its predictor
is trained and tabulated; pdserve: `Experiment.simulate`, best of 3).

Vidur's repository keeps its attention profiles out of band (the snapshot has no
`data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/attention.csv`), so this script writes
one: the A100 FlashAttention profile Vidur published for a 70B-shaped model at TP 2
(`shared/gpu-profiles/vidur-a100/attention_70b-shape_tp2.csv`: 32 query heads, 4 KV heads,
head dim 128 per GPU), relabelled as Llama-3-8B at TP 1 (32 query heads, 8 KV heads, head dim
128), decode attention times doubled (a decode step reads the KV cache, twice the KV heads),
prefill attention times kept (compute per query head, the same 32).

Vidur needs its requirements (scikit-learn, ddsketch, fasteners, wandb, plotly_express,
seaborn; a virtual environment over this one's numpy and pandas is enough). Its random-forest
grid is cut to one point (50 trees, depth 16, 2-fold): the predictions are tabulated before
the loop, so the grid changes the set-up time, not the loop's.

    python bench/vidur_speed.py --vidur /path/to/vidur --vidur-python /path/to/venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from pdserve.config import Config
from pdserve.sim.runner import Experiment

SHARED_ATTENTION = Path(__file__).resolve().parents[2] / "shared" / "gpu-profiles" / \
    "vidur-a100" / "attention_70b-shape_tp2.csv"
TRACE = "data/processed_traces/splitwise_conv.csv"
ATTENTION = "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/attention.csv"
TIMED_LOOP = """
import atexit, sys, time
from vidur.config import SimulationConfig
from vidur.simulator import Simulator
from vidur.utils.random import set_seeds
config = SimulationConfig.create_from_cli_args()
set_seeds(config.seed)
simulator = Simulator(config)
begin = time.process_time()
simulator.run()
print(f"VIDUR_LOOP_CPU_S {time.process_time() - begin:.3f}", flush=True)
atexit.unregister(simulator._write_output)
"""
PDSERVE_SETUPS = {
    "static-pd 4P4D H800 (bench/sim_speed.py)": {
        "policy.name": "static-pd", "cluster.prefill": 4, "cluster.decode": 4,
        "perf.gpu": "h800"},
    "colocated 8 x A100, chunk 512": {
        "policy.name": "colocated", "cluster.instances": 8, "perf.gpu": "a100",
        "instance.chunk_size_tokens": 512},
}


def substitute_attention(vidur: Path, source: Path) -> None:
    profile = pd.read_csv(source)
    profile["n_embd"], profile["n_q_head"], profile["n_kv_head"] = 4096, 32, 8
    profile["num_tensor_parallel_workers"] = 1
    for stat in ("min", "max", "mean", "median", "std"):
        profile[f"time_stats.attn_decode.{stat}"] *= 2
    target = vidur / ATTENTION
    target.parent.mkdir(parents=True, exist_ok=True)
    profile.to_csv(target, index=False)


def vidur_loop_cpu_s(vidur: Path, python: str, scheduler: str) -> float:
    predictor = "--random_forrest_execution_time_predictor_config_"
    args = [
        "--replica_config_device", "a100",
        "--replica_config_model_name", "meta-llama/Meta-Llama-3-8B",
        "--cluster_config_num_replicas", "8", "--replica_config_tensor_parallel_size", "1",
        "--replica_config_num_pipeline_stages", "1",
        "--request_generator_config_type", "trace_replay",
        "--trace_request_generator_config_trace_file",
        TRACE,
        "--trace_request_generator_config_max_tokens", "16384",
        "--replica_scheduler_config_type", scheduler,
        f"{predictor}num_estimators", "50", f"{predictor}max_depth", "16",
        f"{predictor}min_samples_split", "2", f"{predictor}k_fold_cv_splits", "2",
        f"{predictor}prediction_max_prefill_chunk_size", "16384",
        f"{predictor}prediction_max_batch_size", "512",
        f"{predictor}prediction_max_tokens_per_request", "16384",
        "--no-metrics_config_write_metrics", "--no-metrics_config_enable_chrome_trace",
        "--no-metrics_config_store_plots"]
    if scheduler == "sarathi":
        args += ["--sarathi_scheduler_config_chunk_size", "512",
                 "--sarathi_scheduler_config_batch_size_cap", "512"]
    else:
        args += ["--vllm_scheduler_config_max_tokens_in_batch", "16384"]
    done = subprocess.run([python, "-c", TIMED_LOOP, *args], cwd=vidur, check=True,
                          capture_output=True, text=True,
                          env={**os.environ, "WANDB_MODE": "disabled"})
    found = re.search(r"VIDUR_LOOP_CPU_S ([0-9.]+)", done.stdout)
    if found is None:
        raise RuntimeError(f"no loop time in Vidur's output: {done.stderr[-2000:]}")
    return float(found.group(1))


def pdserve_loop_cpu_s(values: dict[str, object]) -> tuple[int, int, float]:
    config = Config().with_values({"workload.trace": "azure-conv",
                                   "perf.model": "llama-3.1-8b", "perf.backend": "vidur",
                                   **values})
    experiment = Experiment.from_config(config)
    best = float("inf")
    for _ in range(3):
        begin = time.process_time()
        result = experiment.simulate()
        best = min(best, time.process_time() - begin)
    return len(result.requests), result.events, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vidur", type=Path, required=True, help="a Vidur checkout (7d47513)")
    parser.add_argument("--vidur-python", default=sys.executable,
                        help="a Python with Vidur's requirements")
    parser.add_argument("--vidur-scheduler", default="sarathi", choices=["sarathi", "vllm"])
    parser.add_argument("--attention", type=Path, default=SHARED_ATTENTION,
                        help="Vidur's published 70B-shape A100 attention profile")
    args = parser.parse_args()
    substitute_attention(args.vidur, args.attention)
    vidur_s = vidur_loop_cpu_s(args.vidur, args.vidur_python, args.vidur_scheduler)
    requests = len(pd.read_csv(args.vidur / TRACE))
    vidur_rps = requests / vidur_s
    print(f"Vidur ({args.vidur_scheduler}, 8 x A100): {requests} requests, loop CPU "
          f"{vidur_s:.1f} s -> {vidur_rps:,.0f} req/s")
    for name, values in PDSERVE_SETUPS.items():
        count, events, cpu_s = pdserve_loop_cpu_s(values)
        print(f"pdserve {name}: {count} requests, {events:,} events, loop CPU {cpu_s:.2f} s "
              f"-> {count / cpu_s:,.0f} req/s, {count / cpu_s / vidur_rps:.0f}x Vidur")


if __name__ == "__main__":
    main()
