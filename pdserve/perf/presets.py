"""The papers' hardware setups as ready-made performance models.

| model                       | gpu       | tp | paper                                  |
|-----------------------------|-----------|----|----------------------------------------|
| llama-3.1-8b                | h800      | 1  | Arrow (8 x H800, one GPU per instance) |
| llama-3.1-8b                | a100      | 1  | FlowKV                                 |
| llama-3.1-70b               | a100      | 4  | FlowKV (tp not stated, see below)      |
| deepseek-r1-distill-qwen-7b | rtx-4090d | 1  | ARES (one 4090D per instance)          |
| deepseek-r1-distill-qwen-7b-w8a8 | rtx-4090d | 1 | ARES as run (W8A8: sec. 6.1)     |
| qwen2.5-14b                 | a100      | 1  | TaiChi                                 |
| qwen2.5-32b                 | a100      | 2  | TaiChi (tp not stated, see below)      |
| llama-3.1-70b               | h20       | 4  | AMPD (its planner also tries 2 and 8)  |
| qwen3-32b                   | h20       | 2  | AMPD (its planner also tries 4 and 8)  |

Where a paper does not state the degree, it is the smallest power of two that leaves room
for KV after the weights (70B: 141 GB of weights; 32B: 65 GB).

Any other model x gpu pair works too; its tp defaults to the smallest power of two whose
weights take at most 60 % of the instance's memory. `tp` is per instance: `tp=8` is one vLLM
instance over 8 GPUs (compute split 8 ways, 2 all-reduces per layer, the 8 GPUs' memory for
weights and KV).

`perf_model(model, gpu, tp, backend)` prices a step from one of two sources (fitted to decode
batches up to 256, or up to `max_batch_size` where that is higher):

  measured  (`backend` "vllm", "sglang" or "trtllm", optionally "@version": `measured.py`)
            kernel timings AIConfigurator 0.12.0 measured for that engine version on that GPU
            (`kernel_tables.py`), interpolated between measured shapes, today's host
            overhead (`host_overhead.py`) and the engine's memory defaults for the KV
            capacity (`engine_memory.py`); a bare engine name takes its newest measured
            version, no name the newest vLLM
  vidur     (`backend` "vidur") the Vidur-calibrated model (`calibrated.py`): operator
            curves fitted to Vidur's A100 profiles of 2024 vLLM (v0), per-shape
            corrections on the A100's profiled shapes, 2023 vLLM's host overhead, KV at
            90 % memory less the weights; other GPUs scaled by datasheet peaks. The
            convention of papers simulated on Vidur, and of pdserve's results before the
            measured source

`DEFAULT_BACKEND` is the source with no `backend` given.

GPUs and the tables that price them:

  a100        measured (a100_sxm: vLLM 0.14.0, SGLang 0.5.10, TRT-LLM 1.0.0)
  h100, h200, b200, b300, gb200, gb300, l40s, rtx-pro-6000
              measured (vLLM 0.24.0, SGLang 0.5.14, TRT-LLM 1.3.0rc20; l40s's vLLM
              all-reduce from 0.22.0)
  h800        the H100's: H100 compute and HBM; links (all-reduce, send/recv) scaled to
              200 GB/s each way (NVLink 400 GB/s two-way, Arrow sec. 7.1)
  h20         the H100's, Hopper: each op scaled per bound, compute by 148/989 TFLOP/s,
              memory by 4.0/3.35 TB/s, links equal (NVIDIA H20 brief)
  l20         the L40S's, Ada: compute 119.5/362 TFLOP/s, memory 864/864 GB/s, PCIe 4.0
              both (NVIDIA L20 brief)
  rtx-4090d   the L40S's, Ada: compute 147.1/362 TFLOP/s, 8-bit 588/733 TOP/s, memory
              1,008/864 GB/s, PCIe 4.0 both (Ada whitepaper: 114 of the 4090's 128 SMs)

Scaling per bound: a derived GPU's op takes the measured GPU's time times the ratio of the
fitted curves (Vidur's A100 efficiencies) on the two datasheets, so a compute-bound GEMM
scales with TFLOP/s, a memory-bound one with bandwidth, and each shape gets its own mix
(`measured_ops.py`).

A mixture of experts (`specs.ModelSpec.experts`: qwen3-30b-a3b, qwen3-235b-a22b,
qwen3-coder-480b-a35b, mixtral-8x7b, mixtral-8x22b) is priced on the measured backends
only: the engine's fused MoE layer from its table at the model's expert shape and the TP
degree (experts sharded by TP, the engines' default; a degree not measured for the shape
is refused, e.g. vLLM 0.24.0 on the B200 measured Qwen3-30B-A3B's experts at TP 1 and 2),
plus the router's GEMM; the Vidur model and the roofline have no MoE layer and refuse it.
Within 0.2-3 % of AIConfigurator's own decode steps for the same shapes
(docs/results/fidelity.md).

A `-w8a8` model (`specs.ModelSpec.weight_bits = 8`) has 8-bit decoder weights: they take
half the memory (more KV fits). From the measured tables its GEMMs are the fp8 tables
(W8A8 FP8; on Ada, whose INT8 and FP8 peaks are equal, they stand for ARES's INT8 W8A8);
the A100 has no fp8 table, so there the bf16 table is scaled by the curves to the INT8 peak.
In the Vidur model its GEMMs move half the bytes at the GPU's dense INT8 peak
(`Calibrated.gemm_gpu`). Attention, the KV cache and the LM head stay 16-bit.

`curves_perf_model` is the Vidur model before the corrections and tables (the default until
2026-11-23, kept to compare); `roofline_perf_model` the older roofline with stated
efficiency factors.
"""

from __future__ import annotations

from functools import lru_cache

from pdserve.perf.calibrated import Calibrated
from pdserve.perf.engine_memory import engine_memory
from pdserve.perf.fit import FIT_MIN_BATCHES, fit_batches
from pdserve.perf.fitted import PerfModel
from pdserve.perf.host_overhead import DEFAULT_HOST_OVERHEAD, host_overhead
from pdserve.perf.measured import Measured
from pdserve.perf.measured_ops import measured_operators
from pdserve.perf.operators import shipped_operator_model
from pdserve.perf.residuals import shipped_residuals
from pdserve.perf.roofline import Roofline
from pdserve.perf.specs import ModelSpec, check_tp, gpu_spec, model_spec

PAPER_SETUPS: dict[tuple[str, str], int] = {
    ("llama-3.1-8b", "h800"): 1,
    ("llama-3.1-8b", "a100"): 1,
    ("llama-3.1-70b", "a100"): 4,
    ("deepseek-r1-distill-qwen-7b", "rtx-4090d"): 1,
    ("deepseek-r1-distill-qwen-7b-w8a8", "rtx-4090d"): 1,
    ("qwen2.5-14b", "a100"): 1,
    ("qwen2.5-32b", "a100"): 2,
    ("llama-3.1-70b", "h20"): 4,
    ("qwen3-32b", "h20"): 2,
}


def default_tp(model: str, gpu: str) -> int:
    """The paper's degree for its setup; else the smallest power of two whose weights take
    at most 60 % of the instance's memory, or, where the model's heads allow none such,
    the largest they allow if the weights take at most 90 % of it (Qwen3-235B-A22B on
    H200s: its 4 KV heads allow TP 4, where the weights take 81 %)."""
    key = (model.lower(), gpu.lower())
    if key in PAPER_SETUPS:
        return PAPER_SETUPS[key]
    spec, memory = model_spec(model), gpu_spec(gpu).memory_bytes
    tp = 1
    while spec.weight_bytes > 0.6 * tp * memory:
        tp *= 2
    try:
        check_tp(spec, tp)
    except ValueError:
        allowed = max(t for t in (1, 2, 4, 8) if t <= tp and _divides(spec, t))
        if spec.weight_bytes > 0.9 * allowed * memory:
            raise ValueError(
                f"{spec.name}'s {spec.weight_bytes / 1e9:.0f} GB of weights do not fit "
                f"{allowed} x {gpu} with room for KV, and its {spec.heads} heads / "
                f"{spec.kv_heads} KV heads allow no larger instance: choose a GPU with more "
                f"memory") from None
        return allowed
    return tp


def _divides(spec: ModelSpec, tp: int) -> bool:
    try:
        check_tp(spec, tp)
    except ValueError:
        return False
    return True


def roofline(model: str, gpu: str, tp: int | None = None) -> Roofline:
    return Roofline(model_spec(model), gpu_spec(gpu), tp or default_tp(model, gpu))


def calibrated(model: str, gpu: str, tp: int | None = None,
               corrected: bool = True) -> Calibrated:
    """The operator model; `corrected`: with the per-shape corrections (they apply on the
    A100's profiled shapes only, `residuals.py`; not even loaded for another GPU)."""
    spec = gpu_spec(gpu)
    measured_here = spec.name == shipped_operator_model().reference_gpu
    return Calibrated(model_spec(model), spec, tp or default_tp(model, gpu),
                      residuals=shipped_residuals() if corrected and measured_here else None)


VIDUR = "vidur"  # the Vidur-calibrated source's name, wherever a backend is named
DEFAULT_BACKEND = "vllm"  # the newest vLLM measured for the GPU (vidur until 2026-11-24)


def measured(model: str, gpu: str, tp: int | None = None, backend: str | None = None,
             host: str = DEFAULT_HOST_OVERHEAD) -> Measured:
    """The measured-kernel step model of `backend` (an engine, optionally @version; None:
    the newest vLLM measured) on `gpu`."""
    ops = measured_operators(gpu.lower(), backend)
    degree = tp or default_tp(model, gpu)
    return Measured(model_spec(model), degree, ops, host_overhead(host),
                    engine_memory(ops.name, ops.gpu, degree))


def perf_model(model: str, gpu: str, tp: int | None = None, backend: str | None = None,
               host_overhead: str = DEFAULT_HOST_OVERHEAD,
               max_batch_size: int = FIT_MIN_BATCHES) -> PerfModel:
    """The runtime model for a model x gpu x tp on `backend` ("vllm", "sglang", "trtllm",
    each optionally "@version", or "vidur"; None: `DEFAULT_BACKEND`), fitted with per-size
    tables. `host_overhead` ("engine", "vllm-v0", "none") applies to the measured source;
    the Vidur model keeps 2023 vLLM's. `max_batch_size`: the instances' batch limit; the
    fit covers decode batches up to it (at least `fit.FIT_MIN_BATCHES`: a lower limit
    keeps that model)."""
    return _perf_model(model, gpu, tp, backend, host_overhead, fit_batches(max_batch_size))


@lru_cache(maxsize=64)
def _perf_model(model: str, gpu: str, tp: int | None, backend: str | None, host_overhead: str,
                batches: int) -> PerfModel:
    source = (backend or DEFAULT_BACKEND).lower()
    if source == VIDUR:
        return calibrated(model, gpu, tp).to_perf_model(batches, size_tables=True)
    return measured(model, gpu, tp, source, host_overhead).to_perf_model(batches)


@lru_cache(maxsize=64)
def curves_perf_model(model: str, gpu: str, tp: int | None = None) -> PerfModel:
    """The runtime model fitted to the curves alone, no size tables (the default before
    2026-11-23): what the reproductions' before/after comparisons ran on."""
    return calibrated(model, gpu, tp, corrected=False).to_perf_model()


@lru_cache(maxsize=64)
def roofline_perf_model(model: str, gpu: str, tp: int | None = None) -> PerfModel:
    """The runtime model fitted to the roofline (uncalibrated efficiency factors)."""
    return roofline(model, gpu, tp).to_perf_model()
