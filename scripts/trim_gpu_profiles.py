"""Trim Vidur's A100 operator profiles into the package data pdserve ships (run once).

Reads `../shared/gpu-profiles/vidur-a100/` (or the folder given) and writes
`pdserve/data/gpu_profiles/`: the median time of every operator (ms), the columns that
describe a row, and `row`, the row's index in its source file, which fixes the held-out split
(`pdserve.perf.profiles.HOLDOUT_EVERY`). Nothing else is changed. The licence is copied next
to the files.

    python scripts/trim_gpu_profiles.py [/path/to/vidur-a100]
"""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

# `../shared/gpu-profiles/vidur-a100` next to the repository, where the project keeps it
SOURCE = Path(__file__).resolve().parents[2] / "shared" / "gpu-profiles" / "vidur-a100"
OUT = Path(__file__).resolve().parent.parent / "pdserve" / "data" / "gpu_profiles"
MLP_MODELS = ("Meta-Llama-3-8B", "Meta-Llama-3-70B", "Llama-2-7b-hf", "Llama-2-70b-hf",
              "Qwen-72B", "CodeLlama-34b-Instruct-hf")
MLP_OPS = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
           "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
CPU_PARTS = ("schedule", "sampler_e2e", "prepare_inputs_e2e", "process_model_outputs")


def _ms(value: str) -> str:
    return f"{float(value):.5g}" if value else ""


def _write(name: str, header: list[str], rows: list[list[object]]) -> None:
    with open(OUT / name, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    print(f"wrote {name}: {len(rows)} rows")


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def trim(source: Path) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[list[object]] = []
    for model in MLP_MODELS:
        for index, row in enumerate(_rows(source / f"mlp_{model}.csv")):
            rows.append([model, index, row["n_head"], row["n_kv_head"], row["n_embd"],
                         row["n_expanded_embd"], row["vocab_size"],
                         row["num_tensor_parallel_workers"], row["num_tokens"]]
                        + [_ms(row[f"time_stats.{op}.median"]) for op in MLP_OPS])
    _write("mlp.csv", ["model", "row", "heads", "kv_heads", "hidden", "ffn", "vocab", "tp",
                       "tokens", *MLP_OPS], rows)

    rows = []
    for index, row in enumerate(_rows(source / "attention_70b-shape_tp2.csv")):
        prefill = row["is_prefill"] == "True"
        kernel = row["time_stats.attn_prefill.median" if prefill else
                     "time_stats.attn_decode.median"]
        reshape = float(row["time_stats.attn_input_reshape.median"] or 0) + float(
            row["time_stats.attn_output_reshape.median"] or 0)
        rows.append([index, int(prefill), row["batch_size"], row["prefill_chunk_size"],
                     row["kv_cache_size"], _ms(kernel), _ms(str(float(kernel) + reshape))])
    _write("attention_70b_tp2.csv", ["row", "prefill", "batch", "chunk", "kv_tokens",
                                     "kernel_ms", "with_reshape_ms"], rows)

    rows = []
    for index, row in enumerate(_rows(source / "cpu_overheads.csv")):
        rows.append([index, row["model_name"], row["batch_size"], row["tensor_parallel_degree"]]
                    + [_ms(row[f"{part}_median"]) for part in CPU_PARTS]
                    + [_ms(row["ray_comm_time_mean"])])
    _write("cpu_overheads.csv", ["row", "model", "batch", "tp", *CPU_PARTS, "ray_comm"], rows)

    for kind, op in (("all_reduce", "all_reduce"), ("send_recv", "send_recv")):
        rows = []
        for index, row in enumerate(_rows(source / f"{kind}_pairwise_nvlink.csv")):
            rows.append([index, row["num_workers"], row["devices_per_node"], row["size"],
                         _ms(row[f"time_stats.{op}.median"])])
        _write(f"{kind}.csv", ["row", "workers", "devices_per_node", "bytes", "ms"], rows)
    shutil.copy(source / "LICENSE.vidur", OUT / "LICENSE.vidur")


if __name__ == "__main__":
    trim(Path(sys.argv[1]) if len(sys.argv) > 1 else SOURCE)
