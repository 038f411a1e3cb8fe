"""The W8A8 preset ARES runs (sec. 6.1): 8-bit weights change KV capacity and step time."""

from __future__ import annotations

import pytest

from pdserve.perf.presets import calibrated, default_tp
from pdserve.perf.specs import gpu_spec, model_spec

FP16, W8A8, GPU = "deepseek-r1-distill-qwen-7b", "deepseek-r1-distill-qwen-7b-w8a8", "rtx-4090d"


def test_w8a8_halves_the_decoder_weights_and_keeps_16_bit_kv() -> None:
    fp16, int8 = model_spec(FP16), model_spec(W8A8)
    assert int8.params == fp16.params
    embeddings = fp16.params - fp16.layers * fp16.layer_params
    assert int8.weight_bytes == fp16.layers * fp16.layer_params + 2 * embeddings
    assert int8.kv_bytes_per_token == fp16.kv_bytes_per_token
    assert default_tp(W8A8, GPU) == 1


def test_w8a8_fits_more_kv_and_steps_faster_on_a_4090d() -> None:
    fp16, int8 = calibrated(FP16, GPU), calibrated(W8A8, GPU)
    gpu = gpu_spec(GPU)
    freed = model_spec(FP16).weight_bytes - model_spec(W8A8).weight_bytes
    assert int8.kv_capacity_tokens - fp16.kv_capacity_tokens == pytest.approx(
        freed / fp16.kv_bytes_per_token, abs=1)
    assert int8.gemm_gpu.tflops == gpu.int8_peak_tops == 588.3
    for batch, context in ((1, 1000), (16, 64_000)):  # memory-bound decode: weights halved
        assert int8.decode_step_s(batch, context) < 0.8 * fp16.decode_step_s(batch, context)
    # attention reads the same 16-bit KV: the gap narrows as context grows
    gap_short = fp16.decode_step_s(8, 8_000) - int8.decode_step_s(8, 8_000)
    gap_long = fp16.decode_step_s(8, 200_000) - int8.decode_step_s(8, 200_000)
    assert gap_long == pytest.approx(gap_short, rel=0.05)
    assert int8.prefill_s(2048) < fp16.prefill_s(2048)  # compute-bound GEMMs at INT8 peak
