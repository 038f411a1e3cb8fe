"""The measured kernel tables pdserve ships: one GPU's timings per engine and version.

`pdserve/data/aic_tables/<gpu>.npz` holds what AIConfigurator 0.12.0 (NVIDIA, Apache-2.0;
`LICENSE.aiconfigurator` and `NOTICE` beside the files) measured on that GPU for vLLM, SGLang
and TensorRT-LLM: dense GEMMs (bf16, fp8), prefill ("context") and decode ("generation")
attention, each engine's custom all-reduce (under CUDA graphs and eager), NCCL's all-reduce,
NCCL's 2-GPU all-gather as the intra-node send/recv figure, and the fused MoE layer for the
expert shapes of pdserve's MoE models. `scripts/aic_tables.py`
trims them from the pinned package and says what was kept and why pdserve ships a copy
(install size, offline use, the package's API churn). Nothing is fetched at run time.

A backend is named `vllm`, `sglang` or `trtllm`, optionally with its version
(`vllm@0.24.0`); `resolve_backend` picks the newest measured version of a name, and with no
name the newest vLLM.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources

import numpy as np

from pdserve.perf.log_grid import LogGrid

TABLES_DIR = "aic_tables"
ENGINES = ("vllm", "sglang", "trtllm")
DEFAULT_ENGINE = "vllm"


def _version_key(version: str) -> tuple:
    parts: list[tuple[int, int | str]] = []
    for piece in version.replace("rc", ".rc.").replace("post", ".post.").split("."):
        parts.append((0, int(piece)) if piece.isdigit() else (-1, piece))
    return tuple(parts)


@dataclass(frozen=True)
class HeadTable:
    """Attention latencies per (query heads, KV heads) pair per GPU, each a grid over
    (batch, length): prefill rows time `batch` sequences of `length` new tokens, decode rows
    `batch` sequences reading `length` cached tokens each."""

    pairs: tuple[tuple[int, int], ...]
    grids: tuple[LogGrid, ...]

    def nearest(self, q_heads: float, kv_heads: float
                ) -> list[tuple[tuple[int, int], LogGrid, float]]:
        """The measured pairs that price (q_heads, kv_heads): those with the nearest KV head
        count (in log space), bracketing the query heads, with their log-space weights."""
        kvs = sorted({kv for _, kv in self.pairs})
        kv = min(kvs, key=lambda k: (abs(np.log(k / kv_heads)), k))
        same = sorted((q, i) for i, (q, k) in enumerate(self.pairs) if k == kv)
        qs = [q for q, _ in same]
        if q_heads <= qs[0] or len(qs) == 1:
            return [(self.pairs[same[0][1]], self.grids[same[0][1]], 1.0)]
        if q_heads >= qs[-1]:
            return [(self.pairs[same[-1][1]], self.grids[same[-1][1]], 1.0)]
        j = int(np.searchsorted(qs, q_heads))
        lo, hi = same[j - 1], same[j]
        w = float(np.log(q_heads / lo[0]) / np.log(hi[0] / lo[0]))
        return [(self.pairs[lo[1]], self.grids[lo[1]], 1 - w),
                (self.pairs[hi[1]], self.grids[hi[1]], w)]

    def without_every(self, every: int) -> tuple[HeadTable, list]:
        grids, removed = [], []
        for pair, grid in zip(self.pairs, self.grids, strict=True):
            kept, points = grid.without_every(every)
            grids.append(kept)
            removed += [(pair, coords, seconds) for coords, seconds in points]
        return HeadTable(self.pairs, tuple(grids)), removed


@dataclass(frozen=True)
class BackendTables:
    """One engine version's tables on one GPU (`None` where it was not measured)."""

    name: str  # "vllm@0.24.0"
    gemm: dict[str, LogGrid]  # by dtype ("bf16", "fp8"): axes (n, k, m)
    context: HeadTable
    generation: HeadTable
    all_reduce: dict[str, LogGrid]  # "graph", "eager" (custom), "nccl": axes (gpus, bytes)
    # the fused MoE layer (bf16), by (hidden, expert FFN, experts per token, experts, TP):
    # axis (tokens,); only the TP degrees measured for that shape
    moe: dict[tuple[int, int, int, int, int], LogGrid] = field(default_factory=dict)


@dataclass(frozen=True)
class KernelTables:
    """Every shipped table of one GPU."""

    gpu: str
    meta: dict
    backends: dict[str, BackendTables]
    send_recv: LogGrid  # axes (bytes,): bytes each GPU receives

    @property
    def names(self) -> list[str]:
        return sorted(self.backends, key=lambda b: (b.split("@")[0],
                                                    _version_key(b.split("@")[1])))

    def resolve_backend(self, backend: str | None) -> str:
        """`vllm@0.24.0` as given, `vllm` as its newest measured version, None as the
        newest vLLM (or the newest measured engine where vLLM was not)."""
        if backend and "@" in backend:
            if backend.lower() in self.backends:
                return backend.lower()
            raise ValueError(f"no measured tables for {backend!r} on {self.gpu}; measured: "
                             f"{', '.join(self.names)}")
        engine = (backend or DEFAULT_ENGINE).lower()
        versions = [b for b in self.names if b.split("@")[0] == engine]
        if not versions:
            if backend:
                raise ValueError(f"no measured tables for {backend!r} on {self.gpu}; "
                                 f"measured: {', '.join(self.names)}")
            versions = self.names
        return versions[-1]


def _grid(arrays: dict[str, np.ndarray], prefix: str, axes: tuple[str, ...],
          order: tuple[int, ...], smooth: bool = False) -> LogGrid:
    """A grid from `prefix/<axis>` arrays and `prefix/latency_ms`, axes reordered."""
    values = arrays[f"{prefix}/latency_ms"].astype(np.float64) * 1e-3
    return LogGrid(tuple(arrays[f"{prefix}/{axes[i]}"] for i in order),
                   np.transpose(values, order), smooth)


def _heads(arrays: dict[str, np.ndarray], prefix: str, smooth: bool) -> HeadTable:
    values = arrays[f"{prefix}/latency_ms"].astype(np.float64) * 1e-3
    batch, length = arrays[f"{prefix}/batch"], arrays[f"{prefix}/length"]
    length = np.maximum(length, 1)
    pairs, grids = [], []
    for i, (q, kv) in enumerate(zip(arrays[f"{prefix}/q_heads"], arrays[f"{prefix}/kv_heads"],
                                    strict=True)):
        if np.isfinite(values[i]).any():
            pairs.append((int(q), int(kv)))
            grids.append(LogGrid((batch, length), values[i], smooth))
    return HeadTable(tuple(pairs), tuple(grids))


def _moe(arrays: dict[str, np.ndarray], prefix: str
         ) -> dict[tuple[int, int, int, int, int], LogGrid]:
    if f"{prefix}/tokens" not in arrays:
        return {}
    values = arrays[f"{prefix}/latency_ms"].astype(np.float64) * 1e-3
    tokens, grids = arrays[f"{prefix}/tokens"], {}
    shapes = zip(*(arrays[f"{prefix}/{axis}"] for axis in ("hidden", "ffn", "topk", "experts")),
                 strict=True)
    for i, shape in enumerate(shapes):
        for j, tp in enumerate(arrays[f"{prefix}/tp"]):
            if np.isfinite(values[i, j]).sum() >= 2:  # a series, not a stray cell
                grids[(*(int(v) for v in shape), int(tp))] = LogGrid((tokens,), values[i, j])
    return grids


def parse_tables(gpu: str, data: bytes) -> KernelTables:
    """The tables of one GPU. Along their size axis prefill attention is interpolated by a
    monotone cubic (`LogGrid.smooth`), the others straight: chosen by held-out error
    (docs/results/fidelity.md, "Prefill attention along its length"). The cubic lowers
    prefill attention's held-out P90 in every GPU x engine table, whichever fifth of the
    rows is held out; it raises the GEMMs' and decode attention's, whose neighbouring sizes
    can run other kernels, and all-reduce's on most PCIe-GPU tables (NCCL's protocols)."""
    with np.load(io.BytesIO(data)) as npz:
        arrays = {name: npz[name] for name in npz.files}
    meta = json.loads(arrays.pop("meta").tobytes().decode())
    backends = {}
    for name in meta["backends"]:
        gemm = {dtype: _grid(arrays, f"{name}/gemm/{dtype}", ("m", "n", "k"), (1, 2, 0))
                for dtype in ("bf16", "fp8") if f"{name}/gemm/{dtype}/m" in arrays}
        reduce = {"nccl": _grid(arrays, "nccl/all_reduce", ("gpus", "bytes"), (0, 1))}
        for kind in ("graph", "eager"):
            if f"{name}/all_reduce/{kind}/gpus" in arrays:
                reduce[kind] = _grid(arrays, f"{name}/all_reduce/{kind}", ("gpus", "bytes"),
                                     (0, 1))
        backends[name] = BackendTables(name, gemm, _heads(arrays, f"{name}/context", True),
                                       _heads(arrays, f"{name}/generation", False), reduce,
                                       _moe(arrays, f"{name}/moe/bf16"))
    send = _grid(arrays, "send_recv", ("bytes",), (0,))
    return KernelTables(gpu, meta, backends, send)


def measured_gpus() -> list[str]:
    """The GPUs with shipped tables (pdserve's short names)."""
    folder = resources.files("pdserve.data").joinpath(TABLES_DIR)
    return sorted(p.name.removesuffix(".npz") for p in folder.iterdir()
                  if p.name.endswith(".npz"))


@lru_cache(maxsize=16)
def shipped_tables(gpu: str) -> KernelTables:
    source = resources.files("pdserve.data").joinpath(TABLES_DIR, f"{gpu}.npz")
    if not source.is_file():
        raise ValueError(f"no measured kernel tables for gpu {gpu!r}; measured: "
                         f"{', '.join(measured_gpus())}")
    return parse_tables(gpu, source.read_bytes())
