"""In-situ profiles: the batches live workers ran, with their measured times.

A profile taken on an idle machine (`pdserve profile`), or with synthetic contention, leaves
out what shares the cores in a deployment: the server process, the load client, the OS
scheduler, the other workers' real (not synthetic) load. With `PDSERVE_STEP_LOG=DIR` in its
environment, every live worker appends one CSV row per executed batch to
`DIR/steps-<instance>.csv`. A row's time is the batch's *period*: from its start to the start
of the worker's next batch, so it includes what the worker does between batches (reports,
commands, KV imports on its own thread); a batch followed by idling is not logged, since the
gap is waiting, not work. Each row also carries when its batch started (`time.monotonic()`,
one clock for every process on the machine), so a run whose roles changed can be split by
the role each instance held then: the live driver logs the roles it starts with and every
flip to `DIR/roles-driver.csv` (`live/timeline.py`). `fit_step_log` fits the runtime
`PerfModel` to those rows (`pdserve.perf.fit.fit_steps`), keeping another model's transfer
and KV figures, and records how far the prefill batches' periods spread around the fit
(`PerfModel.prefill_step_cv`), which the simulator draws from (`sim/step_noise.py`).
`docs/results/fidelity.md` measures what it changes.
"""

from __future__ import annotations

import bisect
import csv
import math
import os
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TextIO

import numpy as np

from pdserve.perf.fit import fit_steps
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs
from pdserve.types import Role

STEP_LOG_ENV = "PDSERVE_STEP_LOG"
COLUMNS = ("decodes", "decode_context_tokens", "prefill_tokens", "prefill_attn_units",
           "seconds", "start_s")
StepRow = tuple[float, float, float, float, float]  # COLUMNS without the start
ROLES_FILE = "roles-driver.csv"  # the live driver's roles over time (`live/timeline.py`)
ROLE_COLUMNS = ("at_s", "instance", "role")
# per request, when its first token reached the driver (`live/timeline.py`)
REQUESTS_FILE = "requests-driver.csv"
REQUEST_COLUMNS = ("request_id", "admitted_s", "batch_end_s", "driver_received_s")
# per streamed request, when the HTTP server received it and sent its first text
RESPONSES_FILE = "responses-server.csv"
RESPONSE_COLUMNS = ("request_id", "received_s", "first_sent_s")
# the performance model the deployment ran on (its KV and transfer figures)
PERF_MODEL_FILE = "perf-model-driver.json"


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
        self._pending: tuple[tuple[int, int, int, int], float, float] | None = None
        self._started_monotonic_s = 0.0

    def batch_started(self, start_s: float) -> None:
        """A batch starts: the previous one, if the worker stayed busy since, is logged with
        the time from its start to now."""
        if self._pending is not None:
            (decodes, context, tokens, units), began_s, began_monotonic_s = self._pending
            self.record(decodes, context, tokens, units, start_s - began_s, began_monotonic_s)
        self._pending = None
        self._started_monotonic_s = time.monotonic()

    def batch_ran(self, decodes: int, decode_context_tokens: int, prefill_tokens: int,
                  prefill_attn_units: int, start_s: float) -> None:
        """The batch that started at `start_s` ran; it is logged when the next one starts."""
        self._pending = ((decodes, decode_context_tokens, prefill_tokens, prefill_attn_units),
                         start_s, self._started_monotonic_s)

    def idle(self) -> None:
        self._pending = None

    @classmethod
    def from_env(cls, instance_id: int) -> StepLog | None:
        directory = os.environ.get(STEP_LOG_ENV)
        return cls(Path(directory), instance_id) if directory else None

    def record(self, decodes: int, decode_context_tokens: int, prefill_tokens: int,
               prefill_attn_units: int, seconds: float, start_s: float = 0.0) -> None:
        self._writer.writerow((decodes, decode_context_tokens, prefill_tokens,
                               prefill_attn_units, f"{seconds:.6f}", f"{start_s:.6f}"))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_step_logs(paths: Iterable[Path]) -> list[StepRow]:
    return [row for path in paths for row, _ in read_timed_steps(path)]


def read_timed_steps(path: Path) -> list[tuple[StepRow, float]]:
    """A step log's rows with their batches' start times (0 in logs written before the
    start was logged)."""
    try:
        return _timed_steps(path)
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not a step log ({err})") from None


def _timed_steps(path: Path) -> list[tuple[StepRow, float]]:
    rows: list[tuple[StepRow, float]] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None:  # empty: a worker that has logged no batch yet
            return rows
        missing = [c for c in COLUMNS[:5] if c not in reader.fieldnames]
        if missing:
            raise ValueError(f"{path}: not a step log (no {', '.join(missing)} column; "
                             f"expected {', '.join(COLUMNS)})")
        for record in reader:
            try:
                decodes, context, tokens, units, seconds = (float(record[c])
                                                            for c in COLUMNS[:5])
                start_s = float(record.get("start_s") or 0.0)
            except (TypeError, ValueError):
                raise ValueError(f"{path}: line {reader.line_num} is not a step log row: "
                                 f"{record}") from None
            values = (decodes, context, tokens, units, seconds, start_s)
            if not (all(math.isfinite(v) for v in values)
                    and min(decodes, context, tokens, units) >= 0 and seconds > 0):
                raise ValueError(f"{path}: line {reader.line_num}: counts must not be "
                                 f"negative and the time must be positive, all finite, got "
                                 f"{record}")
            rows.append(((decodes, context, tokens, units, seconds), start_s))
    return rows


def prefill_step_cv(rows: list[StepRow], model: PerfModel) -> float:
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
    return _fitted(base, f"fitted to {directory.name} step logs", prefill, decode, rows)


def fit_step_log_by_role(directory: Path, base: PerfModel, prefill_instance: int = 0,
                         decode_instance: int = 1) -> PerfModel:
    """A disaggregated deployment's model: prefill fitted to the batches run in a prefill
    role, decode to those run in a decode role (each one's periods include its own side of
    the KV hand-off: the export on one, the import between steps on the other). With the
    driver's role log (`ROLES_FILE`) each batch goes to the side its instance's role took
    when the batch started, whichever instance ran it, so a policy that flips roles (Arrow)
    has each side fitted to that role's batches; without one (logs from before it existed),
    the sides are `prefill_instance`'s and `decode_instance`'s batches."""
    roles = read_role_log(directory)
    if roles:
        prefill_rows, decode_rows = _rows_by_role(directory, roles)
    else:
        prefill_rows = read_step_logs(_logs(directory, str(prefill_instance)))
        decode_rows = read_step_logs(_logs(directory, str(decode_instance)))
    prefill, _ = fit_steps(prefill_rows)
    _, decode = fit_steps(decode_rows)
    return _fitted(base, f"fitted per role to {directory.name} step logs", prefill, decode,
                   prefill_rows)


def rows_by_side(directory: Path) -> tuple[list[StepRow], list[StepRow]]:
    """A deployment's logged batches as (prefill side, decode side): by the role each
    instance held when the batch started, from the driver's role log (a mixed role's
    batches count on both sides); without one, every worker's batches on both sides (a
    colocated deployment, one fit)."""
    roles = read_role_log(directory)
    if roles:
        return _rows_by_role(directory, roles)
    rows = read_step_logs(_logs(directory, "*"))
    return rows, rows


def fit_sides(base: PerfModel, how: str, prefill_rows: list[StepRow],
              decode_rows: list[StepRow]) -> PerfModel:
    """`base` with prefill fitted to `prefill_rows` and decode to `decode_rows` (one fit
    when they are the same rows), and the prefill batches' spread."""
    prefill, decode = fit_steps(prefill_rows)
    if decode_rows is not prefill_rows:
        _, decode = fit_steps(decode_rows)
    return _fitted(base, how, prefill, decode, prefill_rows)


def _fitted(base: PerfModel, how: str, prefill: PrefillCoeffs, decode: DecodeCoeffs,
            prefill_rows: list[StepRow]) -> PerfModel:
    """`base` with fitted step costs and the spread of `prefill_rows` around them."""
    fitted = replace(base, name=f"{base.name}, {how}", prefill=prefill, decode=decode)
    return replace(fitted, prefill_step_cv=prefill_step_cv(prefill_rows, fitted))


def read_role_log(directory: Path) -> dict[int, list[tuple[float, Role]]]:
    """instance -> its roles in time order, (from `time.monotonic()`, role), from
    `ROLES_FILE` (empty without one)."""
    path = directory / ROLES_FILE
    roles: dict[int, list[tuple[float, Role]]] = {}
    if path.exists():
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            for record in reader:
                try:
                    roles.setdefault(int(record["instance"]), []).append(
                        (float(record["at_s"]), Role(record["role"])))
                except (KeyError, TypeError, ValueError):
                    raise ValueError(f"{path}: line {reader.line_num} is not a role log row "
                                     f"({', '.join(ROLE_COLUMNS)}): {record}") from None
    for changes in roles.values():
        changes.sort(key=lambda change: change[0])
    return roles


def role_at(changes: list[tuple[float, Role]], at_s: float) -> Role:
    """The role held at `at_s`: the last change at or before it (the first role before the
    first change)."""
    index = bisect.bisect_right([change_s for change_s, _ in changes], at_s) - 1
    return changes[max(index, 0)][1]


def _rows_by_role(directory: Path, roles: dict[int, list[tuple[float, Role]]]
                  ) -> tuple[list[StepRow], list[StepRow]]:
    prefill_rows: list[StepRow] = []
    decode_rows: list[StepRow] = []
    for path in _logs(directory, "*"):
        instance = path.stem.removeprefix("steps-")
        if not instance.isdigit():
            raise ValueError(f"{directory}: {path.name} is not a worker's step log "
                             f"(steps-<instance number>.csv)")
        changes = roles.get(int(instance))
        if not changes:
            raise ValueError(f"{directory}: {path.name} has no instance in {ROLES_FILE}")
        for row, start_s in read_timed_steps(path):
            role = role_at(changes, start_s)
            if role.takes_prefill:
                prefill_rows.append(row)
            if role.takes_decode:
                decode_rows.append(row)
    return prefill_rows, decode_rows


def _logs(directory: Path, instance: str) -> list[Path]:
    paths = sorted(directory.glob(f"steps-{instance}.csv"))
    if not paths:
        raise ValueError(f"{directory}: no steps-{instance}.csv step logs (set "
                         f"{STEP_LOG_ENV})")
    return paths
