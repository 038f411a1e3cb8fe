"""Operator curves fitted to measured A100 timings, scaled to any GPU by its peak specs.

Each curve prices one operator from its shape (`layer_shape.py`) and the GPU's datasheet
figures; the fitted numbers are efficiencies (fractions of peak) and fixed latencies, fitted
on the A100 (`pdserve.perf.calibrate`, shipped as
`pdserve/data/gpu_profiles/a100_operators.json`).
Another GPU gets the same efficiencies against its own peaks: memory-bound terms scale with
HBM bandwidth, compute-bound terms with dense 16-bit TFLOP/s, link terms with one-way link
bandwidth; fixed latencies (kernel launch, NCCL set-up, vLLM's CPU work) are kept as measured.

  GEMM (x @ W, K in, N out, n tokens)   launch + (mem^s + comp^s)^(1/s)
      mem  = 2(K*N + n*K + n*N) / (HBM * memory_efficiency)          the weight-read floor
      comp = 2n*K*N / (TFLOPS * compute_efficiency) * (1 + small_batch_tokens / n)
  elementwise (n tokens of width w)     launch + (serial^s + mem^s)^(1/s)
      serial = per_width * w (a row per thread block), mem = 2n*w / (HBM * efficiency)
  decode attention (B seqs, C context tokens in all)
      launch + per_seq * B + C * kv_bytes_per_token_per_layer / (HBM * kv_efficiency)
  prefill attention (chunk n after p prior tokens), per query head per GPU relative to the
      profiled layout (32 query heads, 4 KV heads per GPU, head dim 128), compute-scaled:
      launch + (per_token * n + per_causal_pair * n^2 + per_prior_pair * n*p) * head_scale
             + p * kv_bytes_per_token_per_layer / (HBM * kv_efficiency)
  CPU per iteration (vLLM)              base + per_seq * B (+ tp_comm when TP > 1)
  collectives (w GPUs, b bytes)         all-reduce: (lat^s + (2(w-1)/w * b / (link*eff))^s)^(1/s)
                                        send/recv: the same with volume b
      (latency-bound when small, bandwidth-bound when large; the latency is taken as
      independent of w: the 4-GPU rows fit about the same latency as the 2-GPU rows)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from importlib import resources
from typing import Any

from pdserve.perf.layer_shape import GEMM_OPS, STREAM_OPS, LayerShape, Number, shape_key
from pdserve.perf.residuals import Residuals
from pdserve.perf.specs import GpuSpec

OPERATORS_FILE = "a100_operators.json"


@dataclass(frozen=True, slots=True)
class GemmCurve:
    launch_s: float
    memory_efficiency: float
    compute_efficiency: float
    sharpness: float
    small_batch_tokens: float

    def time_s(self, tokens: Number, k: Number, n: Number, gpu: GpuSpec) -> Number:
        mem = 2 * (k * n + tokens * k + tokens * n) / (gpu.hbm_gb_s * 1e9
                                                         * self.memory_efficiency)
        comp = (2 * tokens * k * n / (gpu.tflops * 1e12 * self.compute_efficiency)
                * (1 + self.small_batch_tokens / tokens))
        s = self.sharpness
        return self.launch_s + (mem**s + comp**s) ** (1 / s)


@dataclass(frozen=True, slots=True)
class StreamCurve:
    launch_s: float
    per_width_s: float  # few tokens: one thread block walks a row, so time grows with width
    efficiency: float
    sharpness: float

    def time_s(self, tokens: Number, width: Number, gpu: GpuSpec) -> Number:
        serial = self.per_width_s * width
        memory = 2 * tokens * width / (gpu.hbm_gb_s * 1e9 * self.efficiency)
        s = self.sharpness
        return self.launch_s + (serial**s + memory**s) ** (1 / s)


@dataclass(frozen=True, slots=True)
class DecodeAttention:
    launch_s: float
    per_seq_s: float
    kv_efficiency: float

    def time_s(self, batch: Number, context_tokens: Number, kv_bytes_per_token: Number,
               gpu: GpuSpec) -> Number:
        return (self.launch_s + self.per_seq_s * batch
                + context_tokens * kv_bytes_per_token / (gpu.hbm_gb_s * 1e9 * self.kv_efficiency))


@dataclass(frozen=True, slots=True)
class PrefillAttention:
    launch_s: float
    per_token_s: float
    per_causal_pair_s: float
    per_prior_pair_s: float
    kv_efficiency: float

    def time_s(self, new: Number, prior: Number, head_scale: Number,
               kv_bytes_per_token: Number, gpu: GpuSpec, reference: GpuSpec) -> Number:
        work = (self.per_token_s * new + self.per_causal_pair_s * new * new
                + self.per_prior_pair_s * new * prior)
        compute = work * head_scale * reference.tflops / gpu.tflops
        kv_read = prior * kv_bytes_per_token / (gpu.hbm_gb_s * 1e9 * self.kv_efficiency)
        return self.launch_s + compute + kv_read


@dataclass(frozen=True, slots=True)
class CpuOverhead:
    base_s: float
    per_seq_s: float
    tp_comm_s: float

    def time_s(self, seqs: Number, tp: int) -> Number:
        return self.base_s + self.per_seq_s * seqs + (self.tp_comm_s if tp > 1 else 0.0)


@dataclass(frozen=True, slots=True)
class LinkCurve:
    launch_s: float
    efficiency: float
    sharpness: float

    def _time_s(self, latency_s: float, volume: Number, link_gb_s: float) -> Number:
        s = self.sharpness
        return (latency_s**s + (volume / (link_gb_s * 1e9 * self.efficiency)) ** s) ** (1 / s)

    def all_reduce_s(self, num_bytes: Number, workers: int, link_gb_s: float) -> Number:
        if workers <= 1:
            return 0.0 * num_bytes
        volume = 2 * (workers - 1) / workers * num_bytes
        return self._time_s(self.launch_s, volume, link_gb_s)

    def send_s(self, num_bytes: Number, link_gb_s: float) -> Number:
        return self._time_s(self.launch_s, num_bytes, link_gb_s)


@dataclass(frozen=True, slots=True)
class HeldOutError:
    rows: int
    median_pct: float
    p90_pct: float


@dataclass(frozen=True)
class OperatorModel:
    """Every fitted curve, the GPU it was measured on, and the held-out error of each."""
    reference_gpu: str
    gemm: dict[str, GemmCurve]
    stream: dict[str, StreamCurve]
    decode_attention: DecodeAttention
    prefill_attention: PrefillAttention
    cpu: CpuOverhead
    all_reduce: dict[str, LinkCurve]  # by interconnect: "nvlink", "pcie"
    send_recv: dict[str, LinkCurve]  # "nvlink"
    held_out: dict[str, HeldOutError]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> OperatorModel:
        raw: dict[str, Any] = json.loads(text)

        def table(kind: type, values: dict[str, dict[str, float]]) -> dict[str, Any]:
            return {name: kind(**value) for name, value in values.items()}

        return cls(reference_gpu=raw["reference_gpu"], gemm=table(GemmCurve, raw["gemm"]),
                   stream=table(StreamCurve, raw["stream"]),
                   decode_attention=DecodeAttention(**raw["decode_attention"]),
                   prefill_attention=PrefillAttention(**raw["prefill_attention"]),
                   cpu=CpuOverhead(**raw["cpu"]), all_reduce=table(LinkCurve, raw["all_reduce"]),
                   send_recv=table(LinkCurve, raw["send_recv"]),
                   held_out=table(HeldOutError, raw["held_out"]))


@lru_cache(maxsize=1)
def shipped_operator_model() -> OperatorModel:
    """The operator model fitted to the shipped A100 profiles."""
    source = resources.files("pdserve.data").joinpath("gpu_profiles", OPERATORS_FILE)
    return OperatorModel.from_json(source.read_text())


def curve_fields(kind: type) -> list[str]:
    return [f.name for f in fields(kind)]


def op_time_s(ops: OperatorModel, op: str, tokens: Number, shape: LayerShape,
              gpu: GpuSpec, residuals: Residuals | None = None) -> Number:
    """Time of one GEMM or elementwise op of the MLP-file kind for `tokens` tokens; with
    `residuals`, corrected where that shape was measured on this GPU (`residuals.py`)."""
    if op in ops.gemm:
        k, n = shape.gemm_dims(op)
        time = ops.gemm[op].time_s(tokens, k, n, gpu)
    else:
        time = ops.stream[op].time_s(tokens, shape.stream_width(op), gpu)
    if residuals is not None and gpu.name == residuals.reference_gpu:
        time = time * residuals.factor(op, shape_key(op, shape), tokens)
    return time


def layer_linear_s(ops: OperatorModel, tokens: Number, shape: LayerShape,
                   gpu: GpuSpec, residuals: Residuals | None = None) -> Number:
    """Every non-attention op of one layer (each once, as the profile lists them)."""
    return sum(op_time_s(ops, op, tokens, shape, gpu, residuals) for op in GEMM_OPS + STREAM_OPS
               if op != "emb")
