"""Mixture-of-experts models (issue 24's MoE tables): the fused MoE layer priced from the
engines' measured tables, weights counting every expert, and the sources without MoE
operators refusing them."""

from __future__ import annotations

import pytest

from pdserve.config import Config
from pdserve.perf.kernel_tables import shipped_tables
from pdserve.perf.measured_ops import measured_operators
from pdserve.perf.presets import default_tp, measured, perf_model
from pdserve.perf.specs import model_spec
from pdserve.planning.candidates import feasible_degrees
from pdserve.sim.runner import Experiment


def test_moe_weights_count_every_expert_and_kv_only_the_attention():
    qwen = model_spec("qwen3-30b-a3b")
    assert qwen.params == pytest.approx(30.5e9, rel=0.01)  # "30B", 3.3B active
    assert model_spec("qwen3-235b-a22b").params == pytest.approx(235e9, rel=0.01)
    assert model_spec("mixtral-8x7b").params == pytest.approx(46.7e9, rel=0.01)
    assert model_spec("mixtral-8x22b").params == pytest.approx(141e9, rel=0.01)
    assert model_spec("qwen3-coder-480b-a35b").params == pytest.approx(480e9, rel=0.01)
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


def test_the_default_degree_is_one_the_heads_allow():
    """Qwen3-235B-A22B's 470 GB: TP 8 would keep its weights under 60 % of 8 H200s, but its
    4 KV heads allow TP 4, where they take 81 %; on H100s nothing its heads allow holds them."""
    assert default_tp("qwen3-235b-a22b", "h200") == 4
    assert perf_model("qwen3-235b-a22b", "h200").kv_capacity_tokens > 100_000
    with pytest.raises(ValueError, match="do not fit 4 x h100.*4 KV heads"):
        default_tp("qwen3-235b-a22b", "h100")
    assert default_tp("qwen3-30b-a3b", "h100") == 2  # 61 GB: over 60 % of one H100


def test_a_mixed_step_of_an_moe_model_is_priced_as_its_kernels_run_it():
    """The closed-form mixed step charged the prefill fit's intercept (an MoE model's
    experts' weight read, 5-13 ms) once more: 20-30 % high. Read off the kernels' mixed
    passes per batch size it is within a few per cent, at chunks and contexts it was not
    read at."""
    from pdserve.types import attn_units
    for model, gpu, tp in (("qwen3-30b-a3b", "h100", 2), ("mixtral-8x7b", "h100", 2),
                           ("qwen3-235b-a22b", "h200", 4)):
        steps, runtime = measured(model, gpu, tp, "vllm"), perf_model(model, gpu, tp, "vllm")
        assert len(runtime.mixed_decode_table_s) == 256
        errors = []
        for chunk in (64, 512, 1536, 4096):
            for decodes in (8, 50, 150, 256):
                context = decodes * 2500
                ours = runtime.batch_time_s(decodes, context, chunk, attn_units(chunk, 0))
                errors.append(abs(ours / steps.pass_s([(chunk, 0)], decodes, context) - 1))
        assert max(errors) < 0.05, (model, max(errors))
    # dense models keep the closed form (their recorded verdicts are priced by it)
    assert perf_model("llama-3.1-8b", "h100", 1, "vllm").mixed_decode_table_s == ()


def test_a_mixed_table_survives_a_save_and_load(tmp_path):
    from pdserve.perf.fitted import PerfModel
    runtime = perf_model("mixtral-8x7b", "h100", 2, "vllm")
    runtime.save(tmp_path / "perf.json")
    loaded = PerfModel.load(tmp_path / "perf.json")
    assert loaded.mixed_decode_table_s == runtime.mixed_decode_table_s
    assert loaded.batch_time_s(64, 64000, 1024, 1024 * 1024) == runtime.batch_time_s(
        64, 64000, 1024, 1024 * 1024)


def test_a_derived_gpu_scales_the_moe_layer_per_bound():
    """H800 = H100 compute and HBM: the same layer. H20 (148 of the H100's 989 TFLOP/s,
    4.0 against 3.35 TB/s): many tokens are compute-bound, 989/148 = 6.7x; one token reads
    its 8 experts' weights, which the H20's HBM does faster."""
    shape = (2048, 768, 8, 128, 2)
    h100, h800, h20 = (measured_operators(g, "vllm") for g in ("h100", "h800", "h20"))
    for tokens in (1, 64, 1024, 8192):
        assert h800.moe_s(tokens, *shape) == h100.moe_s(tokens, *shape)
    assert h20.moe_s(8192, *shape) / h100.moe_s(8192, *shape) == pytest.approx(989.4 / 148,
                                                                              rel=0.01)
    assert h20.moe_s(1, *shape) / h100.moe_s(1, *shape) == pytest.approx(3.35 / 4.0, rel=0.01)
    # beyond the largest measured count (16,384), compute-bound: twice the tokens, twice
    assert h100.moe_s(32768, *shape) == pytest.approx(2 * h100.moe_s(16384, *shape), rel=0.01)
