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

`perf_model` is calibrated (`calibrated.py`): operator curves fitted to Vidur's measured A100
timings (`pdserve/data/gpu_profiles/`), with the per-shape corrections on the A100's profiled
shapes (`residuals.py`), and the runtime model carries per-size tables (`fitted.py`) so it
keeps what those corrections and the curves' own size steps add (held-out whole steps:
`bench/calibration.py`, docs/results/fidelity.md). `curves_perf_model` is the model before
the corrections and tables (the default until 2026-11-23, kept to compare). Only the A100
is measured; H800, H100, H20 and
RTX 4090D use the same fitted efficiency curves scaled by each GPU's datasheet peaks
(`specs.py`: HBM bandwidth for memory-bound terms, dense 16-bit TFLOP/s for compute-bound
terms, one-way link bandwidth for all-reduce and KV transfer), with launch latencies and
vLLM's CPU overheads kept as measured on the A100 host. `roofline_perf_model` keeps the older
roofline with stated efficiency factors.

A `-w8a8` model (`specs.ModelSpec.weight_bits = 8`) has 8-bit decoder weights: they take
half the memory (more KV fits) and its GEMMs move half the bytes at the GPU's dense INT8
peak (`Calibrated.gemm_gpu`); attention, the KV cache and the LM head stay 16-bit. The
INT8 efficiencies are the 16-bit curves' (no INT8 kernel was profiled).
"""

from __future__ import annotations

from functools import lru_cache

from pdserve.perf.calibrated import Calibrated
from pdserve.perf.fitted import PerfModel
from pdserve.perf.operators import shipped_operator_model
from pdserve.perf.residuals import shipped_residuals
from pdserve.perf.roofline import Roofline
from pdserve.perf.specs import gpu_spec, model_spec

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
    key = (model.lower(), gpu.lower())
    if key in PAPER_SETUPS:
        return PAPER_SETUPS[key]
    weights, memory = model_spec(model).weight_bytes, gpu_spec(gpu).memory_gb * 1e9
    tp = 1
    while weights > 0.6 * tp * memory:
        tp *= 2
    return tp


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


@lru_cache(maxsize=64)
def perf_model(model: str, gpu: str, tp: int | None = None) -> PerfModel:
    """The runtime model for a model x gpu x tp: fitted to the corrected operator model,
    with per-size tables."""
    return calibrated(model, gpu, tp).to_perf_model(size_tables=True)


@lru_cache(maxsize=64)
def curves_perf_model(model: str, gpu: str, tp: int | None = None) -> PerfModel:
    """The runtime model fitted to the curves alone, no size tables (the default before
    2026-11-23): what the reproductions' before/after comparisons ran on."""
    return calibrated(model, gpu, tp, corrected=False).to_perf_model()


@lru_cache(maxsize=64)
def roofline_perf_model(model: str, gpu: str, tp: int | None = None) -> PerfModel:
    """The runtime model fitted to the roofline (uncalibrated efficiency factors)."""
    return roofline(model, gpu, tp).to_perf_model()
