"""14B arXiv SLO1: static-pd 2P2D vs 3P1D at 6.91 req/s on both performance models (taichi.md).

Run from the repository root: `python docs/results/taichi/split_check.py`."""

import sys

sys.path.insert(0, "bench")
from taichi_repro import base_config  # noqa: E402

from pdserve.sim.runner import Experiment  # noqa: E402

RATE_RPS = 6.91
for backend in ("vllm", "vidur"):
    for prefill, decode in ((2, 2), (3, 1)):
        config = base_config(backend, "qwen2.5-14b", "summarization", 1, 0, 0.04).with_values(
            {"policy.name": "static-pd", "cluster.prefill": prefill, "cluster.decode": decode})
        experiment = Experiment.from_config(config)
        summary = experiment.summarize(
            experiment.simulate(RATE_RPS / experiment.workload.mean_rate_rps))
        print(f"{backend} {prefill}P{decode}D at {RATE_RPS} req/s: attainment "
              f"{summary.slo_attainment:.3f} TTFT p90/SLO "
              f"{summary.ttft_s.p90 / config.slo.ttft_s:.2f} TPOT p90/SLO "
              f"{summary.tpot_s.p90 / config.slo.tpot_s:.2f} kv tokens/inst "
              f"{experiment.perf.kv_capacity_tokens}", flush=True)
