"""A simulated cluster from per-GPU instance groups (`pdserve.cluster.hardware`): each
instance's performance model (its GPU, the group's tp), its role, and the topology. Each GPU
type and tp sits on servers of its own, `GPUS_PER_NODE / tp` instances to a server unless
the config says otherwise, groups of one kind filling the same servers. Inside a server
each instance has its GPU's link; between servers the config's link times the first
group's tp (`Topology` has one network link).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.cluster.hardware import parse_instances
from pdserve.cluster.topology import (
    GPU_LINK,
    GPUS_PER_NODE,
    Link,
    Topology,
    gpu_link,
    network_link,
)
from pdserve.config import Config
from pdserve.perf.fitted import PerfModel
from pdserve.perf.presets import default_tp, perf_model
from pdserve.types import Role


@dataclass(frozen=True)
class ClusterLayout:
    perfs: tuple[PerfModel, ...]
    roles: tuple[Role, ...]
    topology: Topology

    def count(self, role: Role) -> int:
        return sum(1 for r in self.roles if r is role)


def heterogeneous_layout(config: Config) -> ClusterLayout:
    cluster, spec = config.cluster, config.perf
    assert isinstance(cluster.instances, str)
    if spec.profile:
        raise ValueError("config field 'cluster.instances': GPU groups need model x gpu "
                         "performance models, not a perf.profile file")
    perfs: list[PerfModel] = []
    roles: list[Role] = []
    nodes: list[int] = []
    intra: list[Link] = []
    first_tp = 0
    servers: dict[tuple[str, int], tuple[int, int]] = {}  # kind -> (its last node, filled)
    next_node = 0
    for group in parse_instances(cluster.instances):
        tp = group.tp or spec.tp or default_tp(spec.model, group.gpu)
        first_tp = first_tp or tp
        model = perf_model(spec.model, group.gpu, tp, spec.backend or None,
                           spec.host_overhead, config.instance.max_batch_size)
        per_node = cluster.instances_per_node or max(1, GPUS_PER_NODE // tp)
        node, filled = servers.get((group.gpu, tp), (-1, per_node))
        for _ in range(group.count):
            if filled == per_node:  # this kind of server is full: a new one
                node, filled, next_node = next_node, 0, next_node + 1
            filled += 1
            perfs.append(model)
            roles.append(group.role)
            nodes.append(node)
            intra.append(gpu_link(model) if cluster.intra_node_link == GPU_LINK
                         else network_link(cluster.intra_node_link))
        servers[group.gpu, tp] = (node, filled)
    inter = network_link(cluster.inter_node_link).aggregated(first_tp)
    return ClusterLayout(tuple(perfs), tuple(roles), Topology(tuple(nodes), tuple(intra), inter))


def check_layout_roles(policy: str, roles: tuple[Role, ...]) -> None:
    """Only flowkv reads the groups' roles; the fixed presets must agree with them."""
    if policy == "flowkv":
        return
    if Role.RESERVE in roles:
        raise ValueError(f"config field 'cluster.instances': reserve instances need policy "
                         f"flowkv, not {policy!r}")
    mixed = sum(1 for r in roles if r is Role.MIXED)
    if policy == "colocated":
        return
    if mixed:
        raise ValueError(f"config field 'cluster.instances': mixed groups need policy "
                         f"colocated or flowkv, not {policy!r}")
