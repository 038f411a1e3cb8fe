"""Held-out error of the measured operator model: how well it prices shapes it was not given.

For each table of a GPU x engine version, every 5th interior measured row of each series
along the table's size axis (GEMM tokens, attention length, all-reduce bytes) is removed
(`LogGrid.without_every`), the table is rebuilt without those rows and asked for them: the
error is |predicted - measured| / measured. Families: GEMM (bf16; fp8 apart), prefill
attention, decode attention, all-reduce (the engine's custom one under CUDA graphs and
NCCL's). What this measures is the interpolation between measured sizes; the step between
measured head layouts and GEMM widths is the same log-space interpolation.

The tables' own resolution (`adjacent_gemm_spread`): AIConfigurator measures GEMMs at token
counts in pairs one apart (16 and 17, 1024 and 1025, ...), and cuBLAS / CUTLASS pick a kernel
per shape, so two rows one token apart differ by P90 13-26 % (bf16) and up to 50 % (fp8 on
Hopper). A model smooth in the token count cannot be within 10 % of both rows of such a pair,
so a held-out GEMM P90 of 10 % is below what the data resolve.
"""

from __future__ import annotations

import numpy as np

from pdserve.perf.kernel_tables import HeadTable, shipped_tables
from pdserve.perf.log_grid import HOLDOUT_EVERY, LogGrid
from pdserve.perf.operators import HeldOutError

FAMILIES = ("gemm", "gemm_fp8", "context_attention", "generation_attention", "all_reduce",
            "moe")


def _grid_errors(grid: LogGrid, min_seconds: float = 0.0) -> list[float]:
    kept, removed = grid.without_every(HOLDOUT_EVERY)
    return [abs(kept.at(coords) / seconds - 1) * 100 for coords, seconds in removed
            if seconds >= min_seconds]


def held_out_head_errors(table: HeadTable, min_seconds: float = 0.0) -> list[float]:
    """The held-out errors (%) of every (query heads, KV heads) grid of an attention table."""
    errors: list[float] = []
    for grid in table.grids:
        errors += _grid_errors(grid, min_seconds)
    return errors


def summary(errors: list[float]) -> HeldOutError:
    values = np.asarray(errors, dtype=float)
    return HeldOutError(len(values), round(float(np.median(values)), 2),
                        round(float(np.percentile(values, 90)), 2))


def held_out_errors(gpu: str, backend: str, min_seconds: float = 0.0
                    ) -> dict[str, HeldOutError]:
    """Per family, the held-out error of `backend`'s tables measured on `gpu` (on the rows
    that took at least `min_seconds`)."""
    tables = shipped_tables(gpu).backends[backend]
    errors: dict[str, list[float]] = {
        "gemm": _grid_errors(tables.gemm["bf16"], min_seconds),
        "context_attention": held_out_head_errors(tables.context, min_seconds),
        "generation_attention": held_out_head_errors(tables.generation, min_seconds),
        "all_reduce": [e for kind in ("graph", "nccl") if kind in tables.all_reduce
                       for e in _grid_errors(tables.all_reduce[kind], min_seconds)],
    }
    if "fp8" in tables.gemm:
        errors["gemm_fp8"] = _grid_errors(tables.gemm["fp8"], min_seconds)
    errors["moe"] = [e for grid in tables.moe.values() for e in _grid_errors(grid, min_seconds)]
    return {family: summary(errors[family]) for family in FAMILIES if errors.get(family)}


def adjacent_gemm_spread(gpu: str, backend: str, dtype: str = "bf16") -> HeldOutError | None:
    """|t(m + 1) / t(m) - 1| in % over the GEMM rows measured one token apart (m >= 16):
    the difference kernel selection makes between neighbouring sizes (None: no such table)."""
    grid = shipped_tables(gpu).backends[backend].gemm.get(dtype)
    if grid is None:
        return None
    tokens = grid.axes[-1].tolist()
    spreads: list[float] = []
    for index, m in enumerate(tokens[:-1]):
        if m >= 16 and tokens[index + 1] == m + 1:
            low, high = grid.seconds[..., index].ravel(), grid.seconds[..., index + 1].ravel()
            both = np.isfinite(low) & np.isfinite(high)
            spreads += list(np.abs(high[both] / low[both] - 1) * 100)
    return summary(spreads) if spreads else None
