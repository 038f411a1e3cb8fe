"""ARES in the simulator: against its baselines, composed with another preset, and at no
cost to policies that do not use it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from pdserve.config import SimConfig
from pdserve.policies.ares.rebalancer import AresRebalancer
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicySetup
from pdserve.sim.runner import Experiment, build_topology
from pdserve.sim.simulator import Simulator

BASE = SimConfig(trace="synthetic", synthetic_lengths="table:sharegpt-long",
                 synthetic_requests=200, synthetic_rate_rps=0.25, prefill=1, decode=3,
                 model="deepseek-r1-distill-qwen-7b-w8a8", gpu="rtx-4090d",
                 inter_node_link="tcp-25g", instances_per_node=1, ttft_slo_s=10.0,
                 tpot_slo_s=0.03, seed=0)


def run(config: SimConfig):  # type: ignore[no-untyped-def]
    experiment = Experiment.from_config(config)
    result = experiment.simulate()
    return result, experiment.summarize(result)


def test_ares_beats_vllm_on_p99_tpot_and_memory_pressure_is_counted() -> None:
    vllm, vllm_summary = run(replace(BASE, policy="vllm"))
    ares, ares_summary = run(replace(BASE, policy="ares", ares_predictor="history"))
    assert vllm.migrations == 0 and ares.migrations > 10
    assert ares_summary.tpot_s.p99 < 0.95 * vllm_summary.tpot_s.p99
    assert ares_summary.slo_attainment >= vllm_summary.slo_attainment
    assert ares_summary.completed == vllm_summary.completed == 200


def test_memory_pressure_preempts_and_is_counted_per_policy() -> None:
    heavy = replace(BASE, synthetic_rate_rps=0.35, synthetic_requests=250)
    _, vllm = run(replace(heavy, policy="vllm"))
    _, ares = run(replace(heavy, policy="ares", ares_predictor="history"))
    # the unbalanced decode instances run out of KV and preempt (recompute later)
    assert vllm.preemptions > 20
    assert ares.preemptions < vllm.preemptions


def test_reschedule_current_migrates_without_predictions() -> None:
    result, _ = run(replace(BASE, policy="reschedule-current", synthetic_requests=80))
    assert result.migrations > 0


def test_ares_rebalancer_composes_with_arrow_from_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "arrow_ares.yaml"
    path.write_text("policy: arrow\nrebalancer: ares\nares_predictor: oracle\n"
                    "trace: synthetic\nsynthetic_lengths: table:sharegpt-long\n"
                    "synthetic_requests: 80\nsynthetic_rate_rps: 0.25\nprefill: 1\n"
                    "decode: 3\nmodel: deepseek-r1-distill-qwen-7b-w8a8\ngpu: rtx-4090d\n"
                    "inter_node_link: tcp-25g\ninstances_per_node: 1\n")
    config = SimConfig.from_yaml(path)
    experiment = Experiment.from_config(config)
    setup = PolicySetup(experiment.perf, experiment.slo, prefill=1, decode=3,
                        rebalancer=config.rebalancer, ares=config.ares_settings())
    policy, count = build_policy("arrow", setup)
    assert isinstance(policy.rebalancer, AresRebalancer)
    assert type(policy.prefill_router).__name__ == "ArrowPrefillRouter"
    result = Simulator(policy, count, experiment.perf, None,
                       build_topology(config, experiment.perf, count)).run(
        experiment.workload.requests())
    assert result.migrations == policy.rebalancer.migrations > 0
    assert all(r.finished for r in result.requests)
    plain, _ = run(replace(config, rebalancer=""))
    assert plain.migrations == 0  # arrow alone never migrates decodes


def test_policies_without_ares_keep_no_forecast() -> None:
    experiment = Experiment.from_config(replace(BASE, policy="vllm", synthetic_requests=5))
    policy, count = build_policy("vllm", PolicySetup(experiment.perf, experiment.slo,
                                                     prefill=1, decode=3))
    assert policy.decode_forecast is None
    simulator = Simulator(policy, count, experiment.perf)
    assert simulator.tracker is None
    assert all(i.decode_forecast is None for i in simulator.instances)


def test_bad_rebalancer_is_named() -> None:
    with pytest.raises(ValueError, match="rebalancer"):
        SimConfig(rebalancer="magic")
    with pytest.raises(ValueError, match="ares_"):
        SimConfig(ares_decay=0.0)
    experiment = Experiment.from_config(replace(BASE, synthetic_requests=5))
    with pytest.raises(ValueError, match="own rebalancer"):
        build_policy("taichi", PolicySetup(experiment.perf, experiment.slo, prefill=1,
                                           decode=3, rebalancer="ares"))
