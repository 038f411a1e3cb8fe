"""Per-shape corrections of the operator curves on the GPU they were measured on.

The parametric curves (`operators.py`) generalise across shapes and GPUs, but on the
profiled A100 they leave a structured residual: cuBLAS picks tile shapes per problem size,
so a GEMM's time moves in steps the curve smooths over (held-out P90 10-13 %). Vidur answers
this with a regression over the profile rows themselves; here each (operator, layer shape)
keeps the median log-ratio measured / curve in bins of `PER_OCTAVE` per doubling of tokens,
interpolated linearly in log2(tokens) (flat beyond the ends).

The links get a table per message size too: all-reduce over NVLink (2 GPUs) and PCIe (4
GPUs) and NVLink send/recv, keyed by the number of GPUs. Their rows hold one measurement per
size with bimodal repeats (all-reduce over NVLink: most near 60 us, streaks near 10 us), so
each grid point takes the median of the 15 rows nearest in size (`fit_rolling_residuals`),
applied by `Calibrated.all_reduce_s` / `transfer_s` on the reference GPU with that link and
that many GPUs.

A correction applies only where it was measured: the reference GPU and a layer shape
(hidden, heads, KV heads, FFN width, TP degree) the profiles hold. Attention has one
profiled layout (70B at TP 2); its corrections sit in bins of both dimensions (decode:
batch x context per sequence; prefill: new x prior tokens) and apply on the reference GPU
to every layout, on the assumption that the kernels' tiling steps follow those dimensions.
Any other shape or GPU keeps the curve alone, so the leave-one-model-out check in
`bench/calibration.py` (curves only) is the error to expect for an unprofiled model.
Fitted by `residual_fit.py` on the rows outside the held-out split only; shipped as
`a100_residuals.json`.

On by default since 2026-11-23 (`presets.calibrated(..., corrected=True)`), together with
per-size tables on the runtime model. They bring the operators' held-out error to a median
of 0.9-1.8 % and a P90 of 2.6-6.6 % (the curves alone: 3.3-8.5 % and 10-23 %). The
simulator runs on the closed-form `PerfModel` fitted to the operator model, which cannot
follow tile-size steps: fitted to the corrected operator model without tables it predicts
held-out whole steps worse than the curves alone (decode P90 7.6 % against 6.2 %, prefill
11.3 % against 6.5 %), which is why they were off until the tables existed. Per-size tables
carry what the closed form misses (`to_perf_model(size_tables=True)`: 5.0 % and 5.2 %).
`bench/calibration.py` prints all three; `Calibrated(residuals=None)` or
`presets.curves_perf_model` is the model without them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from pdserve.perf.layer_shape import GEMM_OPS, STREAM_OPS, Number

RESIDUALS_FILE = "a100_residuals.json"
PER_OCTAVE = 8
MLP_OPS = GEMM_OPS + tuple(op for op in STREAM_OPS if op != "emb") + ("emb",)


@dataclass(frozen=True)
class Residuals:
    reference_gpu: str
    per_octave: int
    # op -> shape key -> (index of the first bin, median log-ratio of each bin)
    tables: dict[str, dict[str, tuple[int, list[float]]]]
    # "decode" (batch, context tokens per sequence) / "prefill" (new, prior tokens):
    # "bin_a,bin_b" -> median log-ratio (the one attention layout Vidur profiled)
    attention: dict[str, dict[str, float]]

    def attention_factor(self, kind: str, first: float, second: float) -> float:
        """measured / curve for one attention call: the bin's median, else the mean of its
        measured neighbours (one bin away), else 1."""
        table = self.attention.get(kind, {})
        a, b = (int(round(np.log2(max(value, 1.0)) * self.per_octave))
                for value in (first, second))
        value = table.get(f"{a},{b}")
        if value is None:
            near = [table[key] for key in (f"{a + i},{b + j}" for i in (-1, 0, 1)
                                           for j in (-1, 0, 1)) if key in table]
            value = float(np.mean(near)) if near else 0.0
        return float(np.exp(value))

    def factor(self, op: str, key: Number | np.ndarray, tokens: Number) -> Number:
        """measured / curve for `tokens` tokens of `op` on `key` (1 where none was
        measured); arrays of keys and tokens give an array."""
        table = self.tables.get(op, {})
        keys, counts = np.broadcast_arrays(np.asarray(key), np.asarray(tokens, dtype=float))
        out = np.ones(counts.shape)
        for name in np.unique(keys):
            if str(name) not in table:
                continue
            first, values = table[str(name)]
            knots = (first + np.arange(len(values))) / self.per_octave
            rows = keys == name
            out[rows] = np.exp(np.interp(np.log2(np.maximum(counts[rows], 1.0)), knots,
                                         np.asarray(values)))
        return out if out.ndim else float(out)

    def to_json(self) -> str:
        return json.dumps({"reference_gpu": self.reference_gpu, "per_octave": self.per_octave,
                           "tables": self.tables, "attention": self.attention},
                          sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Residuals:
        raw = json.loads(text)
        tables = {op: {key: (int(entry[0]), [float(v) for v in entry[1]])
                       for key, entry in keys.items()} for op, keys in raw["tables"].items()}
        attention = {kind: {key: float(v) for key, v in bins.items()}
                     for kind, bins in raw["attention"].items()}
        return cls(raw["reference_gpu"], int(raw["per_octave"]), tables, attention)


def fit_residuals(keys: np.ndarray, tokens: np.ndarray, measured_s: np.ndarray,
                  curve_s: np.ndarray) -> dict[str, tuple[int, list]]:
    """Median log(measured / curve) per shape and per bin of tokens (training rows only)."""
    ratio = np.log(measured_s / curve_s)
    bins = np.round(np.log2(np.maximum(tokens, 1.0)) * PER_OCTAVE).astype(int)
    table: dict[str, tuple[int, list]] = {}
    for name in np.unique(keys):
        rows = keys == name
        present = np.unique(bins[rows])
        medians = {b: float(np.median(ratio[rows & (bins == b)])) for b in present}
        first, last = int(present.min()), int(present.max())
        filled = np.interp(np.arange(first, last + 1), present, [medians[b] for b in present])
        table[str(name)] = (first, [round(float(v), 4) for v in filled])
    return table


def fit_rolling_residuals(keys: np.ndarray, sizes: np.ndarray, measured_s: np.ndarray,
                          curve_s: np.ndarray, neighbours: int) -> dict[str, tuple[int, list]]:
    """For sparse, noisy rows (the links': one row per size, bimodal repeats): at each
    point of the `PER_OCTAVE` grid, the median log(measured / curve) of the `neighbours`
    rows nearest in log2(size), so that a streak of a few fast repeats does not set it."""
    ratio = np.log(measured_s / curve_s)
    position = np.log2(np.maximum(sizes, 1.0))
    table: dict[str, tuple[int, list]] = {}
    for name in np.unique(keys):
        rows = keys == name
        first = int(np.floor(position[rows].min() * PER_OCTAVE))
        last = int(np.ceil(position[rows].max() * PER_OCTAVE))
        values = []
        for knot in range(first, last + 1):
            nearest = np.argsort(np.abs(position[rows] - knot / PER_OCTAVE))[:neighbours]
            values.append(round(float(np.median(ratio[rows][nearest])), 4))
        table[str(name)] = (first, values)
    return table


def fit_attention_residuals(first: np.ndarray, second: np.ndarray, measured_s: np.ndarray,
                            curve_s: np.ndarray) -> dict[str, float]:
    """Median log(measured / curve) per bin pair of the two attention dimensions."""
    ratio = np.log(measured_s / curve_s)
    a, b = (np.round(np.log2(np.maximum(values, 1.0)) * PER_OCTAVE).astype(int)
            for values in (first, second))
    bins: dict[str, list[float]] = {}
    for i, j, r in zip(a, b, ratio, strict=True):
        bins.setdefault(f"{i},{j}", []).append(float(r))
    return {key: round(float(np.median(values)), 4) for key, values in bins.items()}


@lru_cache(maxsize=1)
def shipped_residuals() -> Residuals:
    source = resources.files("pdserve.data").joinpath("gpu_profiles", RESIDUALS_FILE)
    return Residuals.from_json(source.read_text())
