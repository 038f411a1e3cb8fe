"""The calibrated operator model against a GPU it was not fitted on (issue 15 part 5).

The simulator prices H100/H800/H20 by scaling curves fitted on Vidur's A100 rows by each
GPU's datasheet peaks (`pdserve/perf/operators.py`). This times each Llama-3.1-8B operator
on the GPU at hand in bfloat16, the way the engine (and vLLM) runs it: GEMMs through
`F.linear` (cuBLAS), attention through `scaled_dot_product_attention` over the paged pool's
gathered blocks, the elementwise ops as the engine's torch code, and prints measured next to
predicted for that GPU's spec, with the signed error (prediction - measured) / measured.

Timing: CUDA events around one call, the median of `--repeats` after warm-up, the L2 cache
flushed before each (a 256 MB write), fresh random inputs (never zeros).

    python bench/gpu_operators.py --gpu-spec h100 --out results/gpu
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pdserve.engine.config import ModelConfig
from pdserve.engine.elementwise import rotate_half
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.model import RMSNorm
from pdserve.perf.layer_shape import GEMM_OPS
from pdserve.perf.operators import op_time_s, shipped_operator_model
from pdserve.perf.presets import calibrated
from pdserve.perf.specs import gpu_spec

TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
PREFILL = ((256, 0), (1024, 0), (4096, 0), (512, 2048), (1024, 4096))
DECODE = ((1, 512), (8, 512), (32, 512), (32, 2048), (128, 1024))


class Timer:
    def __init__(self, device: torch.device, repeats: int) -> None:
        self.device, self.repeats = device, repeats
        self.cuda = device.type == "cuda"
        self.flush = torch.empty(64 << 20, dtype=torch.int32, device=device) if self.cuda \
            else None

    def median_s(self, call: Callable[[], object]) -> float:
        for _ in range(3):
            call()
        times = []
        for _ in range(self.repeats):
            if self.flush is not None:
                self.flush.zero_()
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                import time
                begin = time.perf_counter()
                call()
                times.append(time.perf_counter() - begin)
        return statistics.median(times)


def measure(device: torch.device, repeats: int, gpu: str, quick: bool = False) -> list[dict]:
    tokens_list, prefill, decode_points = ((TOKENS[:2], PREFILL[:1], DECODE[:1]) if quick
                                           else (TOKENS, PREFILL, DECODE))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = calibrated("llama-3.1-8b", gpu, tp=1)
    shape, spec, ops = model.shape, gpu_spec(gpu), shipped_operator_model()
    timer = Timer(device, repeats)
    rows: list[dict] = []

    def rand(*size: int) -> torch.Tensor:
        return torch.randn(*size, device=device, dtype=dtype)

    def add(op: str, point: str, measured: float, predicted: float) -> None:
        rows.append(dict(op=op, point=point, measured_s=measured, predicted_s=predicted,
                         error_pct=100 * (predicted - measured) / measured))

    for op in GEMM_OPS:
        k, n = (int(v) for v in shape.gemm_dims(op))
        weight = rand(n, k)
        for tokens in tokens_list:
            x = rand(tokens, k)
            add(op, f"{tokens} tokens", timer.median_s(lambda x=x, w=weight: F.linear(x, w)),
                float(op_time_s(ops, op, tokens, shape, spec)))
        del weight
    hidden, ffn = int(shape.hidden), int(shape.ffn)
    norm = RMSNorm(hidden, 1e-5).to(device=device, dtype=dtype)
    config = ModelConfig(vocab_size=128256, hidden_size=hidden, intermediate_size=ffn,
                         num_layers=1, num_heads=32, num_kv_heads=8, head_dim=128)
    for tokens in tokens_list:
        x, y, gate_up = rand(tokens, hidden), rand(tokens, hidden), rand(tokens, 2 * ffn)
        qk = rand(tokens, 40, 128)
        cos, sin = rand(tokens, 1, 128), rand(tokens, 1, 128)
        point = f"{tokens} tokens"
        add("input_layernorm", point, timer.median_s(lambda x=x: norm(x)),
            float(op_time_s(ops, "input_layernorm", tokens, shape, spec)))
        add("mlp_act", point, timer.median_s(
            lambda g=gate_up: F.silu(g[:, :ffn]) * g[:, ffn:]),
            float(op_time_s(ops, "mlp_act", tokens, shape, spec)))
        add("attn_rope", point, timer.median_s(
            lambda t=qk, c=cos, s=sin: t * c + rotate_half(t) * s),
            float(op_time_s(ops, "attn_rope", tokens, shape, spec)))
        add("add", point, timer.median_s(lambda x=x, y=y: x + y),
            float(op_time_s(ops, "add", tokens, shape, spec)))
    kv_bytes = float(shape.kv_bytes_per_token)
    for new, prior in prefill:
        q = rand(1, 32, new, 128)
        keys, values = rand(1, 8, new + prior, 128), rand(1, 8, new + prior, 128)
        if prior:
            query_pos = torch.arange(prior, prior + new, device=device).unsqueeze(1)
            mask = torch.arange(prior + new, device=device).unsqueeze(0) <= query_pos

            def call(q=q, k=keys, v=values, m=mask) -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        else:
            def call(q=q, k=keys, v=values) -> torch.Tensor:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                      enable_gqa=True)
        add("prefill_attention", f"{new} new after {prior}", timer.median_s(call),
            float(ops.prefill_attention.time_s(new, prior, shape.q_head_scale, kv_bytes, spec,
                                               model.reference)))
    for batch, context in decode_points:
        blocks_per_seq = context // 16
        pool = PagedKVPool(batch * blocks_per_seq + 1, 1, config.num_kv_heads, 128,
                           dtype=dtype, device=device)
        pool.data.normal_()
        tables = torch.randperm(batch * blocks_per_seq, device=device).view(batch, -1)
        lengths = torch.full((batch,), context, device=device)
        q = rand(batch, 32, 1, 128)

        def decode(q=q, pool=pool, tables=tables, lengths=lengths) -> torch.Tensor:
            keys, values = pool.gather(0, tables)
            keys = keys.view(q.shape[0], -1, 8, 128).transpose(1, 2)
            values = values.view(q.shape[0], -1, 8, 128).transpose(1, 2)
            mask = torch.arange(keys.shape[2], device=q.device).unsqueeze(0) < \
                lengths.unsqueeze(1)
            return F.scaled_dot_product_attention(q, keys, values,
                                                  attn_mask=mask[:, None, None, :],
                                                  enable_gqa=True)
        add("decode_attention", f"batch {batch} x {context}", timer.median_s(decode),
            float(ops.decode_attention.time_s(batch, batch * context, kv_bytes, spec)))
        del pool
    return rows


def summarise(rows: list[dict]) -> None:
    print(f"{'operator':20s} {'point':22s} {'measured':>11s} {'predicted':>11s} {'error':>8s}")
    for row in rows:
        print(f"{row['op']:20s} {row['point']:22s} {row['measured_s'] * 1e6:9.1f}us "
              f"{row['predicted_s'] * 1e6:9.1f}us {row['error_pct']:+7.1f}%")
    print("\nper operator: |error| median / P90, and the signed median (bias)")
    for op in dict.fromkeys(row["op"] for row in rows):
        errors = np.array([row["error_pct"] for row in rows if row["op"] == op])
        print(f"{op:20s} median {np.median(np.abs(errors)):6.1f} %, P90 "
              f"{np.percentile(np.abs(errors), 90):6.1f} %, bias {np.median(errors):+6.1f} %")
    gemm = [row for row in rows if row["op"] in GEMM_OPS]
    for label, subset in (("GEMMs at >= 512 tokens (compute-bound)",
                           [r for r in gemm if int(r["point"].split()[0]) >= 512]),
                          ("GEMMs at <= 32 tokens (weight-read-bound)",
                           [r for r in gemm if int(r["point"].split()[0]) <= 32])):
        if not subset:
            continue
        errors = np.array([r["error_pct"] for r in subset])
        print(f"{label}: median {np.median(np.abs(errors)):.1f} %, bias "
              f"{np.median(errors):+.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu-spec", default="h100", help="the spec to predict for [h100]")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None, help="write operators.json here")
    parser.add_argument("--quick", action="store_true", help="a few points (a smoke run)")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":
        print("no GPU here: timing the CPU float32 ops against the GPU spec's prediction "
              "(a smoke run; the figures mean nothing)")
    rows = measure(device, args.repeats, args.gpu_spec, args.quick)
    summarise(rows)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "operators.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
