"""KV transfers over shared links: processor sharing, max-min fair, in virtual time.

A transfer from instance a to b (`pdserve.cluster.topology`) first pays its per-call cost
(`calls * per_call_s`, no bandwidth used), then joins two ports: a's out-port and b's
in-port of the pair's link class. The transfers on the ports share them max-min fairly
(progressive filling): the port with the smallest equal share fixes the rate of all its
transfers, which is taken off the other ports they use, and so on. On one port this is
plain processor sharing: n transfers each get 1/n of its bandwidth. Rates are recomputed
whenever a transfer joins or ends, so a transfer slows from the moment another joins its
port and speeds up when one leaves.

Each active transfer keeps its rate and its projected finish time; bytes left are worked
out only when its rate changes, so a transfer whose rate never changes finishes exactly at
its uncontended time. Several transfers ending at the same instant end in start order.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from pdserve.cluster.topology import INTER, INTRA, Topology

_OUT, _IN = 0, 1


def _port(instance: int, link_class: int, direction: int) -> int:
    return instance * 4 + link_class * 2 + direction


@dataclass(slots=True, eq=False)
class _Transfer:
    key: object
    seq: int
    ports: tuple[int, int]
    num_bytes: float  # bytes left when `rate` was set (all of them before it joins)
    rate: float = 0.0
    finish_s: float = math.inf


class LinkSimulator:
    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._capacity: list[float] = []
        for instance in range(topology.num_instances):
            for link_class in (INTRA, INTER):
                bandwidth = topology.port_link(instance, link_class).bytes_per_s
                self._capacity += [bandwidth, bandwidth]  # out, in
        self._joining: list[tuple[float, int, _Transfer]] = []  # paying per-call costs
        self._active: dict[int, _Transfer] = {}  # by seq: start order
        self._on_port: dict[int, list[_Transfer]] = {}
        self._ended: list[object] = []  # keys of ended transfers not yet taken
        self._seq = 0
        self._now_s = 0.0  # the latest time settled to

    @property
    def in_flight(self) -> int:
        return len(self._joining) + len(self._active) + len(self._ended)

    def start(self, key: object, now_s: float, source: int, target: int, num_bytes: float,
              calls: int = 1) -> None:
        """Start moving `num_bytes` from `source` to `target` at `now_s` (no earlier than
        any time this simulator has been advanced to)."""
        self._settle(now_s)
        kind = self.topology.link_class(source, target)
        link = self.topology.link_between(source, target)
        self._seq += 1
        transfer = _Transfer(key, self._seq, (_port(source, kind, _OUT),
                                               _port(target, kind, _IN)), float(num_bytes))
        heapq.heappush(self._joining, (now_s + calls * link.per_call_s, self._seq, transfer))
        self._settle(now_s)  # joins now when it has no per-call cost

    def next_event_s(self) -> float:
        """When a transfer next joins its ports or ends (`inf` when none will)."""
        if self._ended:
            return self._now_s  # ended already: take them now
        joining = self._joining[0][0] if self._joining else math.inf
        return min(joining, min((t.finish_s for t in self._active.values()),
                                default=math.inf))

    def advance(self, now_s: float) -> list[object]:
        """Move virtual time to `now_s`; the keys of the transfers ended by then, in the
        order they ended (start order among equal times)."""
        self._settle(now_s)
        ended, self._ended = self._ended, []
        return ended

    # ---- internals ----
    def _settle(self, now_s: float) -> None:
        """Apply every join and end at or before `now_s`, in time order."""
        self._now_s = max(self._now_s, now_s)
        while True:
            joining = self._joining[0][0] if self._joining else math.inf
            ending = min((t.finish_s for t in self._active.values()), default=math.inf)
            time_s = min(joining, ending)
            if time_s > now_s:
                return
            changed: set[int] = set()
            if ending == time_s:
                for transfer in [t for t in self._active.values() if t.finish_s <= time_s]:
                    del self._active[transfer.seq]
                    for port in transfer.ports:
                        self._on_port[port].remove(transfer)
                        changed.add(port)
                    self._ended.append(transfer.key)
            while self._joining and self._joining[0][0] <= time_s:
                transfer = heapq.heappop(self._joining)[2]
                if transfer.num_bytes <= 0:
                    self._ended.append(transfer.key)
                    continue
                self._active[transfer.seq] = transfer
                for port in transfer.ports:
                    self._on_port.setdefault(port, []).append(transfer)
                    changed.add(port)
            if changed:
                self._share(time_s, changed)

    def _share(self, now_s: float, changed: set[int]) -> None:
        """Recompute max-min fair rates of the transfers connected to the `changed` ports."""
        ports, transfers = self._component(changed)
        capacity = {port: self._capacity[port] for port in ports}
        unfixed = {port: len(self._on_port.get(port, ())) for port in ports}
        rates: dict[int, float] = {}
        while len(rates) < len(transfers):
            bottleneck, share = -1, math.inf
            for port in ports:
                if unfixed[port] and capacity[port] / unfixed[port] < share:
                    bottleneck, share = port, capacity[port] / unfixed[port]
            for transfer in self._on_port[bottleneck]:
                if transfer.seq in rates:
                    continue
                rates[transfer.seq] = share
                for port in transfer.ports:
                    capacity[port] = max(0.0, capacity[port] - share)
                    unfixed[port] -= 1
        for transfer in transfers:
            rate = rates[transfer.seq]
            if rate == transfer.rate:
                continue
            if transfer.rate > 0:
                transfer.num_bytes = (transfer.finish_s - now_s) * transfer.rate
            transfer.rate = rate
            transfer.finish_s = now_s + transfer.num_bytes / rate

    def _component(self, changed: set[int]) -> tuple[list[int], list[_Transfer]]:
        """Ports and transfers reachable from `changed` through shared transfers, in a
        deterministic order."""
        ports: list[int] = []
        seen_ports: set[int] = set()
        found: dict[int, _Transfer] = {}
        stack = sorted(changed)
        while stack:
            port = stack.pop()
            if port in seen_ports:
                continue
            seen_ports.add(port)
            ports.append(port)
            for transfer in self._on_port.get(port, ()):
                if transfer.seq not in found:
                    found[transfer.seq] = transfer
                    stack.extend(p for p in transfer.ports if p not in seen_ports)
        ports.sort()
        return ports, [found[seq] for seq in sorted(found)]
