"""Trim AIConfigurator's measured kernel tables into the package data pdserve ships.

pdserve prices current engines from the kernel timings AIConfigurator (NVIDIA, Apache-2.0)
measured on real GPUs for vLLM, SGLang and TensorRT-LLM. It ships a trimmed copy rather than
depending on the package, because:
  - install size: the `aiconfigurator-core==0.12.0` wheel is 82 MB (114 MB installed) and
    needs pandas and pyarrow (84 + 170 MB installed) to read its parquet files; the trimmed
    tables are 2.8 MB of `.npz` for nine GPUs, read by numpy, which pdserve already needs;
  - offline use: nothing is fetched or parsed at run time, and a base `pip install .`
    simulates;
  - its API moves: the Python estimators were moved into a Rust core during 0.12, and the CLI
    is moving to another package; the parquet schema is the stable surface.

This script regenerates the tables from the pinned package (the `aic` extra:
`pip install -e .[aic]`):

    python scripts/aic_tables.py [--out pdserve/data/aic_tables]

What is kept, per GPU (one `<gpu>.npz` each), for each backend at the version AIConfigurator
queries by default (`systems/query_versions.yaml`, "current"):
  gemm/{bf16,fp8}     latency [m, n, k] of a dense GEMM (m tokens, n out, k in); n and k
                      limited to the grid values that bracket every shape of pdserve's models
                      (`pdserve.perf.specs.MODELS`) at TP 1-8; all m
  context             prefill attention latency [q/kv head pair, batch, isl], head dim 128,
                      16-bit KV, no sliding window (the fastest kernel measured per row)
  generation          decode attention latency [pair, batch, kv length], same filters
  all_reduce/{graph,eager,nccl}  latency [gpus, message bytes] of the backend's custom
                      all-reduce under CUDA graphs and eagerly (the newest measured version
                      at or before the backend's, AIConfigurator's own backward fill), and of
                      NCCL's all-reduce (16-bit)
  send_recv           NCCL all-gather on 2 GPUs [bytes each GPU receives]: the intra-node
                      point-to-point figure (AIConfigurator has no send/recv table: it prices
                      P2P analytically)
  moe/bf16            latency [expert shape, TP degree, tokens] of the fused MoE layer
                      (routing, gate+up, activation, down of the routed experts) for the
                      shapes of pdserve's MoE models (hidden, expert FFN, experts per token,
                      experts), bf16, experts sharded by TP (moe_tp = TP, no expert
                      parallelism: each engine's default), tokens routed by the power law
                      of exponent 1.2 AIConfigurator prices with by default
Latencies are stored in ms as float16 (0.05 % rounding); unmeasured cells are NaN. The GPU's
datasheet figures from its `systems/<gpu>.yaml` go in `meta`. No latency is changed.
"""

from __future__ import annotations

import argparse
import json
from importlib import metadata, resources
from pathlib import Path

import numpy as np

from pdserve.perf.specs import MODELS, check_tp

PINNED = "0.12.0"
OUT = Path(__file__).resolve().parent.parent / "pdserve" / "data" / "aic_tables"
# pdserve's short name -> AIConfigurator's system name (every GPU it measured the dense
# families on; a100_pcie, h100_pcie, a30, l4 have no kernel tables, b60 is an Intel GPU)
SYSTEMS = {"a100": "a100_sxm", "h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm",
           "b300": "b300_sxm", "gb200": "gb200", "gb300": "gb300", "l40s": "l40s",
           "rtx-pro-6000": "rtx_pro_6000_server"}
BACKENDS = ("vllm", "sglang", "trtllm")
GEMM_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}
HEAD_DIM = 128
MOE_DISTRIBUTION = "power_law_1.2"  # AIConfigurator's default routing skew (sdk/models/moe.py)


def version_key(version: str) -> tuple:
    parts = []
    for piece in version.replace("rc", ".rc.").replace("post", ".post.").split("."):
        parts.append((0, int(piece)) if piece.isdigit() else (-1, piece))
    return tuple(parts)


def gemm_dims() -> tuple[int, int]:
    """The smallest and largest GEMM dimension (n or k) of any pdserve model at TP 1-8."""
    dims = []
    for model in MODELS.values():
        for tp in (1, 2, 4, 8):
            try:
                check_tp(model, tp)
            except ValueError:
                continue
            q = model.heads * model.head_dim // tp
            kv = model.kv_heads * model.head_dim // tp
            dims += [model.hidden, q + 2 * kv, q, model.vocab // tp]
            if not model.experts:  # an MoE model's experts are the MoE table's
                dims += [2 * model.ffn // tp, model.ffn // tp]
    return min(dims), max(dims)


def bracket(values: np.ndarray, low: int, high: int) -> np.ndarray:
    values = np.sort(np.unique(values))
    lo = values[values <= low].max() if (values <= low).any() else values.min()
    hi = values[values >= high].min() if (values >= high).any() else values.max()
    return values[(values >= lo) & (values <= hi)]


def dense(frame, axes: list[str], value: str = "latency") -> tuple[list[np.ndarray], np.ndarray]:
    """A dense array over the sorted unique values of `axes` (NaN where unmeasured; the
    smallest latency where a cell was measured more than once, e.g. by two kernels)."""
    grouped = frame.groupby(axes)[value].min()
    grids = [np.sort(frame[axis].unique()) for axis in axes]
    table = np.full([len(g) for g in grids], np.nan, dtype=np.float64)
    index = [np.searchsorted(g, grouped.index.get_level_values(i)) for i, g in enumerate(grids)]
    table[tuple(index)] = grouped.to_numpy()
    return grids, table


def moe_shapes() -> list[tuple[int, int, int, int]]:
    """(hidden, expert FFN, experts per token, experts) of each pdserve MoE model."""
    return sorted({(m.hidden, m.ffn, m.experts_per_token, m.experts) for m in MODELS.values()
                   if m.experts})


def newest_at_most(folder: Path, version: str) -> Path | None:
    if not folder.is_dir():
        return None
    found = [p for p in folder.iterdir() if version_key(p.name) <= version_key(version)]
    return max(found, key=lambda p: version_key(p.name)) if found else None


def trim_gpu(root: Path, short: str, system: str, versions: dict, out: Path) -> int:
    import pandas as pd
    import yaml

    spec = yaml.safe_load((root / f"{system}.yaml").read_text())
    data = root / spec["data_dir"]
    arrays: dict[str, np.ndarray] = {}
    low, high = gemm_dims()
    backends: dict[str, dict] = {}
    for backend in BACKENDS:
        version = versions.get("overrides", {}).get(system, {}).get(
            backend, versions["defaults"][backend])["current"]
        gemm_file = data / "gemm" / backend / version / "gemm_perf.parquet"
        attention = data / "attention" / backend / version
        if not gemm_file.exists() or not attention.is_dir():
            continue
        key = f"{backend}@{version}"
        sources = {"gemm": version, "attention": version}
        gemm = pd.read_parquet(gemm_file)
        for name, dtype in GEMM_DTYPES.items():
            rows = gemm[gemm["gemm_dtype"] == dtype]
            if rows.empty:
                continue
            keep_n = bracket(rows["n"].to_numpy(), low, high)
            keep_k = bracket(rows["k"].to_numpy(), low, high)
            rows = rows[rows["n"].isin(keep_n) & rows["k"].isin(keep_k)]
            (m, n, k), table = dense(rows, ["m", "n", "k"])
            arrays |= {f"{key}/gemm/{name}/m": m, f"{key}/gemm/{name}/n": n,
                       f"{key}/gemm/{name}/k": k, f"{key}/gemm/{name}/latency_ms": table}
        for phase, size in (("context", "isl"), ("generation", "step")):
            rows = pd.read_parquet(attention / f"{phase}_attention_perf.parquet")
            if "window_size" in rows:  # older tables have no sliding-window rows
                rows = rows[rows["window_size"] == 0]
            rows = rows[(rows["head_dim"] == HEAD_DIM) & (rows["kv_cache_dtype"] == "bfloat16")]
            rows = rows.assign(pair=rows["num_heads"] * 1000 + rows["num_key_value_heads"])
            (pair, batch, length), table = dense(rows, ["pair", "batch_size", size])
            arrays |= {f"{key}/{phase}/q_heads": pair // 1000,
                       f"{key}/{phase}/kv_heads": pair % 1000,
                       f"{key}/{phase}/batch": batch, f"{key}/{phase}/length": length,
                       f"{key}/{phase}/latency_ms": table}
        custom = newest_at_most(data / "comm" / backend, version)
        if custom is not None and (custom / "custom_allreduce_perf.parquet").exists():
            sources["custom_all_reduce"] = custom.name
            rows = pd.read_parquet(custom / "custom_allreduce_perf.parquet")
            rows = rows[rows["allreduce_dtype"] == "bfloat16"]
            label = rows["backend"] if "backend" in rows else rows["kernel_source"]
            for kind in ("graph", "eager"):
                # TensorRT-LLM's one kernel serves both (it runs under CUDA graphs)
                chosen = rows[label.str.endswith(kind)] if label.str.endswith(kind).any() \
                    else rows
                (gpus, size), table = dense(chosen, ["num_gpus", "message_size"])
                arrays |= {f"{key}/all_reduce/{kind}/gpus": gpus,
                           f"{key}/all_reduce/{kind}/bytes": size * 2,  # bf16 elements
                           f"{key}/all_reduce/{kind}/latency_ms": table}
        moe_file = data / "moe" / backend / version / "moe_perf.parquet"
        if moe_file.exists():
            rows = pd.read_parquet(moe_file)
            rows = rows[(rows["moe_dtype"] == "bfloat16") & (rows["moe_ep_size"] == 1)
                        & (rows["distribution"] == MOE_DISTRIBUTION)]
            # one axis of the shapes pdserve has (a 4-axis product would be mostly empty):
            # hidden, FFN, top-k and experts packed in one integer, unpacked below
            shape = (rows["hidden_size"].astype(np.int64) * 10**12
                     + rows["inter_size"].astype(np.int64) * 10**6
                     + rows["topk"].astype(np.int64) * 10**3 + rows["num_experts"])
            wanted = [h * 10**12 + f * 10**6 + k * 10**3 + e for h, f, k, e in moe_shapes()]
            rows = rows.assign(shape=shape)[shape.isin(wanted)]
            if not rows.empty:
                sources["moe"] = version
                (shapes, tp, tokens), table = dense(rows, ["shape", "moe_tp_size", "num_tokens"])
                arrays |= {f"{key}/moe/bf16/hidden": shapes // 10**12,
                           f"{key}/moe/bf16/ffn": shapes // 10**6 % 10**6,
                           f"{key}/moe/bf16/topk": shapes // 10**3 % 10**3,
                           f"{key}/moe/bf16/experts": shapes % 10**3,
                           f"{key}/moe/bf16/tp": tp, f"{key}/moe/bf16/tokens": tokens,
                           f"{key}/moe/bf16/latency_ms": table}
        backends[key] = sources
    if not backends:
        return 0
    nccl_version = str(spec["misc"]["nccl_version"])
    nccl = pd.read_parquet(data / "comm" / "nccl" / nccl_version / "nccl_perf.parquet")
    nccl = nccl[nccl["nccl_dtype"] == "half"]
    (gpus, size), table = dense(nccl[nccl["op_name"] == "all_reduce"], ["num_gpus", "message_size"])
    arrays |= {"nccl/all_reduce/gpus": gpus, "nccl/all_reduce/bytes": size * 2,
               "nccl/all_reduce/latency_ms": table}
    gather = nccl[(nccl["op_name"] == "all_gather") & (nccl["num_gpus"] == 2)]
    (size,), table = dense(gather, ["message_size"])
    # all-gather of `size` 16-bit elements on 2 GPUs: each GPU receives half, `size` bytes
    arrays |= {"send_recv/bytes": size, "send_recv/latency_ms": table}
    gpu, node = spec["gpu"], spec["node"]
    meta = {"gpu": short, "aic_system": system, "aiconfigurator_core": PINNED,
            "backends": backends, "nccl": nccl_version,
            "hbm_gb_s": gpu["mem_bw"] / 1e9, "bf16_tflops": gpu["bfloat16_tc_flops"] / 1e12,
            "fp8_tflops": gpu.get("fp8_tc_flops", 0) / 1e12,
            "memory_gb": gpu["mem_capacity"] / 1e9, "sm_version": gpu.get("sm_version"),
            "intra_node_gb_s": node["intra_node_bw"] / 1e9,
            "gpus_per_node": node["num_gpus_per_node"]}
    for name, value in list(arrays.items()):
        arrays[name] = (value.astype(np.float16) if name.endswith("latency_ms")
                        else value.astype(np.int64))
    arrays["meta"] = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    path = out / f"{short}.npz"
    np.savez_compressed(path, **arrays)
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import yaml

    installed = metadata.version("aiconfigurator-core")
    if installed != PINNED:
        raise SystemExit(f"aiconfigurator-core {installed} is installed; these tables are "
                         f"from {PINNED} (pip install aiconfigurator-core=={PINNED})")
    root = Path(str(resources.files("aiconfigurator_core") / "systems"))
    versions = yaml.safe_load((root / "query_versions.yaml").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    total = 0
    for short, system in SYSTEMS.items():
        size = trim_gpu(root, short, system, versions, args.out)
        print(f"{short:14s} ({system}): {size / 1e3:7.1f} kB")
        total += size
    print(f"total {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
