"""Whole-step checks of the calibration on held-out profile rows.

A measured step is composed as Vidur's README describes it: per layer the MLP-file ops for
the batch's tokens plus the attention row, times the layers, plus the embedding, plus vLLM's
CPU overhead, plus 2 all-reduces per layer at TP > 1. Only the models whose per-GPU attention
layout is the profiled one (64 query / 8 KV heads at TP 2: Llama-3-70B, Llama-2-70B,
CodeLlama-34B) are composed without scaling, and a step is held out only when both its MLP row
and its attention row are. CPU overhead and all-reduce come from the measured rows at the
nearest batch size / message size (interpolated; CPU rows start at batch 8, smaller batches
take batch 8's); neither is in a fit's held-out set here, they have their own held-out errors.

Each held-out step is predicted three times: by the operator model (`Calibrated.pass_s`, the
same composition, no LM head as the profile has none), by the runtime `PerfModel` fitted to
it over a grid of operator-model steps, and by that runtime model with per-size tables
(`to_perf_model(size_tables=True)`: what the closed form misses at each decode batch size
and prefill size, read off the operator model). The simulator's default is the corrected
operator model's runtime model with tables. A table in the batch size keeps a decode span
closed form (the batch is fixed within a span); `docs/results/fidelity.md` says what it
measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pdserve.perf.calibrated import Calibrated
from pdserve.perf.calibration_rows import CPU_PARTS
from pdserve.perf.layer_shape import GEMM_OPS, STREAM_OPS
from pdserve.perf.profiles import Table, load_table
from pdserve.perf.residuals import shipped_residuals
from pdserve.perf.specs import gpu_spec, model_spec

COMPOSED_MODELS = {"Meta-Llama-3-70B": "llama-3.1-70b", "Llama-2-70b-hf": "llama-2-70b",
                   "CodeLlama-34b-Instruct-hf": "codellama-34b"}
LAYER_OPS = tuple(op for op in GEMM_OPS + STREAM_OPS if op != "emb")


@dataclass(frozen=True, slots=True)
class StepCase:
    model: str
    kind: str  # "decode" or "prefill"
    tokens: int  # decode batch size, or prefill chunk
    kv_tokens: int  # per decode sequence, or prior tokens of the chunk
    measured_s: float
    operator_s: float
    runtime_s: float
    tabled_s: float  # the runtime model with per-size tables

def measured_cpu_s(batch: int, tp: int) -> float:
    """vLLM's CPU overhead at `batch` from the measured rows (mean over models)."""
    rows = load_table("cpu_overheads")
    rows = rows.where((rows["tp"] > 1) == (tp > 1))
    total = sum(rows[part] for part in CPU_PARTS) * 1e-3
    sizes = np.unique(rows["batch"])
    means = np.array([total[rows["batch"] == size].mean() for size in sizes])
    return float(np.interp(batch, sizes, means))


def measured_all_reduce_s(num_bytes: float, workers: int) -> float:
    rows = load_table("all_reduce")
    rows = rows.where(rows["workers"] == workers)
    order = np.argsort(rows["bytes"])
    return float(np.exp(np.interp(np.log(num_bytes), np.log(rows["bytes"][order]),
                                  np.log(rows["ms"][order] * 1e-3))))


def measured_step_s(mlp_row: Table, attention_s: float, layers: int, hidden: int, tp: int,
                    seqs: int) -> float:
    tokens = float(mlp_row["tokens"][0])
    per_layer = sum(float(mlp_row[op][0]) for op in LAYER_OPS) * 1e-3 + attention_s
    if tp > 1:
        per_layer += 2 * measured_all_reduce_s(tokens * hidden * 2, tp)
    return layers * per_layer + float(mlp_row["emb"][0]) * 1e-3 + measured_cpu_s(seqs, tp)


@lru_cache(maxsize=2)
def held_out_steps(corrected: bool = False) -> tuple[StepCase, ...]:
    """`corrected`: the operator model with the per-shape corrections (`residuals.py`)."""
    mlp, attention = load_table("mlp"), load_table("attention_70b_tp2")
    attention = attention.where(attention.held_out)
    gpu = gpu_spec("a100")
    cases: list[StepCase] = []
    for profiled, name in COMPOSED_MODELS.items():
        spec = model_spec(name)
        model = Calibrated(spec, gpu, 2, lm_head=False,
                           residuals=shipped_residuals() if corrected else None)
        runtime = model.to_perf_model()
        tabled = model.to_perf_model(size_tables=True)
        rows = mlp.where((mlp["model"] == profiled) & (mlp["tp"] == 2) & mlp.held_out)
        for index in range(len(rows)):
            row = rows.where(np.arange(len(rows)) == index)
            tokens = int(row["tokens"][0])
            decode = attention.where((attention["prefill"] == 0) & (attention["batch"] == tokens))
            for kv, seconds in zip(decode["kv_tokens"], decode["with_reshape_ms"] * 1e-3,
                                   strict=True):
                context = tokens * int(kv)
                cases.append(StepCase(
                    name, "decode", tokens, int(kv),
                    measured_step_s(row, seconds, spec.layers, spec.hidden, 2, tokens),
                    model.decode_step_s(tokens, context),
                    runtime.batch_time_s(tokens, context, 0, 0),
                    tabled.batch_time_s(tokens, context, 0, 0)))
            prefill = attention.where((attention["prefill"] == 1) & (attention["chunk"] == tokens))
            for prior, seconds in zip(prefill["kv_tokens"], prefill["with_reshape_ms"] * 1e-3,
                                      strict=True):
                prior = int(prior)
                units = tokens * (tokens + 2 * prior)
                cases.append(StepCase(
                    name, "prefill", tokens, prior,
                    measured_step_s(row, seconds, spec.layers, spec.hidden, 2, 1),
                    model.prefill_s(tokens, prior), runtime.batch_time_s(0, 0, tokens, units),
                    tabled.batch_time_s(0, 0, tokens, units)))
    return tuple(cases)


def step_errors_pct(cases: tuple[StepCase, ...], kind: str, which: str) -> np.ndarray:
    """Absolute relative errors (%) of `which` ("operator", "runtime" or "tabled") on `kind`
    steps."""
    chosen = [c for c in cases if c.kind == kind]
    predicted = np.array([getattr(c, f"{which}_s") for c in chosen])
    measured = np.array([c.measured_s for c in chosen])
    return np.abs(predicted - measured) / measured * 100
