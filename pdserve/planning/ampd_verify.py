"""Check the ILP's shortlist by simulating whole clusters (`pdserve plan --verify K`).

Eq. 5 prices each phase's replicas apart, so it cannot see what AMPD's adaptive routing
does across them: decode workers that take prefills locally relieve the prefill side
(Alg. 1 line 4). With `--verify K` the planner simulates each of the ILP's K best
deployments as a whole cluster under `ampd` on the same sessions and ranks them by SLO
attainment. This step is pdserve's, not the paper's (which ranks by the ILP alone).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

from pdserve.cluster.topology import GPUS_PER_NODE, Topology, gpu_link, network_link
from pdserve.config import ClusterConfig
from pdserve.metrics.summary import summarize
from pdserve.perf.fitted import PerfModel
from pdserve.planning.ampd_ilp import Deployment
from pdserve.planning.ampd_inputs import PlanInputs, replica_sim_settings, replica_workload
from pdserve.policies.ampd.preset import build_ampd_policy
from pdserve.sim.simulator import Simulator

NETWORK = ClusterConfig.inter_node_link  # one card per GPU, as the simulator's default


def cluster_topology(perfs: list[PerfModel], degrees: list[int]) -> Topology:
    """Instances fill 8-GPU nodes in order; between nodes each instance has one network
    card per GPU."""
    nodes, used, node = [], 0, 0
    for degree in degrees:
        if used + degree > GPUS_PER_NODE:
            node, used = node + 1, 0
        nodes.append(node)
        used += degree
    inter = network_link(NETWORK).aggregated(max(degrees))
    return Topology(tuple(nodes), tuple(gpu_link(p) for p in perfs), inter)


def cluster_attainment(deployment: Deployment, inputs: PlanInputs) -> float:
    """SLO attainment of the whole deployment under `ampd` (prefill replicas first)."""
    degrees = ([deployment.prefill_degree] * deployment.prefill_replicas
               + [deployment.decode_degree] * deployment.decode_replicas)
    perfs = [inputs.perf(degree) for degree in degrees]
    policy, _ = build_ampd_policy("ampd", inputs.slo, deployment.prefill_replicas,
                                  deployment.decode_replicas, perfs, inputs.ampd, inputs.seed)
    workload = replica_workload(inputs, 1)
    sim = Simulator(policy, len(perfs), perfs, replica_sim_settings(),
                    cluster_topology(perfs, degrees))
    return summarize(sim.run(workload.requests()).requests, inputs.slo).slo_attainment


def _job(args: tuple[Deployment, PlanInputs]) -> float:
    return cluster_attainment(*args)


def verify(inputs: PlanInputs, deployments: list[Deployment],
           jobs: int = 2) -> list[tuple[Deployment, float]]:
    """The deployments with their simulated attainment, best first (ties keep ILP order)."""
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        scores = list(pool.map(_job, [(d, inputs) for d in deployments]))
    order = sorted(range(len(deployments)), key=lambda i: (-scores[i], i))
    return [(deployments[i], scores[i]) for i in order]
