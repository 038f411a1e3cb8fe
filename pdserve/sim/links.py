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

Speed: a transfer that no other one shares a port with joins silently (`next_event_s`
reports only its end), so the common uncontended hand-off costs the driver one event, as a
fixed-time transfer did; only transfers that meet on a port recompute their component's
rates.
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
        ports = len(self._capacity)
        self._on_port: list[list[_Transfer]] = [[] for _ in range(ports)]  # active ones
        self._users = [0] * ports  # transfers joining or active on each port
        self._joining: list[tuple[float, int, _Transfer]] = []  # paying per-call costs
        self._active: dict[int, _Transfer] = {}  # by seq: start order
        self._ended: list[object] = []  # keys of ended transfers not yet taken
        self._seq = 0
        self._now_s = 0.0  # the latest time settled to
        self._next_end_s = math.inf  # the earliest finish among the active transfers
        self._routes: dict[tuple[int, int], tuple[tuple[int, int], float]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._joining) + len(self._active) + len(self._ended)

    def start(self, key: object, now_s: float, source: int, target: int, num_bytes: float,
              calls: int = 1) -> None:
        """Start moving `num_bytes` from `source` to `target` at `now_s` (no earlier than
        any time this simulator has been advanced to)."""
        if self._joining or self._active:
            self._settle(now_s)
        route = self._routes.get((source, target))
        if route is None:
            route = self._routes[source, target] = self._route(source, target)
        ports, per_call_s = route
        self._seq += 1
        transfer = _Transfer(key, self._seq, ports, float(num_bytes))
        users = self._users
        users[ports[0]] += 1
        users[ports[1]] += 1
        join_s = now_s + calls * per_call_s
        heapq.heappush(self._joining, (join_s, self._seq, transfer))
        if join_s <= now_s:
            self._settle(now_s)  # no per-call cost: it joins now

    def _route(self, source: int, target: int) -> tuple[tuple[int, int], float]:
        """The ports a transfer from `source` to `target` uses, and its per-call cost."""
        kind = self.topology.link_class(source, target)
        return ((_port(source, kind, _OUT), _port(target, kind, _IN)),
                self.topology.link_between(source, target).per_call_s)

    def next_event_s(self) -> float:
        """When the links next change in a way that matters: a transfer ends, or one joins
        ports that another transfer uses (`inf` when nothing will happen). A transfer alone
        on its ports from start to end joins silently: only its end is an event."""
        if self._ended:
            return self._now_s  # ended already: take them now
        time_s = self._next_end_s
        users, capacity = self._users, self._capacity
        for join_s, _, transfer in self._joining:
            if join_s >= time_s:
                continue
            out, into = transfer.ports
            if users[out] == 1 and users[into] == 1 and transfer.num_bytes > 0.0:
                join_s += transfer.num_bytes / min(capacity[out], capacity[into])  # its end
            if join_s < time_s:
                time_s = join_s
        return time_s

    def advance(self, now_s: float) -> list[object]:
        """Move virtual time to `now_s`; the keys of the transfers ended by then, in the
        order they ended (start order among equal times)."""
        joining = self._joining
        if len(joining) == 1 and not self._active and not self._ended:
            # the common case: one transfer, alone on its ports from its join to its end
            # by now (the same arithmetic as joining it and ending it in `_settle`)
            join_s, _, transfer = joining[0]
            out, into = transfer.ports
            users = self._users
            if join_s <= now_s and users[out] == 1 and users[into] == 1 and (
                    transfer.num_bytes <= 0.0 or join_s + transfer.num_bytes / min(
                        self._capacity[out], self._capacity[into]) <= now_s):
                joining.clear()
                users[out] = users[into] = 0
                if now_s > self._now_s:
                    self._now_s = now_s
                return [transfer.key]
        self._settle(now_s)
        ended, self._ended = self._ended, []
        return ended

    # ---- internals ----
    def _settle(self, now_s: float) -> None:
        """Apply every join and end at or before `now_s`, in time order."""
        if now_s > self._now_s:
            self._now_s = now_s
        joining, active, on_port, users = self._joining, self._active, self._on_port, self._users
        capacity = self._capacity
        while True:
            join_s = joining[0][0] if joining else math.inf
            end_s = self._next_end_s
            time_s = join_s if join_s < end_s else end_s
            if time_s > now_s:
                return
            changed: list[int] = []  # ports whose other transfers' rates may change
            if end_s == time_s:
                for transfer in [t for t in active.values() if t.finish_s <= time_s]:
                    del active[transfer.seq]
                    for port in transfer.ports:
                        here = on_port[port]
                        here.remove(transfer)
                        users[port] -= 1
                        if here:
                            changed.append(port)
                    self._ended.append(transfer.key)
            while joining and joining[0][0] <= time_s:
                transfer = heapq.heappop(joining)[2]
                out, into = transfer.ports
                if transfer.num_bytes <= 0.0:
                    users[out] -= 1
                    users[into] -= 1
                    self._ended.append(transfer.key)
                    continue
                active[transfer.seq] = transfer
                on_port[out].append(transfer)
                on_port[into].append(transfer)
                if len(on_port[out]) == 1 and len(on_port[into]) == 1:  # alone on both
                    self._set_rate(transfer, min(capacity[out], capacity[into]), time_s)
                else:
                    changed += transfer.ports
            if changed:
                self._share(time_s, changed)
            if len(active) == 1:
                self._next_end_s = next(iter(active.values())).finish_s
            else:
                self._next_end_s = min((t.finish_s for t in active.values()),
                                       default=math.inf)

    def _share(self, now_s: float, changed: list[int]) -> None:
        """Recompute the max-min fair rates of the transfers connected to `changed` ports."""
        on_port, capacity = self._on_port, self._capacity
        alone: list[_Transfer] = []  # the common case: each transfer alone on its ports
        for port in changed:
            here = on_port[port]
            if len(here) > 1:
                break
            if here:
                out, into = here[0].ports
                if len(on_port[out]) > 1 or len(on_port[into]) > 1:
                    break
                alone.append(here[0])
        else:
            for transfer in alone:
                out, into = transfer.ports
                self._set_rate(transfer, min(capacity[out], capacity[into]), now_s)
            return
        ports, transfers = self._component(changed)
        left = {port: capacity[port] for port in ports}
        unfixed = {port: len(on_port[port]) for port in ports}
        rates: dict[int, float] = {}
        while len(rates) < len(transfers):
            bottleneck, share = -1, math.inf
            for port in ports:
                if unfixed[port] and left[port] / unfixed[port] < share:
                    bottleneck, share = port, left[port] / unfixed[port]
            for transfer in on_port[bottleneck]:
                if transfer.seq in rates:
                    continue
                rates[transfer.seq] = share
                for port in transfer.ports:
                    left[port] = max(0.0, left[port] - share)
                    unfixed[port] -= 1
        for transfer in transfers:
            self._set_rate(transfer, rates[transfer.seq], now_s)

    @staticmethod
    def _set_rate(transfer: _Transfer, rate: float, now_s: float) -> None:
        if rate == transfer.rate:
            return  # its finish time stands
        if transfer.rate > 0.0:
            transfer.num_bytes = (transfer.finish_s - now_s) * transfer.rate
        transfer.rate = rate
        transfer.finish_s = now_s + transfer.num_bytes / rate

    def _component(self, changed: list[int]) -> tuple[list[int], list[_Transfer]]:
        """Ports and transfers reachable from `changed` through shared transfers, in a
        deterministic order."""
        seen_ports: set[int] = set()
        found: dict[int, _Transfer] = {}
        stack = sorted(set(changed))
        while stack:
            port = stack.pop()
            if port in seen_ports:
                continue
            seen_ports.add(port)
            for transfer in self._on_port[port]:
                if transfer.seq not in found:
                    found[transfer.seq] = transfer
                    stack.extend(p for p in transfer.ports if p not in seen_ports)
        return sorted(seen_ports), [found[seq] for seq in sorted(found)]
