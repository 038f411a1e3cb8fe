"""KV transfers on shared links: the same run with the 8 instances on one node (NVLink) and
split over two nodes (4P on one, 4D on the other) joined by RDMA or TCP.

Setup: the first 10 minutes of the Mooncake conversation trace (long prompts, so large KV
hand-offs), static-pd 4P4D, Llama-3.1-8B on H800. For each network it prints the transfer
times, the share of transfers that took longer than alone on their link (contention), and
the latencies the hand-off reaches: TaiChi's TTFT (until the decode instance's first token),
TPOT and AMPD's per-request max ITL.

    python bench/link_contention.py
"""

from __future__ import annotations

import numpy as np

from pdserve.config import Config
from pdserve.metrics.summary import summarize
from pdserve.sim.runner import Experiment, build_topology

BASE = Config().with_values({"workload.trace": "mooncake-conv", "workload.duration_s": 600,
                             "policy.name": "static-pd", "cluster.prefill": 4,
                             "cluster.decode": 4, "perf.model": "llama-3.1-8b",
                             "perf.gpu": "h800"})
NETWORKS = (("rdma-200g", 8), ("rdma-200g", 4), ("tcp-100g", 4), ("tcp-25g", 4))


def main() -> None:
    print("| network | instances per node | mean transfer ms | P99 transfer ms | transfers "
          "slowed by contention | P90 TTFT s | P90 TTFT + decode queue s (TaiChi) | "
          "P90 TPOT ms | P99 max ITL ms (AMPD) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for link, per_node in NETWORKS:
        config = BASE.with_values({"cluster.inter_node_link": link,
                                   "cluster.instances_per_node": per_node})
        experiment = Experiment.from_config(config)
        result = experiment.simulate()
        topology = build_topology(config, experiment.perf, 8)
        moved = [r for r in result.requests if r.finished and r.transfer_s > 0]
        took = np.array([r.transfer_s for r in moved])
        alone = np.array([topology.transfer_time_s(
            r.prefill_instance, r.decode_instance,
            r.input_tokens * experiment.perf.kv_bytes_per_token) for r in moved])
        summary = summarize(result.requests, experiment.slo)
        where = "NVLink, one node" if per_node == 8 else link
        print(f"| {where} | {per_node} | {took.mean() * 1e3:.2f} | "
              f"{np.percentile(took, 99) * 1e3:.2f} | {np.mean(took > alone * 1.001):.1%} | "
              f"{summary.ttft_s.p90:.3f} | {summary.ttft_with_decode_queue_s.p90:.3f} | "
              f"{summary.tpot_s.p90 * 1e3:.1f} | {summary.itl_max_s.p99 * 1e3:.1f} |")


if __name__ == "__main__":
    main()
