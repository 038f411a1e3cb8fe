"""ARES in the simulator: against its baselines, composed with another preset, and at no
cost to policies that do not use it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import policy_setup, sim_settings

from pdserve.cluster.history import DecisionKind
from pdserve.config import Config
from pdserve.policies.ares.rebalancer import AresRebalancer
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicyConfig
from pdserve.sim.runner import Experiment, build_topology, load_perf_model
from pdserve.sim.simulator import Simulator
from pdserve.workload.workload import Workload

BASE = Config().with_values({
    "workload.trace": "synthetic", "workload.synthetic_lengths": "table:sharegpt-long",
    "workload.synthetic_requests": 200, "workload.synthetic_rate_rps": 0.25,
    "cluster.prefill": 1, "cluster.decode": 3, "perf.model": "deepseek-r1-distill-qwen-7b-w8a8",
    "perf.gpu": "rtx-4090d", "cluster.inter_node_link": "tcp-25g",
    "cluster.instances_per_node": 1, "slo.ttft_s": 10.0, "slo.tpot_s": 0.03, "seed": 0,
    # the scenario's margins were set on the Vidur-calibrated model; on the measured vLLM
    # model (issue 24) ARES still leads on P99 TPOT, by 3 % instead of over 5 %
    "perf.backend": "vidur"})


def run(config: Config):  # type: ignore[no-untyped-def]
    experiment = Experiment.from_config(config)
    result = experiment.simulate()
    return result, experiment.summarize(result)


def test_ares_beats_vllm_on_p99_tpot_and_memory_pressure_is_counted() -> None:
    vllm, vllm_summary = run(BASE.with_values({"policy.name": "vllm"}))
    ares, ares_summary = run(BASE.with_values({"policy.name": "ares",
                                               "policy.ares.forecast.predictor": "history"}))
    assert vllm.migrations == 0 and ares.migrations > 10
    assert ares_summary.tpot_s.p99 < 0.95 * vllm_summary.tpot_s.p99
    assert ares_summary.slo_attainment >= vllm_summary.slo_attainment
    assert ares_summary.completed == vllm_summary.completed == 200


def test_memory_pressure_preempts_and_is_counted_per_policy() -> None:
    heavy = BASE.with_values({"workload.synthetic_rate_rps": 0.35,
                              "workload.synthetic_requests": 250})
    _, vllm = run(heavy.with_values({"policy.name": "vllm"}))
    _, ares = run(heavy.with_values({"policy.name": "ares",
                                     "policy.ares.forecast.predictor": "history"}))
    # the unbalanced decode instances run out of KV and preempt (recompute later)
    assert vllm.preemptions > 20
    assert ares.preemptions < vllm.preemptions


def test_reschedule_current_migrates_without_predictions() -> None:
    result, _ = run(BASE.with_values({"policy.name": "reschedule-current",
                                      "workload.synthetic_requests": 80}))
    assert result.migrations > 0


LONGS = 6  # requests 1..6
LONG_OUTPUT = 36_000


def hidden_growth_workload() -> Workload:
    """Built so that only a prediction can see where the KV is going, on the paper's 4090D
    (KV 193,076 tokens per decode instance), 1P2D:
    request 0: a 40,000-token prompt with 200 output tokens (heavy now, gone in 4 s);
    requests 1-6: 200-token prompts with 36,000 output tokens each (light now, 217K tokens
    together at the end: more than one instance holds);
    then a stream of 6,000-token prompts with 800 output tokens, 1 per second for 300 s.
    The decode router sees current tokens only, so it puts all six long ones beside the heavy
    short one's partner; current load keeps looking balanced as the stream fills the other
    instance."""
    rng = np.random.default_rng(0)
    stream = int(1.0 * 300)
    arrival = [0.0] + [0.01 * (i + 1) for i in range(LONGS)] + list(
        1.0 + np.cumsum(rng.exponential(1.0, stream)))
    prompt = [40_000] + [200] * LONGS + [6_000] * stream
    output = [200] + [LONG_OUTPUT] * LONGS + [800] * stream
    return Workload("hidden-growth", np.array(arrival), np.array(prompt, dtype=np.int64),
                    np.array(output, dtype=np.int64))


def test_prediction_moves_the_growing_decodes_where_current_load_chases_the_short_ones() -> None:
    """ARES (Alg. 1 on predicted load, the oracle standing for a perfect predictor) against the
    same Alg. 1 on current load (`reschedule-current`) in the memory-bound regime. Measured
    2026-11-25 (measured vLLM model, memory in GiB): vllm leaves the six long decodes on one
    instance and preempts 11 times; both rebalancers avoid every preemption,
    reschedule-current with 33 migrations (28 of them short requests, which finish anyway),
    ARES with 8 (3 long ones).
    The SLO outcome is the same (attainment 100 % all three): prediction pays in KV moved,
    not in goodput, here as in docs/results/verdicts.md's ARES rows."""
    workload = hidden_growth_workload()
    # the information current load lacks: the long ones are the lightest at dispatch
    assert workload.input_tokens[1:1 + LONGS].max() < workload.input_tokens[1 + LONGS:].min()
    config = BASE.with_values({"cluster.decode": 2, "policy.ares.forecast.predictor": "oracle",
                               "perf.backend": ""})  # the measured default
    perf = load_perf_model(config)
    runs = {}
    for name in ("vllm", "reschedule-current", "ares"):
        experiment = Experiment(config.with_values({"policy.name": name}), workload, perf)
        result = experiment.simulate()
        moved = [d.request_id for d in result.decisions if d.kind is DecisionKind.MIGRATE]
        runs[name] = (result, experiment.summarize(result), moved)
    vllm, vllm_summary, _ = runs["vllm"]
    assert len({r.decode_instance for r in vllm.requests[1:1 + LONGS]}) == 1  # all on one
    assert vllm_summary.preemptions > 0  # which runs out of KV
    current, current_summary, current_moved = runs["reschedule-current"]
    ares, ares_summary, ares_moved = runs["ares"]
    for summary in (current_summary, ares_summary):
        assert summary.preemptions == 0
        assert summary.slo_attainment >= vllm_summary.slo_attainment
    assert 3 * ares.migrations <= current.migrations

    def shorts(moved: list[int]) -> int:
        return sum(1 for request_id in moved if not 1 <= request_id <= LONGS)

    assert shorts(current_moved) >= 0.75 * len(current_moved)  # chasing the present
    assert 4 * shorts(ares_moved) <= shorts(current_moved)
    assert len(ares_moved) - shorts(ares_moved) >= 3  # ARES moves the growing ones


def test_ares_rebalancer_composes_with_arrow_from_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "arrow_ares.yaml"
    path.write_text("policy:\n  name: arrow\n  rebalancer: ares\n"
                    "  ares: {forecast: {predictor: oracle}}\n"
                    "workload:\n  trace: synthetic\n  synthetic_lengths: table:sharegpt-long\n"
                    "  synthetic_requests: 80\n  synthetic_rate_rps: 0.25\n"
                    "cluster: {prefill: 1, decode: 3, inter_node_link: tcp-25g, "
                    "instances_per_node: 1}\n"
                    "perf: {model: deepseek-r1-distill-qwen-7b-w8a8, gpu: rtx-4090d}\n")
    config = Config.from_yaml(path)
    experiment = Experiment.from_config(config)
    setup = policy_setup(experiment.perf, experiment.slo, config.policy, prefill=1, decode=3)
    policy, count = build_policy(setup)
    assert isinstance(policy.rebalancer, AresRebalancer)
    assert type(policy.prefill_router).__name__ == "ArrowPrefillRouter"
    result = Simulator(policy, count, experiment.perf, sim_settings(),
                       build_topology(config, experiment.perf, count)).run(
        experiment.workload.requests())
    assert result.migrations == policy.rebalancer.migrations > 0
    assert all(r.finished for r in result.requests)
    plain, _ = run(config.with_values({"policy.rebalancer": ""}))
    assert plain.migrations == 0  # arrow alone never migrates decodes


def test_policies_without_ares_keep_no_forecast() -> None:
    experiment = Experiment.from_config(BASE.with_values({"policy.name": "vllm",
                                                          "workload.synthetic_requests": 5}))
    policy, count = build_policy(policy_setup(experiment.perf, experiment.slo,
                                              PolicyConfig("vllm"), prefill=1, decode=3))
    assert policy.decode_forecast is None
    simulator = Simulator(policy, count, experiment.perf, sim_settings())
    assert simulator.tracker is None
    assert all(i.decode_forecast is None for i in simulator.instances)


def test_bad_rebalancer_is_named() -> None:
    with pytest.raises(ValueError, match="rebalancer"):
        Config().with_values({"policy.rebalancer": "magic"})
    with pytest.raises(ValueError, match="policy.ares.forecast"):
        Config().with_values({"policy.ares.forecast.decay": 0.0})
    experiment = Experiment.from_config(BASE.with_values({"workload.synthetic_requests": 5}))
    with pytest.raises(ValueError, match="own rebalancer"):
        build_policy(policy_setup(experiment.perf, experiment.slo,
                                  PolicyConfig("taichi", rebalancer="ares"), prefill=1, decode=3))
