"""In-situ profiles: the batches live workers ran, with their measured times.

A profile taken on an idle machine (`pdserve profile`), or with synthetic contention, leaves
out what shares the cores in a deployment: the server process, the load client, the OS
scheduler, the other workers' real (not synthetic) load. With `PDSERVE_STEP_LOG=DIR` in its
environment, every live worker appends one CSV row per executed batch to
`DIR/steps-<instance>.csv`. A row's time is the batch's *period*: from its start to the start
of the worker's next batch, so it includes what the worker does between batches (reports,
commands, KV imports on its own thread); a batch followed by idling is not logged, since the
gap is waiting, not work. `fit_step_log` fits the runtime `PerfModel` to those rows
(`pdserve.perf.fit.fit_steps`), keeping another model's transfer and KV figures, and
records how far the prefill batches' periods spread around the fit
(`PerfModel.prefill_step_cv`), which the simulator draws from (`sim/step_noise.py`).
`docs/results/fidelity.md` measures what it changes.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import numpy as np

from pdserve.perf.fit import fit_steps
from pdserve.perf.fitted import PerfModel

STEP_LOG_ENV = "PDSERVE_STEP_LOG"
COLUMNS = ("decodes", "decode_context_tokens", "prefill_tokens", "prefill_attn_units",
           "seconds")


class StepLog:
    """Appends a worker's executed batches to `directory/steps-<instance>.csv`."""

    def __init__(self, directory: Path, instance_id: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"steps-{instance_id}.csv"
        new = not path.exists()
        self._file: TextIO = path.open("a", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(COLUMNS)
        self._pending: tuple[tuple[int, int, int, int], float] | None = None

    def batch_started(self, start_s: float) -> None:
        """A batch starts: the previous one, if the worker stayed busy since, is logged with
        the time from its start to now."""
        if self._pending is not None:
            (decodes, context, tokens, units), began_s = self._pending
            self.record(decodes, context, tokens, units, start_s - began_s)
        self._pending = None

    def batch_ran(self, decodes: int, decode_context_tokens: int, prefill_tokens: int,
                  prefill_attn_units: int, start_s: float) -> None:
        """The batch that started at `start_s` ran; it is logged when the next one starts."""
        self._pending = ((decodes, decode_context_tokens, prefill_tokens, prefill_attn_units),
                         start_s)

    def idle(self) -> None:
        self._pending = None

    @classmethod
    def from_env(cls, instance_id: int) -> StepLog | None:
        directory = os.environ.get(STEP_LOG_ENV)
        return cls(Path(directory), instance_id) if directory else None

    def record(self, decodes: int, decode_context_tokens: int, prefill_tokens: int,
               prefill_attn_units: int, seconds: float) -> None:
        self._writer.writerow((decodes, decode_context_tokens, prefill_tokens,
                               prefill_attn_units, f"{seconds:.6f}"))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_step_logs(paths: Iterable[Path]) -> list[tuple[float, float, float, float, float]]:
    rows: list[tuple[float, float, float, float, float]] = []
    for path in paths:
        with path.open(newline="") as handle:
            for record in csv.DictReader(handle):
                decodes, context, tokens, units, seconds = (float(record[c]) for c in COLUMNS)
                rows.append((decodes, context, tokens, units, seconds))
    return rows


def prefill_step_cv(rows: list[tuple[float, float, float, float, float]],
                    model: PerfModel) -> float:
    """The coefficient of variation of measured / modelled time over the batches with
    prefill work (what sets TTFT; a decode's TPOT averages its steps' spread away), 0 with
    fewer than 10 such batches."""
    ratios = [seconds / model.batch_time_s(int(decodes), int(context), int(tokens), int(units))
              for decodes, context, tokens, units, seconds in rows if tokens > 0]
    if len(ratios) < 10:
        return 0.0
    spread = np.asarray(ratios)
    return min(2.0, float(spread.std() / spread.mean()))


def fit_step_log(directory: Path, base: PerfModel) -> PerfModel:
    """The runtime model fitted to every `steps-*.csv` under `directory`, with the measured
    spread of its prefill batches; transfer and KV figures come from `base` (step logs hold
    no transfers)."""
    rows = read_step_logs(_logs(directory, "*"))
    prefill, decode = fit_steps(rows)
    fitted = replace(base, name=f"{base.name}, fitted to {directory.name} step logs",
                     prefill=prefill, decode=decode)
    return replace(fitted, prefill_step_cv=prefill_step_cv(rows, fitted))


def fit_step_log_by_role(directory: Path, base: PerfModel, prefill_instance: int,
                         decode_instance: int) -> PerfModel:
    """A disaggregated deployment's model: prefill fitted to the prefill worker's batches,
    decode to the decode worker's (each one's periods include its own side of the KV
    hand-off: the export on one, the import between steps on the other)."""
    prefill_rows = read_step_logs(_logs(directory, str(prefill_instance)))
    prefill, _ = fit_steps(prefill_rows)
    _, decode = fit_steps(read_step_logs(_logs(directory, str(decode_instance))))
    fitted = replace(base, name=f"{base.name}, fitted per role to {directory.name} step logs",
                     prefill=prefill, decode=decode)
    return replace(fitted, prefill_step_cv=prefill_step_cv(prefill_rows, fitted))


def _logs(directory: Path, instance: str) -> list[Path]:
    paths = sorted(directory.glob(f"steps-{instance}.csv"))
    if not paths:
        raise ValueError(f"{directory}: no steps-{instance}.csv step logs (set "
                         f"{STEP_LOG_ENV})")
    return paths
