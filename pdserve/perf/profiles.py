"""The shipped A100 operator profiles (Vidur, MIT; `pdserve/data/ATTRIBUTION.md`) as arrays.

Five tables under `pdserve/data/gpu_profiles/`, trimmed from Vidur's CSVs by
`scripts/trim_gpu_profiles.py` (median times in ms, plus the columns that describe a row):
  mlp.csv                one decoder layer's non-attention ops for `tokens` tokens, per model/TP
  attention_70b_tp2.csv  FlashAttention for the 70B head layout at TP 2 (32 query heads and 4 KV
                         heads per GPU, head dim 128): decode (batch x kv_tokens each) and
                         prefill (one chunk over kv_tokens prior tokens)
  cpu_overheads.csv      vLLM's per-iteration CPU costs by batch size and TP degree
  all_reduce.csv, send_recv.csv   NCCL collectives by message size

Held-out split: a row whose index in its source file (`row`) is `HOLDOUT_EVERY - 1` modulo
`HOLDOUT_EVERY` is left out of every fit (`held_out`), and the calibration error is reported
on those rows only.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

HOLDOUT_EVERY = 5


def held_out(rows: np.ndarray) -> np.ndarray:
    """Boolean mask of the held-out rows, from their source-file row indices."""
    return rows % HOLDOUT_EVERY == HOLDOUT_EVERY - 1


@dataclass(frozen=True)
class Table:
    """One profile table: text columns as string arrays, the rest as float arrays."""
    columns: dict[str, np.ndarray]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def where(self, mask: np.ndarray) -> Table:
        return Table({name: values[mask] for name, values in self.columns.items()})

    @property
    def held_out(self) -> np.ndarray:
        return held_out(self["row"].astype(int))


TEXT_COLUMNS = frozenset({"model"})


@lru_cache(maxsize=8)
def load_table(name: str) -> Table:
    """`name` is a file under pdserve/data/gpu_profiles/ without `.csv`."""
    source = resources.files("pdserve.data").joinpath("gpu_profiles", f"{name}.csv")
    with source.open() as handle:
        reader = csv.reader(handle)
        header = next(reader)
        raw = list(reader)
    columns: dict[str, np.ndarray] = {}
    for index, column in enumerate(header):
        values = [row[index] for row in raw]
        if column in TEXT_COLUMNS:
            columns[column] = np.array(values)
        else:
            columns[column] = np.array([float(v) if v else np.nan for v in values])
    return Table(columns)
