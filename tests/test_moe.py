"""Mixture-of-experts models (issue 24's MoE tables): the fused MoE layer priced from the
engines' measured tables, weights counting every expert, and the sources without MoE
operators refusing them."""

from __future__ import annotations

import pytest

from pdserve.config import Config
from pdserve.perf.kernel_tables import shipped_tables
from pdserve.perf.measured_ops import measured_operators
from pdserve.perf.presets import measured, perf_model
from pdserve.perf.specs import model_spec
from pdserve.planning.candidates import feasible_degrees
from pdserve.sim.runner import Experiment


def test_moe_weights_count_every_expert_and_kv_only_the_attention():
    qwen = model_spec("qwen3-30b-a3b")
    assert qwen.params == pytest.approx(30.5e9, rel=0.01)  # "30B", 3.3B active
    assert model_spec("qwen3-235b-a22b").params == pytest.approx(235e9, rel=0.01)
    assert model_spec("mixtral-8x7b").params == pytest.approx(46.7e9, rel=0.01)
    assert qwen.kv_bytes_per_token == 2 * 48 * 4 * 128 * 2


def test_the_moe_layer_is_the_measured_table_exactly_at_measured_token_counts():
    ops = measured_operators("h100", "vllm")
    grid = ops.tables.moe[(2048, 768, 8, 128, 2)]
    for tokens, seconds in grid.measured_points():
        assert ops.moe_s(tokens[0], 2048, 768, 8, 128, 2) == pytest.approx(seconds, rel=1e-9)
    # more tokens cost more; experts sharded over more GPUs cost less per GPU
    assert ops.moe_s(4096, 2048, 768, 8, 128, 2) > ops.moe_s(512, 2048, 768, 8, 128, 2)
    assert ops.moe_s(4096, 2048, 768, 8, 128, 4) < ops.moe_s(4096, 2048, 768, 8, 128, 2)


def test_a_decode_step_reads_the_experts_not_a_dense_ffn_of_all_of_them():
    """Qwen3-30B-A3B on one H100 (vLLM 0.24.0): AIConfigurator 0.12.0's own estimates of
    these steps (EngineHandle, vLLM, tp 1, moe_tp 1), ms, within 1 % for decode (the same
    tables and composition) and 6 % for prefill (it adds Qwen3's QK-norm)."""
    qwen = measured("qwen3-30b-a3b", "h100", 1, "vllm", host="none")
    cases = [(qwen.decode_step_s(1, 1000), 4.68), (qwen.decode_step_s(64, 64 * 1000), 24.13),
             (qwen.decode_step_s(256, 256 * 1000), 33.49)]
    for ours, theirs in cases:
        assert ours * 1e3 == pytest.approx(theirs, rel=0.01)
    assert qwen.prefill_s(4000) * 1e3 == pytest.approx(75.6, rel=0.06)
    # 3.3B active parameters of 30.5B: a batch of one reads a few experts a layer, so it
    # takes far less than a dense model of the same weights (Qwen3-32B at TP 2: 61 GB read)
    dense = measured("qwen3-32b", "h100", 2, "vllm", host="none")
    assert qwen.decode_step_s(1, 1000) < 0.5 * dense.decode_step_s(1, 1000)


def test_the_runtime_model_keeps_the_moe_steps():
    steps = measured("qwen3-30b-a3b", "h100", 2, "vllm")
    runtime = perf_model("qwen3-30b-a3b", "h100", 2, "vllm")
    for batch in (1, 16, 64, 256):
        assert runtime.batch_time_s(batch, batch * 1000, 0, 0) == pytest.approx(
            steps.decode_step_s(batch, batch * 1000), rel=0.05)
    assert runtime.batch_time_s(0, 0, 2048, 2048 * 2048) == pytest.approx(
        steps.prefill_s(2048), rel=0.05)


def test_sources_without_moe_operators_refuse_moe_models_and_unmeasured_degrees():
    with pytest.raises(ValueError, match="mixture of experts.*--backend vllm"):
        perf_model("qwen3-30b-a3b", "h100", 1, "vidur")
    # vLLM 0.24.0 on the B200 measured this shape at TP 1 and 2 only
    assert sorted(k[4] for k in shipped_tables("b200").backends["vllm@0.24.0"].moe
                  if k[:4] == (2048, 768, 8, 128)) == [1, 2]
    with pytest.raises(ValueError, match="no measured MoE layer.*TP 4.*measured at TP 1, 2"):
        measured("qwen3-30b-a3b", "b200", 4, "vllm").decode_step_s(8, 8000)
    # so the planner leaves that degree out (4 KV heads: TP 8 does not divide them)
    assert feasible_degrees("qwen3-30b-a3b", 8, lambda tp: perf_model(
        "qwen3-30b-a3b", "b200", tp, "vllm")) == [1, 2]
    assert feasible_degrees("qwen3-30b-a3b", 8, lambda tp: perf_model(
        "qwen3-30b-a3b", "h100", tp, "vllm")) == [1, 2, 4]


def test_an_moe_model_simulates_under_disaggregation():
    config = Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_requests": 200,
        "workload.synthetic_rate_rps": 10.0, "workload.synthetic_lengths": "fixed:2000:100",
        "policy.name": "static-pd", "cluster.prefill": 1, "cluster.decode": 1,
        "perf.model": "qwen3-30b-a3b", "perf.gpu": "h100", "perf.tp": 2})
    experiment = Experiment.from_config(config)
    result = experiment.simulate()
    summary = experiment.summarize(result)
    assert summary.completed == 200
    step = measured("qwen3-30b-a3b", "h100", 2, "vllm")
    assert summary.ttft_s.p50 >= step.prefill_s(2000) * 0.95
