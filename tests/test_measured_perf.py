"""The measured-kernel performance model (issue 24): AIConfigurator's tables, interpolated,
scaled to derived GPUs, and the engines' host overhead and memory."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.interpolate import PchipInterpolator

from pdserve.config import Config
from pdserve.perf.engine_memory import VIDUR_MEMORY, engine_memory, kv_capacity_tokens
from pdserve.perf.host_overhead import host_overhead
from pdserve.perf.kernel_tables import measured_gpus, shipped_tables
from pdserve.perf.log_grid import LogGrid
from pdserve.perf.measured_heldout import held_out_errors, held_out_head_errors
from pdserve.perf.measured_ops import measured_operators
from pdserve.perf.presets import measured, perf_model
from pdserve.perf.specs import gpu_spec, model_spec


def test_shipped_tables_cover_the_gpus_and_engines_people_deploy():
    assert {"a100", "h100", "h200", "b200", "l40s"} <= set(measured_gpus())
    for gpu in ("h100", "h200", "b200", "l40s"):
        assert shipped_tables(gpu).names == ["sglang@0.5.14", "trtllm@1.3.0rc20",
                                             "vllm@0.24.0"]
    assert shipped_tables("a100").resolve_backend(None) == "vllm@0.14.0"
    h100 = shipped_tables("h100")
    assert h100.resolve_backend("sglang") == "sglang@0.5.14"
    assert h100.resolve_backend("vllm@0.24.0") == "vllm@0.24.0"
    with pytest.raises(ValueError, match="measured: sglang@0.5.14"):
        h100.resolve_backend("vllm@0.1.0")
    with pytest.raises(ValueError, match="no measured tables"):
        h100.resolve_backend("tgi")


def test_log_grid_is_exact_at_measured_points_and_a_power_law_between():
    sizes = np.array([1, 10, 100, 1000])
    grid = LogGrid((np.array([1, 2]), sizes), np.array([[1e-5, 1e-4, 1e-3, np.nan],
                                                        [2e-5, 2e-4, 2e-3, 2e-2]]))
    assert grid.at((1, 100)) == pytest.approx(1e-3)
    assert grid.at((1, 1000)) == pytest.approx(1e-2)  # the hole: the last slope carried on
    assert grid.at((1, 30)) == pytest.approx(3e-4, rel=1e-9)
    assert grid.at((np.sqrt(2), 10)) == pytest.approx(np.sqrt(2) * 1e-4)
    assert grid.at((4, 10**6)) == pytest.approx(2e-2)  # clamped into the box
    kept, removed = LogGrid((np.arange(1, 8),), np.arange(1, 8) * 1e-3).without_every(5)
    assert [coords for coords, _ in removed] == [(5.0,)]
    assert kept.at((5,)) == pytest.approx(5e-3)


def test_a_smooth_grid_is_a_monotone_cubic_in_log_log_space_exact_where_measured():
    """`LogGrid(smooth=True)` along its size axis is SciPy's PCHIP through the measured
    points in log-log space; across the leading axes it blends the series as before."""
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(3, 12))
        sizes = np.sort(rng.choice(np.arange(1, 20000), n, replace=False)).astype(float)
        seconds = np.exp(np.cumsum(rng.normal(0.4, 0.5, n))) * 1e-5  # rises, dips at times
        grid = LogGrid((sizes,), seconds, smooth=True)
        reference = PchipInterpolator(np.log(sizes), np.log(seconds))
        queries = np.exp(rng.uniform(np.log(sizes[0]), np.log(sizes[-1]), 30))
        got = np.array([grid.at((q,)) for q in queries])
        assert got == pytest.approx(np.exp(reference(np.log(queries))), rel=1e-12)
        assert [grid.at((s,)) for s in sizes] == pytest.approx(seconds, rel=1e-12)
        for q, value in zip(queries, got, strict=True):  # never outside its neighbours
            i = int(np.searchsorted(sizes, q)) - 1
            low, high = sorted(seconds[i:i + 2])
            assert low * (1 - 1e-12) <= value <= high * (1 + 1e-12)
    # a latency floor turning into a square law, 128 held out: the straight line between 64
    # and 256 lies 2.3 % above it, the cubic through the neighbours 0.7 %
    lengths = np.array([16.0, 32, 64, 128, 256, 512, 1024])
    seconds = 15e-6 + 2e-11 * lengths**2
    held_in = np.delete(np.arange(7), 3)
    straight = LogGrid((lengths[held_in],), seconds[held_in])
    smooth = LogGrid((lengths[held_in],), seconds[held_in], smooth=True)
    assert straight.at((128,)) / seconds[3] - 1 > 0.02
    assert abs(smooth.at((128,)) / seconds[3] - 1) < 0.01
    two = LogGrid((np.array([1.0, 2.0]), np.array([10.0, 100.0])),
                  np.array([[1e-5, 1e-3], [2e-5, 2e-3]]), smooth=True)
    assert two.at((np.sqrt(2), 10 ** 1.5)) == pytest.approx(np.sqrt(2) * 1e-4)  # 2 points


def test_prefill_attention_is_interpolated_smoothly_because_held_out_rows_say_so():
    """The choice in `parse_tables`: on every shipped table, the monotone cubic's held-out
    P90 on prefill attention is below the straight lines'; on decode attention it is not
    (kernel switches between lengths), so decode stays straight."""
    cubic_wins = {"context": 0, "generation": 0}
    tables = 0
    for gpu in measured_gpus():
        for backend in shipped_tables(gpu).backends.values():
            tables += 1
            for family in cubic_wins:
                heads = getattr(backend, family)
                assert all(g.smooth == (family == "context") for g in heads.grids)
                other = dataclasses.replace(heads, grids=tuple(
                    dataclasses.replace(g, smooth=not g.smooth) for g in heads.grids))
                shipped_p90 = np.percentile(held_out_head_errors(heads), 90)
                other_p90 = np.percentile(held_out_head_errors(other), 90)
                smooth_p90, straight_p90 = ((shipped_p90, other_p90) if family == "context"
                                            else (other_p90, shipped_p90))
                cubic_wins[family] += smooth_p90 < straight_p90
    assert tables == 27
    assert cubic_wins["context"] == tables
    assert cubic_wins["generation"] < tables / 2


def test_held_out_rows_of_h100_vllm_are_interpolated_within_a_few_per_cent():
    errors = held_out_errors("h100", "vllm@0.24.0")
    assert set(errors) == {"gemm", "gemm_fp8", "context_attention", "generation_attention",
                           "all_reduce", "moe"}
    for family in ("gemm", "context_attention", "generation_attention", "all_reduce", "moe"):
        assert errors[family].median_pct <= 5.0, family
        assert errors[family].rows >= 20
    assert errors["gemm"].p90_pct < 20 and errors["generation_attention"].p90_pct <= 10
    assert errors["context_attention"].p90_pct <= 10  # 12.9 before the monotone cubic


def test_gemm_rows_one_token_apart_differ_by_more_than_the_p90_target():
    """Why the GEMMs' held-out P90 misses 10 %: the tables' own pairs (m, m + 1) differ by
    more than that in over a tenth of cases, so no model smooth in m meets it."""
    from pdserve.perf.measured_heldout import adjacent_gemm_spread
    bf16 = adjacent_gemm_spread("h100", "vllm@0.24.0")
    assert bf16 is not None and bf16.rows > 5000
    assert 12 < bf16.p90_pct < 20 and bf16.median_pct < 5
    fp8 = adjacent_gemm_spread("h100", "vllm@0.24.0", "fp8")
    assert fp8 is not None and fp8.p90_pct > 30
    held_out = held_out_errors("h100", "vllm@0.24.0")["gemm"]
    assert held_out.p90_pct <= bf16.p90_pct  # interpolation is as good as the data resolve
    assert adjacent_gemm_spread("a100", "vllm@0.14.0", "fp8") is None


def test_whole_steps_match_aiconfigurators_estimates_quoted_in_the_issue():
    """Issue 24's figures of AIConfigurator 0.12.0 (vLLM 0.24.0, H100), ms."""
    eight, eight_tp2 = (measured("llama-3.1-8b", "h100", tp, "vllm", host="none")
                        for tp in (1, 2))
    seventy = measured("llama-3.1-70b", "h100", 4, "vllm", host="none")
    cases = [(eight.prefill_s(4000), 88.1), (eight.decode_step_s(64, 64 * 4250), 18.3),
             (eight.decode_step_s(256, 256 * 1000), 19.3),
             (eight_tp2.decode_step_s(64, 64 * 1000), 5.9),
             (seventy.prefill_s(4000), 259), (seventy.decode_step_s(64, 64 * 4250), 24.4)]
    for ours, theirs in cases:
        assert ours * 1e3 == pytest.approx(theirs, rel=0.06)


def test_presets_price_h200_b200_l40s_and_the_runtime_model_keeps_the_operator_steps():
    for gpu in ("h200", "b200", "l40s"):
        runtime = perf_model("llama-3.1-8b", gpu, 1, "vllm")
        assert "measured vllm@0.24.0" in runtime.name
        steps = measured("llama-3.1-8b", gpu, 1, "vllm")
        assert runtime.batch_time_s(64, 64 * 1024, 0, 0) == pytest.approx(
            steps.decode_step_s(64, 64 * 1024), rel=0.03)
        assert runtime.batch_time_s(0, 0, 2048, 2048 * 2048) == pytest.approx(
            steps.prefill_s(2048), rel=0.03)
    b200, h100 = (perf_model("llama-3.1-8b", g, 1, "vllm") for g in ("b200", "h100"))
    assert b200.decode.step_s(64, 64 * 1024) < 0.6 * h100.decode.step_s(64, 64 * 1024)
    assert perf_model("llama-3.1-8b", "h100", 1) is perf_model("llama-3.1-8b", "h100", 1)
    sglang = perf_model("llama-3.1-8b", "h100", 1, "sglang")
    assert "sglang@0.5.14" in sglang.name
    assert sglang.kv_capacity_tokens != h100.kv_capacity_tokens


def test_a_mixed_step_is_priced_as_the_kernels_run_it():
    """A chunk and a decode batch in one pass: the decodes' tokens ride in the chunk's
    GEMMs. The runtime model's mixed step against the kernels' own pass; the additive form
    (prefill + decode - the smaller intercept) was 6-22 % low on most of these (|error| P90
    11.6 % on the 8B, 16.7 % on Qwen3-32B TP 2; the decision grid's defect 3)."""
    from pdserve.types import attn_units
    for model, gpu, tp in (("llama-3.1-8b", "h100", 1), ("qwen3-32b", "h100", 2),
                           ("llama-3.1-70b", "h200", 2)):
        steps = measured(model, gpu, tp, "vllm")
        runtime = perf_model(model, gpu, tp, "vllm")
        errors = []
        for chunk in (64, 256, 1024, 2048):
            for decodes in (8, 64, 200):
                context = decodes * 1000
                ours = runtime.batch_time_s(decodes, context, chunk, attn_units(chunk, 0))
                errors.append(ours / steps.pass_s([(chunk, 0)], decodes, context) - 1)
        errors = np.abs(errors) * 100
        assert np.percentile(errors, 90) < 7.0 and errors.max() < 10.0, (model, errors)
    # 1,024 tokens beside 121 decodes on the 8B, H100: AIConfigurator's mixed step is 31.9
    # ms, the kernels' 30.5 ms; the additive form gave 28.0
    eight = perf_model("llama-3.1-8b", "h100", 1, "vllm")
    assert eight.batch_time_s(121, 121 * 1100, 1024, attn_units(1024, 0)) * 1e3 == (
        pytest.approx(30.5, rel=0.05))


def test_a_linear_models_mixed_step_is_its_parts_less_one_overhead():
    from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs
    linear = PerfModel("linear", PrefillCoeffs(0.004, 7e-5, 5e-8),
                       DecodeCoeffs(0.003, 8e-5, 1.5e-6, batch1_extra_s=-0.001),
                       TransferCoeffs(1e-5, 1e10), 1024, 32768)
    for decodes in (1, 5, 40):
        parts = (linear.prefill.time_s(300, 300 * 300) + linear.decode.step_s(decodes, 9000)
                 - 0.003)
        assert linear.batch_time_s(decodes, 9000, 300, 300 * 300) == parts


def test_derived_gpus_scale_the_nearest_measured_tables_per_bound():
    h100, h800, h20 = (measured_operators(g, "vllm") for g in ("h100", "h800", "h20"))
    # H800: H100 compute and memory, a 200 GB/s link instead of 450
    assert h800.gemm_s(4096, 4096, 14336) == pytest.approx(h100.gemm_s(4096, 4096, 14336))
    big = 64 << 20
    assert h800.all_reduce_s(big, 4) > 1.8 * h100.all_reduce_s(big, 4)
    assert h800.send_s(big) > 1.8 * h100.send_s(big)
    assert h800.all_reduce_s(1024, 4) == pytest.approx(h100.all_reduce_s(1024, 4), rel=0.05)
    # H20: a compute-bound GEMM scales with TFLOP/s, a memory-bound one with bandwidth
    compute = h20.gemm_s(8192, 8192, 28672) / h100.gemm_s(8192, 8192, 28672)
    memory = h20.gemm_s(1, 8192, 28672) / h100.gemm_s(1, 8192, 28672)
    assert compute == pytest.approx(989 / 148, rel=0.15)
    assert memory == pytest.approx(3350 / 4000, rel=0.15)
    assert h20.decode_attention_s(64, 64 * 4096, 8, 1) < h100.decode_attention_s(
        64, 64 * 4096, 8, 1)
    for gpu, base in (("l20", "l40s"), ("rtx-4090d", "l40s"), ("h800", "h100"), ("h20", "h100")):
        assert gpu_spec(gpu).kernel_tables == base
        assert f"measured on {base}, scaled" in perf_model("llama-3.1-8b", gpu, 1, "vllm").name


def test_links_come_from_each_gpus_own_tables():
    a100, h100, l40s = (measured_operators(g, "vllm") for g in ("a100", "h100", "l40s"))
    size = 256 << 20
    assert h100.send_s(size) < 0.8 * a100.send_s(size)  # not the A100's figure
    assert l40s.send_s(size) > 5 * h100.send_s(size)  # PCIe
    # today's custom all-reduce under CUDA graphs: a few us at decode sizes, not 50
    assert h100.all_reduce_s(64 * 8192 * 2, 4) < 20e-6
    runtime = perf_model("llama-3.1-70b", "h100", 4, "vllm")
    assert runtime.transfer_time_s(100_000) < perf_model("llama-3.1-70b", "a100", 4,
                                                         "vllm").transfer_time_s(100_000)


def test_host_overhead_is_a_switch_with_the_2023_vllm_figures_kept():
    assert host_overhead("engine").time_s(64, 4) == 0.0
    old = host_overhead("vllm-v0")
    assert old.time_s(1, 1) == pytest.approx(1.03e-3, rel=0.1)
    assert old.time_s(1, 2) - old.time_s(1, 1) == pytest.approx(6.7e-3, rel=0.1)
    with pytest.raises(ValueError, match="known: engine"):
        host_overhead("fast")
    slow = perf_model("llama-3.1-8b", "h100", 2, "vllm", "vllm-v0")
    fast = perf_model("llama-3.1-8b", "h100", 2, "vllm", "engine")
    assert slow.decode.step_s(64, 64 * 1000) - fast.decode.step_s(64, 64 * 1000) \
        == pytest.approx(old.time_s(64, 2), rel=0.1)
    with pytest.raises(ValueError, match="perf.host_overhead"):
        Config().with_values({"perf.host_overhead": "fast"})


def test_kv_capacity_follows_each_engines_memory_defaults():
    model, gpu = model_spec("llama-3.1-8b"), gpu_spec("h100")
    vidur = kv_capacity_tokens(model, gpu, 1, VIDUR_MEMORY)
    assert gpu.memory_bytes == 80 * 2**30  # an "80 GB" H100 holds 80 GiB
    assert vidur == int((80 * 2**30 * 0.9 - model.weight_bytes) // model.kv_bytes_per_token)
    vllm = engine_memory("vllm@0.24.0", gpu, 1)
    assert vllm.fraction == 0.92 and engine_memory("vllm@0.14.0", gpu, 1).fraction == 0.90
    expected = (0.92 * 80 * 2**30 - model.weight_bytes - 2 * 8192 * 4096 * 11 - 3.5 * 2**30)
    assert kv_capacity_tokens(model, gpu, 1, vllm) == pytest.approx(
        expected / model.kv_bytes_per_token, abs=1)
    trtllm = kv_capacity_tokens(model, gpu, 1, engine_memory("trtllm@1.3.0rc20", gpu, 1))
    sglang = engine_memory("sglang@0.5.14", gpu, 1)
    reserved_mib = 512 + 1.5 * 8192 + 1024 / 8 + 256 * 2  # SGLang's tiers for an 80 GB GPU
    assert sglang.fraction == pytest.approx(1 - reserved_mib / (80 * 1024), abs=1e-3)
    assert trtllm < vidur and kv_capacity_tokens(model, gpu, 1, vllm) < vidur
    # the 4090D's 24 GB: activations and runtime memory take a third of ARES's KV
    ares = model_spec("deepseek-r1-distill-qwen-7b-w8a8")
    small = gpu_spec("rtx-4090d")
    assert kv_capacity_tokens(ares, small, 1, engine_memory("vllm@0.24.0", small, 1)) < \
        0.8 * kv_capacity_tokens(ares, small, 1, VIDUR_MEMORY)


def test_gpu_memory_is_what_aiconfigurator_measured_the_gpu_with():
    """Device memory in bytes as the engines see it: AIConfigurator's `mem_capacity` (80 GiB
    for an "80 GB" H100, nvidia-smi's 46,068 MiB for the "48 GB" L40S), not 1e9 x the
    datasheet's GB, which left 7 % of every GPU's memory out of the KV cache."""
    for name in measured_gpus():
        assert gpu_spec(name).memory_bytes == pytest.approx(
            shipped_tables(name).meta["memory_gb"] * 1e9, rel=1e-9), name
    assert gpu_spec("h800").memory_bytes == gpu_spec("h100").memory_bytes
    assert gpu_spec("l20").memory_bytes == gpu_spec("l40s").memory_bytes


def test_w8a8_uses_the_fp8_tables():
    l40s = measured_operators("l40s", "vllm")
    assert l40s.gemm_s(4096, 3584, 37888, "fp8") < 0.8 * l40s.gemm_s(4096, 3584, 37888)
    a100 = measured_operators("a100", "vllm")  # no fp8 table: bf16 scaled to the INT8 peak
    assert a100.gemm_s(4096, 4096, 28672, "fp8") < 0.7 * a100.gemm_s(4096, 4096, 28672)
    quantised = measured("deepseek-r1-distill-qwen-7b-w8a8", "rtx-4090d", 1, "vllm")
    plain = measured("deepseek-r1-distill-qwen-7b", "rtx-4090d", 1, "vllm")
    assert quantised.decode_step_s(16, 16 * 4096) < 0.8 * plain.decode_step_s(16, 16 * 4096)


def test_ares_decode_step_at_half_kv_is_near_its_18_ms():
    """ARES (sec. 6.1) runs DeepSeek-R1-Distill-Qwen-7B W8A8 on one RTX 4090D per instance
    under vLLM and reports an 18.23 ms decode step at 50 % KV usage (batch not stated: 16
    here). Its convention is a real engine: the measured vLLM source."""
    runtime = perf_model("deepseek-r1-distill-qwen-7b-w8a8", "rtx-4090d", 1, "vllm")
    step_s = runtime.decode.step_s(16, runtime.kv_capacity_tokens // 2)
    assert step_s == pytest.approx(18.23e-3, rel=0.15)


def test_decode_attention_never_reads_kv_faster_than_hbm():
    """The L40S's generation-attention rows re-run one layer's KV, which stays in its 96 MB
    L2: at 16 x 1,023 tokens (64 MiB of KV) the row reads at 2.4x the 864 GB/s HBM peak. In
    a forward pass that KV comes from HBM, so the operator takes the HBM time; the H100's
    rows, slower than its HBM, stand as measured."""
    tokens = 16 * 1023
    kv_bytes = tokens * 2 * 8 * 128 * 2

    def raw_row(gpu: str) -> float:
        generation = shipped_tables(gpu).backends["vllm@0.24.0"].generation
        return generation.grids[generation.pairs.index((32, 8))].at((16, 1023))

    l40s_hbm_s = kv_bytes / (gpu_spec("l40s").hbm_gb_s * 1e9)
    assert raw_row("l40s") < 0.5 * l40s_hbm_s
    assert measured_operators("l40s", "vllm").decode_attention_s(16, tokens, 32, 8) == \
        pytest.approx(l40s_hbm_s, rel=1e-9)
    assert raw_row("h100") > kv_bytes / (gpu_spec("h100").hbm_gb_s * 1e9)
    assert measured_operators("h100", "vllm").decode_attention_s(16, tokens, 32, 8) == \
        pytest.approx(raw_row("h100"), rel=1e-6)
