"""Calibrated performance model: a model x a GPU x a TP degree priced by the operator curves.

One forward pass (a batch of prefill chunks and decodes) on a TP group of `tp` GPUs takes
  CPU(seqs, tp)                          vLLM's per-iteration CPU work (schedule, prepare,
                                         sample, process outputs, worker communication)
  + emb(tokens) + LM head(sampled)       once per pass; the LM head is a GEMM of vocab/tp
  + layers * ( linear ops(tokens)        QKV, O, gated up, down, norms, RoPE, act, add
               + prefill attention(n, p) per chunk
               + decode attention(B, sum of contexts)
               + 2 all-reduces of tokens x hidden x 2 bytes when tp > 1 )
with every op on one GPU's shard (heads, KV heads, FFN width and vocabulary split `tp` ways).
Attention curves were measured for one head layout (32 query heads, 4 KV heads per GPU) and
are scaled per head: prefill attention by query heads per GPU, KV reads by KV heads per GPU.
KV capacity is the TP group's memory at vLLM's 90 % utilisation after the weights. A KV
transfer between two TP groups runs `tp` shard-to-shard sends in parallel, one per GPU pair,
each over a one-way link at the fitted send/recv efficiency with its fitted per-call cost.

The simulator uses the runtime `PerfModel` fitted over a grid of these step times
(`to_perf_model`), as the roofline model does; `bench/calibration.py` reports how close both
stay to the measured rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from pdserve.perf.engine_memory import kv_capacity_tokens
from pdserve.perf.fit import FitGrid, fit_perf_model
from pdserve.perf.fitted import PerfModel
from pdserve.perf.layer_shape import GEMM_OPS, STREAM_OPS, LayerShape
from pdserve.perf.operators import (
    OperatorModel,
    layer_linear_s,
    op_time_s,
    shipped_operator_model,
)
from pdserve.perf.residuals import Residuals
from pdserve.perf.specs import GpuSpec, ModelSpec, check_dense, check_tp, gpu_spec

FIT_GRID = FitGrid(
    prefill_tokens=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
    prefill_prior=(0, 1024, 4096, 16384),
    decode_batch=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384,
                  448, 512, 640, 768, 896, 1024),  # up to the batch limit (`fit_batches`)
    decode_context_per_seq=(128, 512, 1024, 2048, 4096), knee=True)


@dataclass(frozen=True)
class Calibrated:
    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    ops: OperatorModel = field(default_factory=shipped_operator_model)
    lm_head: bool = True  # False: the profile's own step composition (no logits GEMM)
    residuals: Residuals | None = None  # per-shape corrections on the A100 (the presets
    # set them, `presets.calibrated`; `perf/residuals.py` measures them)

    def __post_init__(self) -> None:
        check_tp(self.model, self.tp)
        check_dense(self.model, "the Vidur model (--backend vidur)")

    @property
    def shape(self) -> LayerShape:
        m = self.model
        return LayerShape(hidden=m.hidden, heads=m.heads, kv_heads=m.kv_heads,
                          head_dim=m.head_dim, ffn=m.ffn, tp=self.tp)

    @property
    def reference(self) -> GpuSpec:
        return gpu_spec(self.ops.reference_gpu)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    @property
    def kv_capacity_tokens(self) -> int:
        return kv_capacity_tokens(self.model, self.gpu, self.tp)

    @property
    def gemm_gpu(self) -> GpuSpec:
        """The GPU as a quantised GEMM sees it: operands of `weight_bits` move at the HBM
        bandwidth (so 16/bits times as many per second) and multiply at the INT8 peak."""
        bits = self.model.weight_bits
        return replace(self.gpu, hbm_gb_s=self.gpu.hbm_gb_s * 16 / bits,
                       tflops=self.gpu.int8_peak_tops)

    # ---- parts of a pass ----
    def all_reduce_s(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        curve = self.ops.all_reduce[self.gpu.interconnect]
        num_bytes = tokens * self.model.hidden * self.model.dtype_bytes
        time = float(curve.all_reduce_s(num_bytes, self.tp, self.gpu.link_gb_s))
        return time * self._link_factor(f"all_reduce_{self.gpu.interconnect}", self.tp,
                                        num_bytes)

    @property
    def corrections(self) -> Residuals | None:
        """The per-shape corrections where they apply at all: on the GPU they were measured
        on (within it, each applies to the shapes and links it measured)."""
        residuals = self.residuals
        return residuals if residuals and self.gpu.name == residuals.reference_gpu else None

    def _link_factor(self, link: str, gpus: int, num_bytes: float) -> float:
        """The per-size correction of a link curve where it was measured: that link, that
        many GPUs (`residuals.py`); 1 elsewhere."""
        corrections = self.corrections
        return 1.0 if corrections is None else float(
            corrections.factor(link, str(gpus), num_bytes))

    def layer_s(self, tokens: int, chunks: list[tuple[int, int]], decodes: int,
                context_tokens: int) -> float:
        """One decoder layer for a batch: linear ops on all tokens, attention per kind."""
        shape, gpu, ops = self.shape, self.gpu, self.ops
        if self.model.quantised:  # W8A8: GEMMs read 8-bit operands at the INT8 peak
            total = float(sum(op_time_s(ops, op, tokens, shape, self.gemm_gpu)
                              for op in GEMM_OPS)
                          + sum(op_time_s(ops, op, tokens, shape, gpu)
                                for op in STREAM_OPS if op != "emb"))
        else:
            total = float(layer_linear_s(ops, tokens, shape, gpu, self.residuals))
        total += 2 * self.all_reduce_s(tokens)
        corrections = self.corrections
        for new, prior in chunks:
            time = float(ops.prefill_attention.time_s(new, prior, shape.q_head_scale,
                                                      shape.kv_bytes_per_token, gpu,
                                                      self.reference))
            if corrections is not None:
                time *= corrections.attention_factor("prefill", new, prior)
            total += time
        if decodes:
            time = float(ops.decode_attention.time_s(decodes, context_tokens,
                                                     shape.kv_bytes_per_token, gpu))
            if corrections is not None:
                time *= corrections.attention_factor("decode", decodes,
                                                        context_tokens / decodes)
            total += time
        return total

    def pass_s(self, chunks: list[tuple[int, int]], decodes: int = 0,
               context_tokens: int = 0) -> float:
        """One forward pass: prefill `chunks` (new, prior tokens) and `decodes` sequences
        holding `context_tokens` in all."""
        tokens = sum(new for new, _ in chunks) + decodes
        seqs = len(chunks) + decodes
        ops, shape, gpu = self.ops, self.shape, self.gpu
        lm_head = (ops.gemm["mlp_up_proj"].time_s(seqs, self.model.hidden,
                                                  self.model.vocab / self.tp, gpu)
                   if self.lm_head else 0.0)
        once = (float(ops.cpu.time_s(seqs, self.tp)) + float(lm_head)
                + float(op_time_s(ops, "emb", tokens, shape, gpu, self.residuals)))
        return once + self.model.layers * self.layer_s(tokens, chunks, decodes, context_tokens)

    def prefill_s(self, new_tokens: int, prior_tokens: int = 0) -> float:
        return self.pass_s([(new_tokens, prior_tokens)])

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return self.pass_s([], batch_size, context_tokens)

    def transfer_s(self, num_bytes: int, calls: int = 1) -> float:
        """KV of `num_bytes` in `calls` calls, split over the `tp` GPU pairs of the groups."""
        curve = self.ops.send_recv["nvlink"]
        if self.gpu.interconnect != "nvlink":  # no PCIe send/recv rows: PCIe's efficiency
            curve = replace(curve, efficiency=self.ops.all_reduce["pcie"].efficiency)
        per_call = num_bytes / calls / self.tp  # each GPU pair sends its shard of a call
        return calls * float(curve.send_s(per_call, self.gpu.link_gb_s)) * self._link_factor(
            f"send_recv_{self.gpu.interconnect}", 2, per_call)

    def to_perf_model(self, max_batch_size: int = 256, size_tables: bool = False) -> PerfModel:
        """Fit the simulator's runtime model to these step times over the range serving uses.
        `size_tables`: with per-size tables (`fit.fit_perf_model`), which the per-shape
        corrections need: without them the closed form fitted to corrected step times
        predicts held-out whole steps worse than the curves alone (fidelity.md)."""
        return fit_perf_model(
            f"{self.model.name}@{self.gpu.name}x{self.tp} (calibrated on A100 profiles)",
            self.prefill_s, self.decode_step_s, self.transfer_s, self.kv_bytes_per_token,
            self.kv_capacity_tokens, FIT_GRID, max_batch_size, size_tables)
