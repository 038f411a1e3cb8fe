"""AMPD's planner: the ILP of Eq. 5 against known optima, and the simulated tau tables."""

from __future__ import annotations

import itertools
import random

import pytest

from pdserve.planning.ampd import interpolate, plan, replica_grid, tau_tables
from pdserve.planning.ampd_ilp import solve
from pdserve.planning.ampd_inputs import PlanInputs
from pdserve.types import SLO


def test_known_optimum() -> None:
    # on 4 GPUs: 3 prefill replicas of TP1 + 1 decode of TP1 reach Z = 1; every other
    # deployment is worse (2P TP1 + 1D TP2: 1.5; 1P TP2 + 2D TP1: 1.2; ...)
    tau_prefill = {(1, 1): 3.0, (1, 2): 1.5, (1, 3): 1.0, (2, 1): 1.2}
    tau_decode = {(1, 1): 1.0, (1, 2): 0.8, (1, 3): 0.7, (2, 1): 0.9}
    best = solve(tau_prefill, tau_decode, gpus=4)[0]
    assert (best.prefill_degree, best.prefill_replicas) == (1, 3)
    assert (best.decode_degree, best.decode_replicas) == (1, 1)
    assert best.z == pytest.approx(1.0) and best.gpus == 4


def brute_force(tau_prefill: dict, tau_decode: dict, gpus: int) -> list[float]:
    return sorted(max(tau_prefill[p], tau_decode[d])
                  for p, d in itertools.product(tau_prefill, tau_decode)
                  if p[0] * p[1] + d[0] * d[1] <= gpus)


@pytest.mark.parametrize("seed", range(5))
def test_top_three_equal_exhaustive_search(seed: int) -> None:
    rng = random.Random(seed)
    gpus = 16
    tau_prefill, tau_decode = {}, {}
    for degree in (1, 2, 4, 8):
        base_p, base_d = rng.uniform(1, 8) / degree ** 0.8, rng.uniform(0.5, 3) / degree ** 0.5
        for k in range(1, (gpus - 1) // degree + 1):
            tau_prefill[degree, k] = base_p / k + rng.uniform(0, 0.01)
            tau_decode[degree, k] = base_d / k ** 0.5 + rng.uniform(0, 0.01)
    found = solve(tau_prefill, tau_decode, gpus, top=3)
    expected = brute_force(tau_prefill, tau_decode, gpus)[:3]
    assert [d.z for d in found] == pytest.approx(expected, abs=1e-6)
    for deployment in found:
        assert deployment.gpus <= gpus
        assert deployment.z == pytest.approx(max(deployment.tau_prefill, deployment.tau_decode))
    assert len({(d.prefill_degree, d.prefill_replicas, d.decode_degree, d.decode_replicas)
                for d in found}) == 3


def test_interpolation_and_grid() -> None:
    assert replica_grid(20) == [1, 2, 3, 4, 6, 8, 16, 20]
    assert replica_grid(7) == [1, 2, 3, 4, 6, 7]
    table = interpolate({1: 4.0, 4: 1.0}, range(1, 5))
    assert table[1] == 4.0 and table[4] == 1.0
    assert table[2] == pytest.approx(1.0 + 3.0 * (0.5 - 0.25) / 0.75)


def test_plan_by_simulation() -> None:
    inputs = PlanInputs("qwen3-32b", "h20", 8, SLO(0.35, 0.04), "agent:hotpotqa",
                        sessions=40, rate_sps=0.5)
    tau_prefill, tau_decode = tau_tables(inputs, jobs=1, progress=False)
    # qwen3-32b fits TP1, 2 and 4 on H20 (TP8 would leave the other phase no GPU)
    assert {degree for degree, _ in tau_prefill} == {1, 2, 4}
    assert set(tau_prefill) == set(tau_decode)
    # more replicas split the load: a replica's p95 TTFT falls; so does a wider replica's
    assert tau_prefill[1, 4] < tau_prefill[1, 2] < tau_prefill[1, 1]
    assert tau_prefill[4, 1] < tau_prefill[2, 1] < tau_prefill[1, 1]
    assert tau_decode[4, 1] < tau_decode[1, 1]
    deployments = solve(tau_prefill, tau_decode, inputs.gpus)
    assert deployments == plan(inputs, jobs=2, progress=False)  # same in two processes
    assert deployments[0].z == pytest.approx(brute_force(tau_prefill, tau_decode, 8)[0])


def test_verification_ranks_the_shortlist_by_whole_cluster_attainment() -> None:
    from pdserve.planning.ampd_ilp import Deployment
    from pdserve.planning.ampd_verify import cluster_attainment, cluster_topology, verify

    inputs = PlanInputs("qwen3-32b", "h20", 16, SLO(0.35, 0.04), "agent:toolbench",
                        sessions=30, rate_sps=1.0)
    shortlist = [Deployment(2, 3, 2, 1, 1.0, 1.0, 0.5), Deployment(4, 1, 1, 3, 2.0, 2.0, 0.5)]
    checked = verify(inputs, shortlist, jobs=2)
    assert {d for d, _ in checked} == set(shortlist)
    scores = [score for _, score in checked]
    assert scores == sorted(scores, reverse=True)
    assert scores == [cluster_attainment(d, inputs) for d, _ in checked]
    assert all(0.0 <= s <= 1.0 for s in scores)
    # instances fill 8-GPU nodes in order: 3 x TP4 then 2 x TP4 spill to a second node
    from pdserve.perf.presets import perf_model
    perfs = [perf_model("qwen3-32b", "h20", 4)] * 3
    assert cluster_topology(perfs, [4, 4, 4]).nodes == (0, 0, 1)


def test_the_config_performance_source_prices_the_plan() -> None:
    from pdserve.perf.presets import VIDUR, perf_model
    from pdserve.planning.ampd import plan_defaults, plan_inputs, replica_tau

    measured = plan_inputs(plan_defaults().with_values(
        {"workload.synthetic_requests": 30, "workload.synthetic_rate_rps": 1.0}), 8)
    vidur = plan_inputs(plan_defaults().with_values(
        {"perf.backend": VIDUR, "perf.host_overhead": "vllm-v0",
         "workload.synthetic_requests": 30, "workload.synthetic_rate_rps": 1.0}), 8)
    assert (measured.backend, vidur.backend, vidur.host_overhead) == (None, VIDUR, "vllm-v0")
    assert measured.perf(2) == perf_model("qwen3-32b", "h20", 2)
    assert vidur.perf(2) == perf_model("qwen3-32b", "h20", 2, VIDUR)
    # the Vidur model's decode steps (2023 host overhead, its TP 2 all-reduce floor) are
    # slower than today's vLLM on the same replica: its decode tau is higher
    assert replica_tau("decode", 2, 1, vidur) > 1.2 * replica_tau("decode", 2, 1, measured)


def test_pdserve_plan_takes_the_performance_source_from_its_flags() -> None:
    from pdserve.cli import build_parser
    from pdserve.config_flags import config_from_args
    from pdserve.planning.ampd import plan_defaults, plan_inputs

    args = build_parser().parse_args(["plan", "--policy", "ampd", "--gpus", "8", "--backend",
                                      "sglang", "--host-overhead", "none"])
    inputs = plan_inputs(config_from_args(args, plan_defaults()), args.gpus)
    assert (inputs.backend, inputs.host_overhead) == ("sglang", "none")
    assert "sglang@" in inputs.perf(2).name and "host none" in inputs.perf(2).name


def test_the_planner_warns_when_no_deployment_meets_the_slos(capsys) -> None:
    """A top three all with Z > 1 (the worse phase's p95 over its SLO) was printed as a plan,
    exit 0, with no word that none of them meets the SLOs."""
    from pdserve.cli import main

    quick = ["plan", "--policy", "ampd", "--gpus", "3", "--synthetic-requests", "5",
             "--synthetic-rate", "0.5", "--model", "llama-3.1-8b", "--gpu", "h800",
             "--processes", "1"]
    assert main([*quick, "--ttft-slo", "0.001"]) == 0
    assert "warning: no deployment meets both SLOs" in capsys.readouterr().out
    assert main(quick) == 0
    assert "warning" not in capsys.readouterr().out
