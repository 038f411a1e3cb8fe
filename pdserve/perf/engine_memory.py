"""How much KV cache an engine allocates on a TP group: the one place pdserve computes it.

  KV bytes per GPU = budget - weights - activation peak - runtime - NCCL buffers

per engine, with its own defaults (AIConfigurator 0.12.0's memory model,
`sdk/backends/*_backend.py` and `systems/<gpu>.yaml`, which cite the engines' sources):

  vllm     budget = gpu_memory_utilization x HBM: 0.90 up to vLLM 0.19, 0.92 from 0.22
           (`CacheConfig.gpu_memory_utilization`, vllm/config/cache.py); the activation
           peak is the profile run's, at max_num_batched_tokens (8,192 for the OpenAI
           server on GPUs of 70 GiB or more, 2,048 below: vLLM's EngineArgs defaults)
  sglang   budget = mem_fraction_static x HBM, the fraction SGLang derives from the GPU's
           capacity (ServerArgs._handle_gpu_memory_settings, as AIConfigurator mirrors it:
           `derive_sglang_mem_fraction_static`); it caps weights and the KV pool only, the
           activations, graphs and buffers living in the rest
  trtllm   KV = free_gpu_memory_fraction (0.9) x what is free after weights, activations
           (max_num_tokens 8,192), runtime and NCCL buffers
  vidur    the convention of pdserve's Vidur-calibrated model: 0.90 x HBM - weights (no
           activations, graphs or buffers), kept so that its results stay comparable

  activation peak  2 x tokens x hidden x c(tp) bytes, at least 70 MiB, with
                   AIConfigurator's coefficients for Llama-family models: c = 11, 6.5, 5, 5
                   at TP 1, 2, 4, 8 (vLLM and TensorRT-LLM); SGLang 14, 8.5, 6.5, 6.5, then
                   +15 %, at least 90 MiB
  runtime          3.5 GiB per GPU: CUDA context, cuBLAS/NCCL workspaces and the CUDA-graph
                   pools (AIConfigurator's `other_mem`, raised from 551 MB "for safer
                   deployment"); SGLang +20 %
  NCCL buffers     342 MB at TP 2, 392 MB at TP 4 and 8 (AIConfigurator's `nccl_mem`)
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.perf.specs import GIB, MIB, GpuSpec, ModelSpec

VIDUR_UTILISATION = 0.90  # vLLM's gpu_memory_utilization when Vidur profiled it
RUNTIME_BYTES = int(3.5 * GIB)
NCCL_BYTES = {1: 0, 2: 358612992, 4: 411041792, 8: 411041792}
LLAMA_ACTIVATION = {1: 11.0, 2: 6.5, 4: 5.0, 8: 5.0}
SGLANG_ACTIVATION = {1: 14.0, 2: 8.5, 4: 6.5, 8: 6.5}


@dataclass(frozen=True, slots=True)
class EngineMemory:
    """An engine's memory defaults (see the module docstring for each one's source)."""

    name: str
    fraction: float  # of HBM, or (`of_free`) of what is free after everything else
    of_free: bool = False  # the fraction applies to what is free after everything else
    weights_only: bool = False  # the budget caps weights + KV only (SGLang's static pool)
    batched_tokens: int = 8192
    activation: dict[int, float] | None = None  # c(tp); None: no activations counted
    activation_extra: float = 0.0
    min_activation_bytes: int = 70 * MIB
    runtime_bytes: int = RUNTIME_BYTES
    nccl: bool = True

    def activation_bytes(self, model: ModelSpec, tp: int) -> float:
        if self.activation is None:
            return 0.0
        coeff = self.activation[min(self.activation, key=lambda t: abs(t - tp))]
        peak = 2 * self.batched_tokens * model.heads * model.head_dim * coeff
        return max(peak, self.min_activation_bytes) * (1 + self.activation_extra)

    def kv_bytes(self, model: ModelSpec, gpu: GpuSpec, tp: int) -> float:
        """KV bytes over the whole TP group."""
        others = tp * (self.activation_bytes(model, tp) + self.runtime_bytes
                       + (NCCL_BYTES.get(min(tp, 8), 0) if self.nccl else 0))
        if self.of_free:
            return self.fraction * (tp * gpu.memory_bytes - model.weight_bytes - others)
        budget = tp * gpu.memory_bytes * self.fraction - model.weight_bytes
        return budget if self.weights_only else budget - others


VIDUR_MEMORY = EngineMemory("vidur", VIDUR_UTILISATION, activation=None, runtime_bytes=0,
                            nccl=False)


def sglang_mem_fraction_static(gpu: GpuSpec, tp: int) -> float:
    """SGLang's default mem_fraction_static for a GPU's capacity (AIConfigurator's
    `derive_sglang_mem_fraction_static`, mirroring ServerArgs in SGLang 0.5.16)."""
    capacity_mb = gpu.memory_bytes / MIB
    if capacity_mb < 20 * 1024:
        chunk, graph_bs = 2048, 8
    elif capacity_mb < 35 * 1024:
        chunk, graph_bs = 2048, (24 if tp < 4 else 80)
    elif capacity_mb < 60 * 1024:
        chunk, graph_bs = 4096, (32 if tp < 4 else 160)
    elif capacity_mb < 160 * 1024:
        chunk, graph_bs = 8192, (256 if tp < 4 else 512)
    else:
        chunk, graph_bs = 16384, 512
    reserved = 512 + 1.5 * chunk + tp / 8 * 1024 + graph_bs * 2
    if capacity_mb > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((capacity_mb - reserved) / capacity_mb, 3)


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


def engine_memory(backend: str, gpu: GpuSpec, tp: int) -> EngineMemory:
    """The memory defaults of `backend` ("vllm@0.24.0", "sglang@...", "trtllm@...",
    "vidur") on `gpu` at `tp`."""
    engine, _, version = backend.partition("@")
    large = gpu.memory_bytes >= 70 * GIB
    if engine == "vidur":
        return VIDUR_MEMORY
    if engine == "vllm":
        fraction = 0.92 if version and _version_tuple(version) >= (0, 22) else 0.90
        return EngineMemory(backend, fraction, batched_tokens=8192 if large else 2048,
                            activation=LLAMA_ACTIVATION)
    if engine == "sglang":
        return EngineMemory(backend, sglang_mem_fraction_static(gpu, tp), weights_only=True,
                            activation=SGLANG_ACTIVATION, activation_extra=0.15,
                            min_activation_bytes=90 * MIB,
                            runtime_bytes=int(RUNTIME_BYTES * 1.2))
    if engine == "trtllm":
        return EngineMemory(backend, 0.9, of_free=True, activation=LLAMA_ACTIVATION)
    raise ValueError(f"unknown engine {engine!r} (vllm, sglang, trtllm, vidur)")


def kv_capacity_tokens(model: ModelSpec, gpu: GpuSpec, tp: int,
                       memory: EngineMemory = VIDUR_MEMORY) -> int:
    """KV tokens a TP group of `tp` GPUs holds under `memory`'s allocation."""
    return int(memory.kv_bytes(model, gpu, tp) // model.kv_bytes_per_token)
