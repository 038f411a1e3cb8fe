"""Operators priced from measured kernel tables: one GPU x one engine version.

Each operator is looked up in its table (`kernel_tables.py`) at the query's shape,
interpolated in log space between the measured shapes (`log_grid.py`). Outside the measured
box, and on a GPU priced by another's tables (`GpuSpec.kernel_tables`: H800 and H20 by the
H100's, L20 and RTX 4090D by the L40S's), the measured figure at the nearest measured point
is scaled by the fitted curves (`operators.py`, Vidur's A100 efficiencies against each GPU's
datasheet peaks):

    time(query, gpu) = table(nearest measured point) * curve(query, gpu)
                                                     / curve(nearest measured point, measured gpu)

so the curves only carry ratios: how a GEMM grows beyond the largest measured token count,
how a compute-bound op scales with TFLOP/s and a memory-bound one with HBM bandwidth (each
shape gets its own mix of the two bounds), and how a link's bandwidth term scales.

  GEMM               table of (n out, k in, m tokens), bf16 or fp8 (an 8-bit GEMM where the
                     GPU has no fp8 table: the bf16 table scaled by the curve at the 8-bit peak)
  prefill attention  per (query heads, KV heads) pair per GPU, one sequence of `length` new
                     tokens; a chunk after `prior` cached tokens costs its share of the causal
                     work of `prior + new` tokens, at least a fresh chunk's time
  decode attention   per pair, `batch` sequences of `length` cached tokens (their mean); never
                     faster than reading the layer's KV from HBM at the datasheet bandwidth.
                     The floor matters on GPUs with a large L2 (L40S 96 MB, RTX PRO 6000
                     128 MB): their tables re-run one layer's KV cache, which stays in L2,
                     and 24 % (L40S) and 13 % (RTX PRO 6000) of their rows over 8 MB of KV
                     read it faster than HBM can deliver (up to 2.8x the L40S's 864 GB/s,
                     up to 67 MB); in a forward pass every other layer's weights and KV pass
                     through L2 between two reads of one layer's KV, so it is read from HBM
  head layouts       between measured query-head counts log-interpolated; the nearest
                     measured KV-head count; another head dim scaled by the curves
  MoE layer          the engine's fused MoE kernel (routing, the routed experts' gate+up,
                     activation and down), table of tokens per (expert shape, TP degree),
                     experts sharded by TP; beyond the measured tokens, and on a derived GPU,
                     scaled by the layer's roofline on the two datasheets (the routed
                     experts' FLOPs at the bf16 peak, or the weights of the experts the
                     tokens reach at HBM bandwidth: a grouped GEMM, not one expert's, so an
                     H20 prices 8,192 tokens 6.7x an H100, as a dense GEMM of that work);
                     a TP degree the engine was not measured at for the shape is refused
  all-reduce         the engine's custom all-reduce under CUDA graphs or NCCL's, whichever is
                     faster at that size (AIConfigurator's own choice in its step estimates)
  send/recv          NCCL's 2-GPU all-gather (each GPU receives half the message)
  elementwise        not measured: bytes moved / (80 % of HBM bandwidth) + 3 us, as
                     AIConfigurator prices norms and activations (its models/llama.py)
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from pdserve.perf.kernel_tables import BackendTables, KernelTables, shipped_tables
from pdserve.perf.layer_shape import PROFILED_HEAD_DIM, PROFILED_Q_HEADS_PER_GPU
from pdserve.perf.log_grid import LogGrid
from pdserve.perf.operators import OperatorModel, shipped_operator_model
from pdserve.perf.specs import GpuSpec, gpu_spec

ELEMENTWISE_BANDWIDTH_SHARE = 0.8  # AIConfigurator's ElementWise(..., 0.8)
ELEMENTWISE_LATENCY_S = 3e-6  # its mem_empirical_constant_latency
KV_DTYPE_BYTES = 2  # the tables' KV cache (16-bit), as pdserve's models store it


def eight_bit(gpu: GpuSpec) -> GpuSpec:
    """The GPU as an 8-bit GEMM sees it: operands move twice as many per byte of
    bandwidth and multiply at the 8-bit peak."""
    return replace(gpu, hbm_gb_s=gpu.hbm_gb_s * 2, tflops=gpu.int8_peak_tops)


@dataclass(frozen=True)
class MeasuredOperators:
    """The operators of one engine version on `gpu`, from the tables of `measured_gpu`."""

    gpu: GpuSpec
    measured_gpu: GpuSpec
    tables: BackendTables
    send_recv: LogGrid
    curves: OperatorModel

    @property
    def name(self) -> str:
        return self.tables.name

    # ---- GEMMs ----
    def gemm_s(self, tokens: float, k: float, n: float, dtype: str = "bf16") -> float:
        grid = self.tables.gemm.get(dtype)
        measured_dtype = dtype
        if grid is None:
            grid, measured_dtype = self.tables.gemm["bf16"], "bf16"
        point = grid.clamp((n, k, tokens))
        curve = self.curves.gemm["mlp_up_proj"]
        target = eight_bit(self.gpu) if dtype != "bf16" else self.gpu
        base = eight_bit(self.measured_gpu) if measured_dtype != "bf16" else self.measured_gpu
        ratio = (curve.time_s(tokens, k, n, target)
                 / curve.time_s(point[2], point[1], point[0], base))
        return grid.at(point) * float(ratio)

    # ---- mixture of experts ----
    def moe_s(self, tokens: float, hidden: int, expert_ffn: int, experts_per_token: int,
              experts: int, tp: int) -> float:
        """The fused MoE layer for `tokens` tokens, experts sharded over `tp` GPUs."""
        grid = self.tables.moe.get((hidden, expert_ffn, experts_per_token, experts, tp))
        if grid is None:
            measured = sorted(key[4] for key in self.tables.moe
                              if key[:4] == (hidden, expert_ffn, experts_per_token, experts))
            raise ValueError(
                f"no measured MoE layer ({experts} experts of {hidden}x{expert_ffn}, "
                f"{experts_per_token} per token) at TP {tp} for {self.name} on "
                f"{self.measured_gpu.name}" + (f"; measured at TP {', '.join(map(str, measured))}"
                                               if measured else "; none measured"))
        point = grid.clamp((tokens,))
        per_expert = 3 * hidden * expert_ffn / tp  # gate, up, down weights on one GPU

        def roofline_s(m: float, gpu: GpuSpec) -> float:
            """The routed experts' work at the datasheet peaks: their FLOPs at the bf16
            peak or the weights of the experts the tokens reach (uniform routing) at HBM
            bandwidth, whichever takes longer."""
            reached = experts * (1 - (1 - experts_per_token / experts) ** max(m, 1.0))
            flops = 2 * m * experts_per_token * per_expert
            weight_bytes = reached * per_expert * 2
            return max(flops / (gpu.tflops * 1e12), weight_bytes / (gpu.hbm_gb_s * 1e9))

        return grid.at(point) * roofline_s(tokens, self.gpu) / roofline_s(point[0],
                                                                          self.measured_gpu)

    # ---- attention ----
    def _head_scale(self, q_heads: float, head_dim: float) -> float:
        return q_heads * head_dim / (PROFILED_Q_HEADS_PER_GPU * PROFILED_HEAD_DIM)

    def prefill_attention_s(self, new: int, prior: int, q_heads: float, kv_heads: float,
                            head_dim: int = 128) -> float:
        """One chunk of `new` tokens after `prior` cached ones, one layer, one GPU's heads."""
        fresh = self._prefill_fresh_s(new, q_heads, kv_heads, head_dim)
        if prior <= 0:
            return fresh
        total = new + prior
        share = new * (new + 2 * prior) / (total * total)
        return max(fresh, share * self._prefill_fresh_s(total, q_heads, kv_heads, head_dim))

    def _prefill_fresh_s(self, tokens: int, q_heads: float, kv_heads: float,
                         head_dim: int) -> float:
        curve = self.curves.prefill_attention
        reference = gpu_spec(self.curves.reference_gpu)
        log_time = 0.0
        for (q, kv), grid, weight in self.tables.context.nearest(q_heads, kv_heads):
            point = grid.clamp((1, tokens))
            query = curve.time_s(tokens, 0, self._head_scale(q_heads, head_dim),
                                 2 * kv_heads * head_dim * 2, self.gpu, reference)
            measured = curve.time_s(point[1], 0, self._head_scale(q, PROFILED_HEAD_DIM),
                                    2 * kv * PROFILED_HEAD_DIM * 2, self.measured_gpu, reference)
            log_time += weight * np.log(grid.at(point) * float(query / measured))
        return float(np.exp(log_time))

    def decode_attention_s(self, batch: int, context_tokens: int, q_heads: float,
                           kv_heads: float, head_dim: int = 128) -> float:
        """`batch` sequences holding `context_tokens` in all, one layer, one GPU's heads."""
        if batch <= 0:
            return 0.0
        curve = self.curves.decode_attention
        length = max(1.0, context_tokens / batch)
        log_time = 0.0
        for (_, kv), grid, weight in self.tables.generation.nearest(q_heads, kv_heads):
            point = grid.clamp((batch, length))
            query = curve.time_s(batch, batch * length, 2 * kv_heads * head_dim * 2, self.gpu)
            measured = curve.time_s(point[0], point[0] * point[1],
                                    2 * kv * PROFILED_HEAD_DIM * 2, self.measured_gpu)
            log_time += weight * np.log(grid.at(point) * float(query / measured))
        kv_bytes = context_tokens * 2 * kv_heads * head_dim * KV_DTYPE_BYTES
        return max(float(np.exp(log_time)), kv_bytes / (self.gpu.hbm_gb_s * 1e9))

    # ---- links ----
    def _link_s(self, grid: LogGrid, coords: tuple[float, ...], curve_s) -> float:
        point = grid.clamp(coords)
        return grid.at(point) * float(curve_s(coords, self.gpu) / curve_s(point, self.measured_gpu))

    def all_reduce_s(self, num_bytes: float, gpus: int) -> float:
        """All-reduce of `num_bytes` over `gpus` GPUs of one node."""
        if gpus <= 1:
            return 0.0
        curve = self.curves.all_reduce[self.gpu.interconnect]

        def priced(coords: tuple[float, ...], gpu: GpuSpec) -> float:
            return float(curve.all_reduce_s(coords[1], int(round(coords[0])), gpu.link_gb_s))

        reduce = self.tables.all_reduce
        kinds = [reduce[k] for k in ("graph", "nccl") if k in reduce]
        return min(self._link_s(grid, (gpus, num_bytes), priced) for grid in kinds)

    def send_s(self, num_bytes: float) -> float:
        """One point-to-point send of `num_bytes` to a GPU of the same node."""
        curve = self.curves.send_recv["nvlink"]
        if self.gpu.interconnect != "nvlink":
            curve = replace(curve, efficiency=self.curves.all_reduce["pcie"].efficiency)

        def priced(coords: tuple[float, ...], gpu: GpuSpec) -> float:
            return float(curve.send_s(coords[0], gpu.link_gb_s))

        return self._link_s(self.send_recv, (max(num_bytes, 1.0),), priced)

    # ---- not measured ----
    def elementwise_s(self, num_bytes: float) -> float:
        return (num_bytes / (self.gpu.hbm_gb_s * 1e9 * ELEMENTWISE_BANDWIDTH_SHARE)
                + ELEMENTWISE_LATENCY_S)


def measured_gpu_of(gpu: GpuSpec) -> str:
    if not gpu.kernel_tables:
        raise ValueError(f"gpu {gpu.name!r} has no measured kernel tables and no measured GPU "
                         "to derive it from (GpuSpec.kernel_tables)")
    return gpu.kernel_tables


def tables_for(gpu: GpuSpec) -> KernelTables:
    return shipped_tables(measured_gpu_of(gpu))


@lru_cache(maxsize=64)
def measured_operators(gpu: str, backend: str | None = None) -> MeasuredOperators:
    """The operators of `backend` (see `KernelTables.resolve_backend`) on `gpu`."""
    spec = gpu_spec(gpu)
    tables = tables_for(spec)
    name = tables.resolve_backend(backend)
    return MeasuredOperators(spec, gpu_spec(measured_gpu_of(spec)), tables.backends[name],
                             tables.send_recv, shipped_operator_model())
