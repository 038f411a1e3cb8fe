"""The link model: topology, and transfers sharing links (hand-computed finish times)."""

from __future__ import annotations

import math

import pytest

from pdserve.cluster.topology import NETWORK_LINKS, Link, Topology, network_link
from pdserve.sim.links import LinkSimulator

GB = 1e9
NVLINK = Link("test-nvlink", 1 * GB, 0.0)  # 1 GB/s one way, no per-call cost
NET = Link("test-net", 0.5 * GB, 0.0)


def two_nodes(per_node: int = 4, instances: int = 8) -> Topology:
    return Topology.build([NVLINK] * instances, per_node, NET)


def run(links: LinkSimulator, starts: list[tuple[float, str, int, int, float]]
        ) -> dict[object, float]:
    """Start transfers at their times, advance event by event; the end time of each."""
    pending = sorted(starts, key=lambda s: s[0])
    ended: dict[object, float] = {}
    while pending or links.in_flight:
        next_end = links.next_event_s()
        if pending and pending[0][0] <= next_end:
            time_s, key, source, target, num_bytes = pending.pop(0)
            links.start(key, time_s, source, target, num_bytes)
        else:
            for key in links.advance(next_end):
                ended[key] = next_end
    return ended


def test_one_transfer_alone_takes_bytes_over_bandwidth():
    ended = run(LinkSimulator(two_nodes()), [(0.0, "a", 0, 1, 1 * GB)])
    assert ended == {"a": 1.0}


def test_two_equal_transfers_started_together_each_take_exactly_twice_as_long():
    # out of the same instance: its out-port is shared
    ended = run(LinkSimulator(two_nodes()), [(0.0, "a", 0, 1, 1 * GB),
                                             (0.0, "b", 0, 2, 1 * GB)])
    assert ended == {"a": 2.0, "b": 2.0}
    # into the same instance: its in-port is shared
    ended = run(LinkSimulator(two_nodes()), [(0.0, "a", 0, 2, 1 * GB),
                                             (0.0, "b", 1, 2, 1 * GB)])
    assert ended == {"a": 2.0, "b": 2.0}


def test_a_transfer_on_other_ports_is_unaffected():
    ended = run(LinkSimulator(two_nodes()), [(0.0, "a", 0, 1, 1 * GB),
                                             (0.0, "b", 0, 1, 1 * GB),
                                             (0.0, "c", 2, 3, 1 * GB)])
    assert ended == {"a": 2.0, "b": 2.0, "c": 1.0}  # c shares no port: uncontended, exactly


def test_a_transfer_joining_midway_slows_the_other_from_then_only():
    # a alone from 0 to 0.5 moves 0.5 GB; then both at 0.5 GB/s: a's last 0.5 GB take 1 s
    # (ends at 1.5), while b moves 0.5 GB; b's last 0.5 GB alone take 0.5 s (ends at 2.0)
    ended = run(LinkSimulator(two_nodes()), [(0.0, "a", 0, 1, 1 * GB),
                                             (0.5, "b", 0, 2, 1 * GB)])
    assert ended == {"a": 1.5, "b": 2.0}


def test_intra_and_inter_node_ports_are_separate_links():
    # 0 -> 1 inside node 0 (1 GB/s) and 0 -> 4 across nodes (0.5 GB/s) do not share
    ended = run(LinkSimulator(two_nodes()), [(0.0, "nv", 0, 1, 1 * GB),
                                             (0.0, "net", 0, 4, 1 * GB)])
    assert ended == {"nv": 1.0, "net": 2.0}
    # two across nodes from node 0 to node 1, different instances: no shared port
    ended = run(LinkSimulator(two_nodes()), [(0.0, "x", 0, 4, 1 * GB),
                                             (0.0, "y", 1, 5, 1 * GB)])
    assert ended == {"x": 2.0, "y": 2.0}


def test_max_min_fair_share_across_two_bottlenecks():
    """a: 0->2, b: 1->2, c: 1->3. Port 2-in holds a and b (0.5 each); 1-out holds b and c.
    b is fixed at 0.5 by 2-in; c gets the rest of 1-out: 0.5 GB/s. All three at 0.5."""
    ended = run(LinkSimulator(two_nodes()), [(0.0, "a", 0, 2, 1 * GB),
                                             (0.0, "b", 1, 2, 1 * GB),
                                             (0.0, "c", 1, 3, 2 * GB)])
    # a and b end at 2.0; c moved 1 GB by then, its last 1 GB alone at 1 GB/s: ends at 3.0
    assert ended == {"a": 2.0, "b": 2.0, "c": 3.0}


def test_per_call_cost_is_paid_before_the_bytes_and_uses_no_bandwidth():
    slow_calls = Link("calls", 1 * GB, 0.25)
    links = LinkSimulator(Topology.build([slow_calls] * 2, 2, NET))
    links.start("a", 0.0, 0, 1, 1 * GB, calls=2)  # joins at 0.5, alone until b joins at 1.0
    links.start("b", 0.5, 0, 1, 1 * GB, calls=2)
    ended = {}
    while links.in_flight:
        time_s = links.next_event_s()
        for key in links.advance(time_s):
            ended[key] = time_s
    # a: 0.5 GB alone (0.5..1.0), its last 0.5 GB shared (1.0..2.0); b: 0.5 GB shared, then
    # 0.5 GB alone (2.0..2.5)
    assert ended == {"a": 2.0, "b": 2.5}


def test_equal_end_times_come_out_in_start_order():
    links = LinkSimulator(two_nodes())
    for key, source in (("first", 2), ("second", 0), ("third", 5)):
        links.start(key, 0.0, source, source + 1, 1 * GB)
    assert links.next_event_s() == 1.0
    assert links.advance(1.0) == ["first", "second", "third"]
    assert links.next_event_s() == math.inf


def test_topology_places_instances_and_names_links():
    topology = two_nodes(per_node=4)
    assert topology.nodes == (0, 0, 0, 0, 1, 1, 1, 1)
    assert topology.link_between(0, 3) is NVLINK
    assert topology.link_between(3, 4) is NET
    assert topology.transfer_time_s(0, 5, 1 * GB) == pytest.approx(2.0)
    assert network_link("rdma-200g") is NETWORK_LINKS["rdma-200g"]
    assert network_link("rdma-200g").bytes_per_s == pytest.approx(200e9 / 8 * 0.9)
    custom = network_link("custom:12.5:20")
    assert (custom.bytes_per_s, custom.per_call_s) == (12.5e9, pytest.approx(20e-6))
    with pytest.raises(ValueError, match="unknown link 'infiniband'"):
        network_link("infiniband")
    with pytest.raises(ValueError, match="instances_per_node"):
        Topology.build([NVLINK], 0)


def test_a_lone_transfer_is_one_event_and_still_shares_when_another_comes():
    slow_calls = Link("calls", 1 * GB, 0.25)
    links = LinkSimulator(Topology.build([slow_calls] * 3, 3, NET))
    links.start("a", 0.0, 0, 1, 1 * GB)  # joins at 0.25 alone: its end, 1.25, is the event
    assert links.next_event_s() == 1.25
    links.start("b", 0.75, 2, 1, 1 * GB)  # joins 1's in-port at 1.0, a has 0.25 GB left
    assert links.next_event_s() == 1.0
    ended = {}
    while links.in_flight:
        time_s = links.next_event_s()
        for key in links.advance(time_s):
            ended[key] = time_s
    # a: 0.75 GB by 1.0, then 0.25 GB at 0.5 GB/s -> 1.5; b: 0.25 GB by 1.5, 0.75 GB alone
    assert ended == {"a": 1.5, "b": 2.25}
