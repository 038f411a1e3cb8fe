"""Roofline performance model: a model spec x a GPU spec x a tensor-parallel degree.

A forward pass takes max(compute time, memory time) + TP all-reduce time + a fixed overhead:
  compute  = FLOPs / (tp * tflops * COMPUTE_EFFICIENCY)
  memory   = (weights + KV read and written) / (tp * HBM bandwidth * MEMORY_EFFICIENCY)
  FLOPs    = 2 * layers * (layer params * tokens + heads * head_dim * attn_units)
             + 2 * vocab * hidden per sampled token
  all-reduce (tp > 1): 2 per layer, ring, 2(tp-1)/tp * tokens * hidden * dtype bytes / link
KV capacity = (tp * memory * 0.90 - weights) / KV bytes per token (`engine_memory.VIDUR_MEMORY`).

Efficiency factors (stated, not fitted; change them here):
  COMPUTE_EFFICIENCY 0.55  prefill model-FLOPs utilisation that vLLM/Sarathi report on
                           Hopper/Ampere for 7-70B models is about 50-60 %
  MEMORY_EFFICIENCY 0.80   achievable fraction of HBM bandwidth in decode GEMV kernels
  LINK_EFFICIENCY 0.70     achievable fraction of NVLink/PCIe bandwidth for NCCL transfers
  STEP_OVERHEAD_S 0.002    per-forward scheduling, sampling and launch cost
  TRANSFER_CALL_S 0.0005   fixed cost of one KV transfer call (NCCL send setup and sync)
  0.90 memory utilisation  vLLM's default gpu_memory_utilization (`engine_memory.py`)
`link_gb_s` is one-way (`specs.py`). The calibrated model (`calibrated.py`) is the default for
presets; this one stays for comparison and for GPUs' what-ifs without measured curves.

The simulator uses the linear `PerfModel` fitted to samples of this model (`to_perf_model`),
so that decode spans stay closed-form; the fit's R^2 says how much the max() costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.perf.engine_memory import kv_capacity_tokens
from pdserve.perf.fit import FitGrid, fit_perf_model
from pdserve.perf.fitted import PerfModel
from pdserve.perf.specs import GpuSpec, ModelSpec, check_dense, check_tp
from pdserve.types import attn_units

COMPUTE_EFFICIENCY = 0.55
MEMORY_EFFICIENCY = 0.80
LINK_EFFICIENCY = 0.70
STEP_OVERHEAD_S = 0.002
TRANSFER_CALL_S = 0.0005
ALLREDUCE_LATENCY_S = 10e-6


FIT_GRID = FitGrid(prefill_tokens=(16, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
                   prefill_prior=(0, 1024, 4096, 16384),
                   decode_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
                   decode_context_per_seq=(128, 512, 1024, 2048, 4096))


@dataclass(frozen=True, slots=True)
class Roofline:
    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1

    def __post_init__(self) -> None:
        check_tp(self.model, self.tp)
        check_dense(self.model, "the roofline model")

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    @property
    def kv_capacity_tokens(self) -> int:
        return kv_capacity_tokens(self.model, self.gpu, self.tp)

    def _forward_s(self, tokens: int, sampled: int, units: int, kv_bytes: float) -> float:
        m = self.model
        flops = (2 * m.layers * (m.layer_params * tokens + m.heads * m.head_dim * units)
                 + 2 * m.vocab * m.hidden * sampled)
        compute = flops / (self.tp * self.gpu.tflops * 1e12 * COMPUTE_EFFICIENCY)
        memory = (m.weight_bytes + kv_bytes) / (self.tp * self.gpu.hbm_gb_s * 1e9
                                                * MEMORY_EFFICIENCY)
        allreduce = 0.0
        if self.tp > 1:
            volume = 2 * (self.tp - 1) / self.tp * tokens * m.hidden * m.dtype_bytes
            per_call = ALLREDUCE_LATENCY_S + volume / (self.gpu.link_gb_s * 1e9 * LINK_EFFICIENCY)
            allreduce = 2 * m.layers * per_call
        return max(compute, memory) + allreduce + STEP_OVERHEAD_S

    def prefill_s(self, new_tokens: int, prior_tokens: int = 0) -> float:
        kv = (new_tokens + prior_tokens) * self.kv_bytes_per_token  # read prior, write new
        return self._forward_s(new_tokens, 1, attn_units(new_tokens, prior_tokens), kv)

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        # each decode token attends over its context: 2 matmuls over context per head,
        # i.e. attn_units of 2*context in the n*(n+2p) convention with n=1
        return self._forward_s(batch_size, batch_size, 2 * context_tokens,
                               context_tokens * self.kv_bytes_per_token)

    def transfer_s(self, num_bytes: int, calls: int = 1) -> float:
        return calls * TRANSFER_CALL_S + num_bytes / (self.gpu.link_gb_s * 1e9 * LINK_EFFICIENCY)

    def to_perf_model(self, max_batch_size: int = 256) -> PerfModel:
        """Fit the simulator's linear model to this roofline over the range serving uses."""
        return fit_perf_model(f"{self.model.name}@{self.gpu.name}x{self.tp} (roofline fit)",
                              self.prefill_s, self.decode_step_s, self.transfer_s,
                              self.kv_bytes_per_token, self.kv_capacity_tokens, FIT_GRID,
                              max_batch_size)
