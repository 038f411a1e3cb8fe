"""The simulator on the link model and the token timing it records (hand-computed cases)."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import make_perf, policy_setup, sim_settings

from pdserve.cluster.topology import Link, Topology, gpu_link
from pdserve.config import Config
from pdserve.perf.fitted import DecodeCoeffs, PerfModel
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicyConfig
from pdserve.sim.runner import build_topology, instances_per_node
from pdserve.sim.simulator import Simulator
from pdserve.types import SLO, Request

SLO_ = SLO(2.0, 0.15)


def run_pd(requests: list[Request], prefill: int, decode: int,
           perf: PerfModel | list[PerfModel] | None = None, topology: Topology | None = None,
           span: int = 1 << 20) -> list[Request]:
    model = perf or make_perf()
    base = model if isinstance(model, PerfModel) else model[0]
    policy, count = build_policy(policy_setup(base, SLO_, PolicyConfig("static-pd"),
                                              prefill=prefill, decode=decode))
    sim = Simulator(policy, count, model, sim_settings(max_span_steps=span), topology)
    return sim.run(requests).requests


def prefill_s(perf: PerfModel, tokens: int) -> float:
    return perf.prefill.time_s(tokens, tokens * tokens)


def test_one_hand_off_timed_by_hand():
    """1P1D, one request of 1000 prompt tokens and 4 output tokens."""
    perf = make_perf()
    (request,) = run_pd([Request(0, 0.0, 1000, 4)], 1, 1)
    first = prefill_s(perf, 1000)  # 0.031 s
    transfer = 1e-3 + 1000 * 100_000 / 1e10  # one call + 100 MB at 10 GB/s
    step = perf.decode.step_s
    assert request.first_token_s == pytest.approx(first)
    assert request.transfer_s == pytest.approx(transfer)
    assert request.decode_first_token_s == pytest.approx(first + transfer + step(1, 1001))
    assert request.finish_s == pytest.approx(request.decode_first_token_s + step(1, 1002)
                                             + step(1, 1003))
    assert request.max_itl_s == pytest.approx(step(1, 1003))  # the last step, the longest
    assert request.last_token_s == request.finish_s


def test_two_hand_offs_into_one_instance_share_its_link():
    """2P1D: two equal prompts prefill side by side on P0 and P1 and both go to D at the
    same instant; D's in-port carries both, so each moves at half speed."""
    perf = make_perf()
    alone = 1e-3 + 1000 * 100_000 / 1e10
    shared = run_pd([Request(0, 0.0, 1000, 4), Request(1, 0.0, 1000, 4)], 2, 1)
    assert [r.prefill_instance for r in shared] == [0, 1]
    assert all(r.decode_instance == 2 for r in shared)
    assert shared[0].first_token_s == shared[1].first_token_s == pytest.approx(
        prefill_s(perf, 1000))
    for request in shared:  # the per-call cost is not shared, the bytes are: 2 x 10 ms
        assert request.transfer_s == pytest.approx(1e-3 + 2 * (alone - 1e-3))
    # 2P2D: each goes to its own decode instance, no port in common: uncontended
    apart = run_pd([Request(0, 0.0, 1000, 4), Request(1, 0.0, 1000, 4)], 2, 2)
    assert sorted(r.decode_instance for r in apart) == [2, 3]
    assert [r.transfer_s for r in apart] == pytest.approx([alone, alone])


def test_inter_node_link_prices_transfers_across_nodes():
    perf = make_perf()
    slow = Link("slow-net", 1e9, 5e-3)
    one_per_node = Topology.build([gpu_link(perf)] * 2, 1, slow)
    (request,) = run_pd([Request(0, 0.0, 1000, 4)], 1, 1, topology=one_per_node)
    assert request.transfer_s == pytest.approx(5e-3 + 1000 * 100_000 / 1e9)
    same_node = Topology.build([gpu_link(perf)] * 2, 2, slow)
    (request,) = run_pd([Request(0, 0.0, 1000, 4)], 1, 1, topology=same_node)
    assert request.transfer_s == pytest.approx(1e-3 + 1000 * 100_000 / 1e10)


def test_each_instance_may_have_its_own_performance_model():
    fast = make_perf()
    slow = dataclasses.replace(fast, name="slow", kv_capacity_tokens=50_000,
                               decode=DecodeCoeffs(0.02, 1e-4, 2e-7, 0.001))
    policy, count = build_policy(policy_setup(fast, SLO_, PolicyConfig("static-pd"), prefill=1,
                                              decode=1))
    sim = Simulator(policy, count, [fast, slow], sim_settings())
    assert [i.total_blocks for i in sim.instances] == [(1 << 20) // 16, 50_000 // 16]
    (request,) = sim.run([Request(0, 0.0, 1000, 4)]).requests
    assert request.max_itl_s == pytest.approx(slow.decode.step_s(1, 1003))
    with pytest.raises(ValueError, match="2 performance models for 3 instances"):
        Simulator(policy, 3, [fast, slow], sim_settings())


def test_decoding_in_place_counts_the_prefill_token_as_the_decode_instance_first():
    perf = make_perf()
    policy, count = build_policy(policy_setup(perf, SLO_, PolicyConfig("colocated"), instances=1))
    sim = Simulator(policy, count, perf, sim_settings())
    (request,) = sim.run([Request(0, 0.0, 1000, 3)]).requests
    assert request.decode_first_token_s == request.first_token_s
    assert request.transfer_s == 0
    # the widest gap: prefill token -> first decode token, or the last decode step
    assert request.max_itl_s == pytest.approx(perf.decode.step_s(1, 1002))


def test_token_timing_is_the_same_step_by_step_and_fast():
    requests = [Request(i, 0.01 * i, 300 + 97 * i, 40 + 13 * i) for i in range(12)]
    fast = run_pd([dataclasses.replace(r) for r in requests], 2, 2)
    slow = run_pd([dataclasses.replace(r) for r in requests], 2, 2, span=1)
    for a, b in zip(fast, slow, strict=True):
        assert a.decode_first_token_s == pytest.approx(b.decode_first_token_s, abs=1e-12)
        assert a.max_itl_s == pytest.approx(b.max_itl_s, rel=1e-9)
        assert a.finish_s == pytest.approx(b.finish_s, abs=1e-12)


def test_config_topology_defaults_and_tp():
    config = Config()  # llama-3.1-8b on h800 at tp 1: 8 instances on one node
    assert instances_per_node(config) == 8
    topology = build_topology(config, make_perf(), 8)
    assert set(topology.nodes) == {0}
    assert topology.link_between(0, 7).bytes_per_s == 1e10  # the perf model's link
    seventy = Config().with_values({"perf.model": "llama-3.1-70b", "perf.gpu": "a100",
                                    "perf.tp": 4, "cluster.inter_node_link": "tcp-25g"})
    assert instances_per_node(seventy) == 2
    topology = build_topology(seventy, make_perf(), 4)
    assert topology.nodes == (0, 0, 1, 1)
    # one NIC per GPU: a tp-4 instance sends over four
    assert topology.link_between(1, 2).bytes_per_s == pytest.approx(4 * 25e9 / 8 * 0.7)
    with pytest.raises(ValueError, match="inter_node_link"):
        Config().with_values({"cluster.inter_node_link": "carrier-pigeon"})
    with pytest.raises(ValueError, match="instances_per_node"):
        Config().with_values({"cluster.instances_per_node": -1})


def test_policies_can_price_a_transfer_from_the_view():
    perf = make_perf()
    policy, count = build_policy(policy_setup(perf, SLO_, PolicyConfig("static-pd"), prefill=1,
                                              decode=1))
    topology = Topology.build([gpu_link(perf)] * 2, 1, Link("net", 1e9, 0.0))
    view = Simulator(policy, count, perf, sim_settings(), topology).view
    assert view.topology is topology
    assert view.topology.transfer_time_s(0, 1, 2e9) == pytest.approx(2.0)
