"""Where instances sit and the links between them: the cluster's network for KV transfers.

Instances are placed on nodes in id order, `instances_per_node` to a node (instance i is on
node i // instances_per_node). Every instance has two ports per link class, one out and one
in, each carrying its link's one-way bandwidth:

  intra-node   the GPU's own interconnect (NVLink through an NVSwitch; PCIe on a GPU without
               NVLink), priced by the instance's performance model (`PerfModel.transfer`)
  inter-node   the instance's network card (GPUDirect RDMA, or TCP), a named `Link` below

A transfer from a to b uses a's out-port and b's in-port of the class of the pair (intra when
a and b share a node). Concurrent transfers share the ports they use (processor sharing,
max-min fair: `pdserve.sim.links`), so two transfers out of one instance, or into one, each
get half its bandwidth, while transfers between disjoint instances do not interact. A node's
NVSwitch and the network core are taken as non-blocking. A transfer first pays its per-call
cost (`calls * per_call_s`, the set-up of each copy: no bandwidth used), then moves its bytes.

Policies estimate a transfer with `transfer_time_s(a, b, bytes)`: the uncontended time on the
link between a and b.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdserve.perf.fitted import PerfModel

INTRA, INTER = 0, 1  # link classes


@dataclass(frozen=True, slots=True)
class Link:
    """One port's one-way bandwidth and the fixed cost of one transfer call on it."""

    name: str
    bytes_per_s: float
    per_call_s: float
    source: str = ""

    def __post_init__(self) -> None:
        if not self.bytes_per_s > 0:
            raise ValueError(f"link {self.name!r}: bytes_per_s must be positive, got "
                             f"{self.bytes_per_s}")
        if self.per_call_s < 0:
            raise ValueError(f"link {self.name!r}: per_call_s must not be negative, got "
                             f"{self.per_call_s}")

    def aggregated(self, count: int) -> Link:
        """`count` such ports side by side (one NIC per GPU: a TP-`count` instance's
        network port carries `count` times the bandwidth, each call costs the same)."""
        if count <= 1:
            return self
        return Link(f"{self.name} x{count}", self.bytes_per_s * count, self.per_call_s,
                    self.source)

    def time_s(self, num_bytes: float, calls: int = 1) -> float:
        """Uncontended time of a transfer of `num_bytes` in `calls` copies."""
        return calls * self.per_call_s + num_bytes / self.bytes_per_s


_RDMA = ("one-way line rate x 0.9 achievable (RoCE/InfiniBand large-message efficiency, an "
         "assumption), 10 us per call (work-request post and completion, an assumption)")
_TCP = ("one-way line rate x 0.7 achievable (kernel TCP stack, an assumption), 50 us per call "
        "(syscalls and a round trip, an assumption)")

NETWORK_LINKS: dict[str, Link] = {link.name: link for link in [
    Link("rdma-100g", 100e9 / 8 * 0.9, 10e-6, _RDMA),
    Link("rdma-200g", 200e9 / 8 * 0.9, 10e-6, _RDMA),
    Link("rdma-400g", 400e9 / 8 * 0.9, 10e-6, _RDMA),
    Link("tcp-25g", 25e9 / 8 * 0.7, 50e-6, _TCP),
    Link("tcp-100g", 100e9 / 8 * 0.7, 50e-6, _TCP),
]}

GPU_LINK = "gpu"  # the intra-node default: each instance's performance model prices it
GPUS_PER_NODE = 8  # the papers' servers (DGX/HGX: 8 GPUs on one NVSwitch)


def gpu_link(perf: PerfModel) -> Link:
    """The intra-node link of an instance: its GPU interconnect as its performance model
    prices a KV transfer."""
    return Link(f"{GPU_LINK}:{perf.name}", perf.transfer.bytes_per_s, perf.transfer.per_call_s,
                "the performance model's transfer coefficients")


def network_link(spec: str) -> Link:
    """A named link (`rdma-200g`, ...) or `custom:<GB/s>:<us per call>`."""
    if spec in NETWORK_LINKS:
        return NETWORK_LINKS[spec]
    if spec.startswith("custom:"):
        try:
            _, gb_s, per_call_us = spec.split(":")
            return Link(spec, float(gb_s) * 1e9, float(per_call_us) * 1e-6, "custom")
        except ValueError as err:
            raise ValueError(f"link {spec!r}: expected custom:<GB/s>:<us per call> "
                             f"({err})") from None
    raise ValueError(f"unknown link {spec!r}; known: {', '.join(NETWORK_LINKS)}, "
                     f"custom:<GB/s>:<us per call>")


@dataclass(frozen=True)
class Topology:
    """Node of each instance, each instance's intra-node link, the inter-node link."""

    nodes: tuple[int, ...]
    intra_node: tuple[Link, ...]  # per instance
    inter_node: Link

    def __post_init__(self) -> None:
        if len(self.nodes) != len(self.intra_node):
            raise ValueError(f"topology: {len(self.nodes)} node ids for "
                             f"{len(self.intra_node)} intra-node links")

    @classmethod
    def build(cls, intra_node: Sequence[Link], instances_per_node: int,
              inter_node: Link | None = None) -> Topology:
        """Instances in id order, `instances_per_node` to a node."""
        if instances_per_node < 1:
            raise ValueError(f"instances_per_node must be at least 1, got {instances_per_node}")
        return cls(tuple(i // instances_per_node for i in range(len(intra_node))),
                   tuple(intra_node), inter_node or NETWORK_LINKS["rdma-200g"])

    @classmethod
    def for_perf_models(cls, perfs: Sequence[PerfModel], instances_per_node: int,
                        inter_node: Link | None = None) -> Topology:
        """Each instance's GPU link inside its node (`gpu_link`)."""
        return cls.build([gpu_link(perf) for perf in perfs], instances_per_node, inter_node)

    @property
    def num_instances(self) -> int:
        return len(self.nodes)

    def link_class(self, source: int, target: int) -> int:
        return INTRA if self.nodes[source] == self.nodes[target] else INTER

    def port_link(self, instance: int, link_class: int) -> Link:
        return self.intra_node[instance] if link_class == INTRA else self.inter_node

    def link_between(self, source: int, target: int) -> Link:
        """The link a transfer from `source` to `target` runs on: the slower of the two
        ports' bandwidths and the larger per-call cost."""
        kind = self.link_class(source, target)
        out, into = self.port_link(source, kind), self.port_link(target, kind)
        if out is into:
            return out
        return Link(f"{out.name}->{into.name}", min(out.bytes_per_s, into.bytes_per_s),
                    max(out.per_call_s, into.per_call_s))

    def transfer_time_s(self, source: int, target: int, num_bytes: float,
                        calls: int = 1) -> float:
        """Uncontended time to move `num_bytes` from `source` to `target` (for policies'
        cost estimates; the simulator adds contention)."""
        return self.link_between(source, target).time_s(num_bytes, calls)
