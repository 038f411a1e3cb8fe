"""AMPD's ILP (Eq. 5, `ampd_ilp.solve`) as a proposer of candidates for the `ampd` space.

`pdserve plan --policy ampd` fills the ILP's latency tables by simulating replicas; here the
screen fills them (`Screen.replica_latency_s`: one replica of degree n carrying 1/k of the
rate, its P90 TTFT over the TTFT SLO, its step time over the TPOT SLO) at the highest rate
the screen gives any grid deployment of the space, and the ILP's three best deployments,
which may use a different degree per phase, join the grid's candidates. A mixed-degree
deployment is a heterogeneous cluster (`cluster.instances`: prefill groups first).
Replica counts follow the planner's split grid (`splits.split_counts`): every count up to
64 replicas of a degree, as the paper's ILP has them; beyond, the grid's counts only (the
ILP with every count to 1,023 replicas took 21 s on 1,024 GPUs).
"""

from __future__ import annotations

from pdserve.planning.ampd_ilp import INFEASIBLE, solve
from pdserve.planning.candidates import Candidate, Deployment, InstanceGroup, instances_spec
from pdserve.planning.screen import Screen
from pdserve.planning.splits import split_counts
from pdserve.policies.search import SearchSpace

ILP_CHUNK_TOKENS = 2048
PROPOSALS = 3


def ampd_ilp_candidates(space: SearchSpace, grid: list[Candidate], gpus: int, gpu: str,
                        screen: Screen) -> list[Candidate]:
    """The ILP's deployments not already on the grid."""
    degrees = sorted({g.tp for c in grid for g in c.deployment.groups})
    rate = max((screen.estimate(c.deployment).goodput_rps for c in grid), default=0.0)
    if rate <= 0 or gpus < 2:
        return []
    tau_prefill: dict[tuple[int, int], float] = {}
    tau_decode: dict[tuple[int, int], float] = {}
    slo = screen.slo
    for degree in degrees:
        for replicas in split_counts((gpus - 1) // degree + 1):
            for prefill, table, limit in ((True, tau_prefill, slo.ttft_s),
                                          (False, tau_decode, slo.tpot_s)):
                group = InstanceGroup(1, degree, ILP_CHUNK_TOKENS, prefill, not prefill)
                latency = screen.replica_latency_s(group, rate / replicas)
                table[degree, replicas] = INFEASIBLE if latency is None else latency / limit
    if not tau_prefill or not tau_decode:
        return []
    known = {c.deployment for c in grid}
    found = []
    for plan in solve(tau_prefill, tau_decode, gpus, PROPOSALS):
        if plan.z >= INFEASIBLE:
            continue
        deployment = Deployment((
            InstanceGroup(plan.prefill_replicas, plan.prefill_degree, ILP_CHUNK_TOKENS, True,
                          False),
            InstanceGroup(plan.decode_replicas, plan.decode_degree, ILP_CHUNK_TOKENS, False,
                          True)))
        if deployment in known:
            continue
        values = {"policy.name": space.preset, **space.fixed,
                  "cluster.instances": instances_spec(deployment, gpu),
                  "instance.chunk_size_tokens": ILP_CHUNK_TOKENS}
        found.append(Candidate(space.name, tuple(values.items()), deployment, "ampd-ilp"))
        known.add(deployment)
    return found
