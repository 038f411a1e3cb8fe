"""Calibration of the performance model against Vidur's measured A100 rows.

Prints (1) each operator curve's error on the held-out rows, alone and with the
per-shape corrections (`perf/residuals.py`; on by default since 2026-11-23), (2) whole-step
error on held-out steps (composed as Vidur's README says: per-layer op rows x layers +
embedding + CPU overhead + all-reduces), for the operator model and for the runtime
PerfModel fitted to it, with and without per-size tables (the simulator's default: the
corrected operator model, runtime model with tables),
(3) a leave-one-model-out check of the GEMM curves (how well an unprofiled shape is priced),
(4) Llama-3.1-8B and Qwen2.5-14B on A100 next to measured rows, (5) tensor parallelism and the
TaiChi Fig. 4 decode step. Refits the curves first (needs scipy), so the figures are what the
current code fits.

Then the measured-kernel model (`perf/measured.py`, the `--backend vllm|sglang|trtllm`
source): (6) per GPU and engine version, the held-out error of each table family (every 5th
interior row of each size series kept out, `perf/measured_heldout.py`), all rows and the rows
of 50 us or more (the kernels that make up most of a step); `--json FILE` writes it as
{gpu: {engine: {family: {"median_pct", "p90_pct", "rows", ...}}}}; (7) whole prefill and
decode steps of the measured operator model (no host overhead, as AIConfigurator counts
none) next to AIConfigurator's own step estimates for the same shapes (needs the `aic`
extra; skipped with a message without it).

    python bench/calibration.py [--json FILE] [--measured-only]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np

from pdserve.perf import calibrate, calibration_rows, residual_fit
from pdserve.perf.heldout import (
    LAYER_OPS,
    held_out_steps,
    measured_cpu_s,
    step_errors_pct,
)
from pdserve.perf.layer_shape import GEMM_OPS
from pdserve.perf.operators import shipped_operator_model
from pdserve.perf.presets import calibrated, curves_perf_model, perf_model, roofline_perf_model
from pdserve.perf.profiles import load_table
from pdserve.perf.residuals import shipped_residuals
from pdserve.perf.specs import gpu_spec


def stats(errors: np.ndarray) -> str:
    return (f"median {np.median(errors):4.1f} %, P90 {np.percentile(errors, 90):4.1f} %, "
            f"max {errors.max():5.1f} % ({len(errors)} rows)")


def operators() -> None:
    refit = calibrate.fit_operator_model()
    shipped = shipped_operator_model()
    print("== per operator, held-out rows (every 5th row of each file, in no fit) ==")
    for name, error in refit.held_out.items():
        print(f"{name:26s} median {error.median_pct:4.1f} %, P90 {error.p90_pct:5.1f} % "
              f"({error.rows} rows)")
    same = refit.to_json() == shipped.to_json()
    print(f"shipped a100_operators.json equals this refit: {same}")
    residuals = residual_fit.fit_operator_residuals(refit)
    print("\n== per operator, held-out rows, curves + per-shape corrections (perf/residuals.py; "
          "the A100's profiled shapes only; the default) ==")
    for name, error in residual_fit.held_out_errors_corrected(refit, residuals).items():
        print(f"{name:26s} median {error.median_pct:4.1f} %, P90 {error.p90_pct:5.1f} % "
              f"({error.rows} rows)")
    same = residuals.to_json() == shipped_residuals().to_json()
    print(f"shipped a100_residuals.json equals this refit: {same}")


def steps() -> None:
    for corrected in (False, True):
        cases = held_out_steps(corrected)
        which_model = ("the curves + per-shape corrections (the default)"
                       if corrected else "the curves alone (the default until 2026-11-23)")
        print(f"\n== per step, held-out steps (Llama-3-70B, Llama-2-70B, CodeLlama-34B at "
              f"TP 2), {which_model} ==")
        for kind in ("decode", "prefill"):
            for which, label in (("operator", "operator model"),
                                 ("runtime", "runtime PerfModel"),
                                 ("tabled", "runtime PerfModel + size tables")):
                if corrected and which == "tabled":
                    label += " (simulator)"
                print(f"{kind:7s} step, {label:33s}: "
                      f"{stats(step_errors_pct(cases, kind, which))}")


def leave_one_model_out() -> None:
    mlp = load_table("mlp")
    gpu = gpu_spec("a100")
    print("\n== GEMM curves refitted without Llama-3-8B, error on all its rows ==")
    for op in GEMM_OPS:
        train = mlp.where((mlp["model"] != "Meta-Llama-3-8B") & ~mlp.held_out)
        test = mlp.where(mlp["model"] == "Meta-Llama-3-8B")
        curve = calibrate.fit_gemm(train, op, gpu)
        shape = calibration_rows.mlp_shape(test)
        predicted = curve.time_s(test["tokens"], *shape.gemm_dims(op), gpu)
        errors = np.abs(predicted - test[op] * 1e-3) / (test[op] * 1e-3) * 100
        print(f"{op:15s} {stats(errors)}")


def measured_llama3_8b(tokens: int, attention_ms: float, seqs: int) -> float:
    """Measured A100 step of Llama-3-8B at TP 1 (32 layers): mean of its MLP rows at
    `tokens`, plus an attention row, the embedding and the measured CPU overhead."""
    mlp = load_table("mlp")
    rows = mlp.where((mlp["model"] == "Meta-Llama-3-8B") & (mlp["tp"] == 1)
                     & (mlp["tokens"] == tokens))
    per_layer_ms = sum(float(rows[op].mean()) for op in LAYER_OPS) + attention_ms
    return (32 * per_layer_ms + float(rows["emb"].mean())) * 1e-3 + measured_cpu_s(seqs, 1)


def attention_ms(prefill: int, batch_or_chunk: int, kv_tokens: int) -> float:
    table = load_table("attention_70b_tp2")
    key = "chunk" if prefill else "batch"
    rows = table.where((table["prefill"] == prefill) & (table[key] == batch_or_chunk)
                       & (table["kv_tokens"] == kv_tokens))
    return float(rows["with_reshape_ms"].mean())


def models_on_a100() -> None:
    print("\n== on A100, TP 1: model next to measured rows ==")
    print("measured = Llama-3-8B MLP rows x 32 layers + attention rows + emb + CPU rows; "
          "decode attention uses the row with the same KV bytes per layer (8 KV heads x 1024 "
          "tokens = the profiled 4 KV heads x 2048). 'operator' prices the same composition; "
          "'runtime' is the simulator's PerfModel (adds the LM head GEMM); 'curves' the one "
          "before 2026-11-23 (no corrections, no size tables). (%) = error in time.")
    llama = calibrated("llama-3.1-8b", "a100", 1)
    same_composition = replace(llama, lm_head=False)
    runtime = perf_model("llama-3.1-8b", "a100", 1)
    curves = curves_perf_model("llama-3.1-8b", "a100", 1)
    for chunk in (512, 1024, 2048, 4096):
        measured = measured_llama3_8b(chunk, attention_ms(1, chunk, 0), 1)
        operator = same_composition.prefill_s(chunk)
        simulated = runtime.batch_time_s(0, 0, chunk, chunk * chunk)
        before = curves.batch_time_s(0, 0, chunk, chunk * chunk)
        print(f"llama-3.1-8b prefill {chunk:4d} tokens: measured {chunk / measured:7,.0f} tok/s"
              f" | operator {chunk / operator:7,.0f} tok/s ({operator / measured - 1:+5.1%})"
              f" | runtime {chunk / simulated:7,.0f} tok/s ({simulated / measured - 1:+5.1%})"
              f" | curves {chunk / before:7,.0f} tok/s ({before / measured - 1:+5.1%})")
    for batch in (1, 16, 64, 128):
        measured = measured_llama3_8b(batch, attention_ms(0, batch, 2048), batch)
        operator = same_composition.decode_step_s(batch, batch * 1024)
        simulated = runtime.batch_time_s(batch, batch * 1024, 0, 0)
        before = curves.batch_time_s(batch, batch * 1024, 0, 0)
        print(f"llama-3.1-8b decode B={batch:3d} x 1024 ctx: measured {measured * 1e3:5.1f} ms"
              f" | operator {operator * 1e3:5.1f} ms ({operator / measured - 1:+5.1%})"
              f" | runtime {simulated * 1e3:5.1f} ms ({simulated / measured - 1:+5.1%})"
              f" | curves {before * 1e3:5.1f} ms ({before / measured - 1:+5.1%})")
    runtime = perf_model("qwen2.5-14b", "a100", 1)
    print("qwen2.5-14b: no measured rows for its shape (hidden 5120, 40/8 heads, FFN 13824); "
          "priced from the shape-general curves (see the leave-one-model-out check)")
    for chunk in (512, 1024, 2048, 4096):
        simulated = runtime.batch_time_s(0, 0, chunk, chunk * chunk)
        print(f"qwen2.5-14b prefill {chunk:4d} tokens: runtime {chunk / simulated:7,.0f} tok/s")
    for batch in (1, 16, 64, 128):
        simulated = runtime.batch_time_s(batch, batch * 1024, 0, 0)
        print(f"qwen2.5-14b decode B={batch:3d} x 1024 ctx: runtime {simulated * 1e3:5.1f} ms")


def tensor_parallel() -> None:
    print("\n== tensor parallelism (per instance) ==")
    for tp in (1, 2, 4, 8):
        model = calibrated("llama-3.1-8b", "h800", tp)
        print(f"llama-3.1-8b@h800 tp={tp}: decode B=256 x 1024 "
              f"{model.decode_step_s(256, 256 * 1024) * 1e3:5.1f} ms, prefill 2048 "
              f"{model.prefill_s(2048) * 1e3:6.1f} ms, all-reduce of 2048 tokens "
              f"{model.all_reduce_s(2048) * 1e6:5.0f} us, KV capacity "
              f"{model.kv_capacity_tokens:,} tokens")
    model = calibrated("llama-3.1-70b", "a100", 4)
    roofline = roofline_perf_model("llama-3.1-70b", "a100", 4)
    for batch in (1, 16, 32, 64):
        print(f"llama-3.1-70b@a100 tp=4 decode B={batch:2d} x 1024 ctx: calibrated "
              f"{model.decode_step_s(batch, batch * 1024) * 1e3:5.1f} ms, roofline "
              f"{roofline.decode.step_s(batch, batch * 1024) * 1e3:5.1f} ms "
              "(TaiChi Fig. 4: about 44 ms)")


def measured_held_out(json_path: str | None) -> None:
    from pdserve.perf.kernel_tables import measured_gpus, shipped_tables
    from pdserve.perf.measured_heldout import adjacent_gemm_spread, held_out_errors

    print("\n== measured kernel tables: held-out error per family (every 5th interior row of "
          "each size series in no table), median / P90 %, all rows | rows >= 50 us ==")
    report: dict[str, dict[str, dict]] = {}
    for gpu in measured_gpus():
        for backend in shipped_tables(gpu).names:
            errors = held_out_errors(gpu, backend)
            large = held_out_errors(gpu, backend, min_seconds=50e-6)
            engine, _, version = backend.partition("@")
            entry = report.setdefault(gpu, {}).setdefault(engine, {"version": version})
            cells = []
            for family, error in errors.items():
                big = large.get(family)
                entry[family] = {"median_pct": error.median_pct, "p90_pct": error.p90_pct,
                                 "rows": error.rows}
                if big is not None:
                    entry[family] |= {"median_pct_50us": big.median_pct,
                                      "p90_pct_50us": big.p90_pct, "rows_50us": big.rows}
                cells.append(f"{family} {error.median_pct:4.1f}/{error.p90_pct:4.1f}"
                             + (f" | {big.median_pct:4.1f}/{big.p90_pct:4.1f}" if big else ""))
            for dtype in ("bf16", "fp8"):  # the tables' own resolution between sizes
                spread = adjacent_gemm_spread(gpu, backend, dtype)
                if spread is not None:
                    entry[f"gemm_{dtype}_adjacent_tokens"] = {
                        "median_pct": spread.median_pct, "p90_pct": spread.p90_pct,
                        "rows": spread.rows}
                    cells.append(f"GEMM {dtype} m vs m+1 {spread.median_pct:4.1f}/"
                                 f"{spread.p90_pct:4.1f}")
            print(f"{gpu:13s} {backend:17s} " + "; ".join(cells))
    if json_path:
        with open(json_path, "w") as handle:
            json.dump(report, handle, indent=1, sort_keys=True)
        print(f"wrote {json_path}")


AIC_MODELS = {"llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
              "llama-3.1-70b": "meta-llama/Meta-Llama-3.1-70B", "qwen3-32b": "Qwen/Qwen3-32B",
              "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "qwen3-235b-a22b": "Qwen/Qwen3-235B-A22B",
              # shipped in its model_configs/ but not among its default models: read from a
              # folder holding that config.json (AIC would otherwise fetch it)
              "mixtral-8x7b": "model_configs/mistralai--Mixtral-8x7B-v0.1_config.json",
              "mixtral-8x22b": "model_configs/mistralai--Mixtral-8x22B-v0.1_config.json",
              "qwen3-coder-480b-a35b": "Qwen/Qwen3-Coder-480B-A35B-Instruct"}
STEP_CASES = (("llama-3.1-8b", 1), ("llama-3.1-8b", 2), ("llama-3.1-70b", 4), ("qwen3-32b", 2))
MOE_STEP_CASES = (("qwen3-30b-a3b", 1), ("qwen3-30b-a3b", 2), ("mixtral-8x7b", 2),
                  ("qwen3-235b-a22b", 4), ("mixtral-8x22b", 4), ("qwen3-coder-480b-a35b", 8))


def aic_model_path(model: str, folder: str) -> str:
    """AIC's model path for `model`; a config shipped in its package is copied into
    `folder`/<model>/config.json, which AIC reads as a local checkpoint's."""
    path = AIC_MODELS[model]
    if not path.startswith("model_configs/"):
        return path
    from importlib import resources
    from pathlib import Path
    target = Path(folder) / model
    target.mkdir(parents=True, exist_ok=True)
    source = resources.files("aiconfigurator_core").joinpath(path)
    (target / "config.json").write_text(source.read_text())
    return str(target)
STEP_GPUS = ("a100", "h100", "h200", "b200", "l40s")


def aic_steps() -> None:
    print("\n== whole steps: measured operator model (host overhead none) vs AIConfigurator "
          "0.12.0's own estimate (vLLM, same shapes; MoE models with experts sharded by TP, "
          "as vLLM runs them by default) ==")
    try:
        from aiconfigurator_core.sdk.engine import EngineHandle
    except ImportError:
        print("skipped: aiconfigurator-core is not installed (pip install -e .[aic])")
        return
    import logging
    import tempfile

    from pdserve.perf.kernel_tables import shipped_tables
    from pdserve.perf.presets import measured
    logging.disable(logging.WARNING)
    ratios: list[float] = []
    moe_ratios: list[float] = []
    folder = tempfile.mkdtemp(prefix="aic-models-")
    for gpu in STEP_GPUS:
        for model, tp in STEP_CASES + MOE_STEP_CASES:
            if model == "llama-3.1-70b" and gpu == "l40s":
                continue  # 141 GB of weights on 4 x 48 GB (left out since the first run)
            ours = measured(model, gpu, tp, "vllm", host="none")
            if ours.kv_capacity_tokens <= 0:
                print(f"{model}@{gpu} tp{tp}: the weights do not fit")
                continue
            try:
                ours.decode_step_s(1, 1000)
            except ValueError as err:  # an MoE shape the engine was not measured at
                print(f"{model}@{gpu} tp{tp}: {err}")
                continue
            meta = shipped_tables(ours.ops.gpu.name).meta
            version = ours.ops.name.split("@")[1]
            moe = {"moe_tp_size": tp} if ours.model.experts else {}
            engine = EngineHandle.compile(aic_model_path(model, folder), meta["aic_system"],
                                          "vllm", backend_version=version, tp_size=tp, **moe)
            found = moe_ratios if ours.model.experts else ratios
            cells = []
            for isl in (1000, 4000):
                theirs = engine.predict_prefill_latency(1, isl) * 1e-3
                mine = ours.prefill_s(isl)
                found.append(mine / theirs)
                cells.append(f"prefill {isl} {mine * 1e3:6.1f}/{theirs * 1e3:6.1f}")
            for batch, context in ((1, 1000), (16, 4250), (64, 1000), (64, 4250), (256, 1000)):
                theirs = engine.predict_decode_latency(batch, context) * 1e-3
                mine = ours.decode_step_s(batch, batch * context)
                found.append(mine / theirs)
                cells.append(f"B{batch}x{context} {mine * 1e3:5.1f}/{theirs * 1e3:5.1f}")
            print(f"{model}@{gpu} tp{tp} ({ours.ops.name}), ms ours/AIC: " + "; ".join(cells))
    for label, found in (("dense models", ratios), ("MoE models", moe_ratios)):
        errors = np.abs(np.array(found) - 1) * 100
        print(f"all steps, {label} ({len(found)}): {stats(errors)}; ours/AIC median "
              f"{np.median(found):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description="calibration figures")
    parser.add_argument("--json", help="write the measured tables' held-out errors here")
    parser.add_argument("--measured-only", action="store_true",
                        help="skip the Vidur-calibrated sections (1-5)")
    args = parser.parse_args()
    if not args.measured_only:
        operators()
        steps()
        leave_one_model_out()
        models_on_a100()
        tensor_parallel()
    measured_held_out(args.json)
    aic_steps()


if __name__ == "__main__":
    main()
