"""Calibrate from your own deployment: a live run's step-log directory -> the performance
model file `pdserve simulate --perf-model` and `pdserve serve --perf-model` read
(`pdserve profile --from-step-log DIR`).

A deployment served with `PDSERVE_STEP_LOG=DIR` leaves in DIR (`perf/step_log.py`,
`live/timeline.py`): each worker's batches with their periods (`steps-<i>.csv`), the roles
over time (`roles-driver.csv`), per request when its first token reached the driver
(`requests-driver.csv`) and when the HTTP server received it and sent its first text
(`responses-server.csv`), and the performance model the deployment ran on
(`perf-model-driver.json`). From them:

- the step costs: prefill fitted to the batches run in a role that prefills, decode to those
  in a role that decodes (a colocated deployment: one fit over every batch), with the
  super-linear decode term (`fit.fit_steps`) and the prefill batches' spread;
- the control plane's latency: per streamed request, (admission - the server's receipt) +
  (first text sent - end of the batch that made its first token), what lies outside the
  steps the simulator models (HTTP, tokenizing, pipes, streaming); its median and P90 go
  into the model file (`PerfModel.control_latency_s`), which the simulator adds;
- KV capacity, KV bytes per token and the transfer cost: the deployment's own model's (a
  step log holds no transfers), or `base`'s;
- warnings where the log cannot support the fit: a cost per token or per sequence fitted as
  0 (the non-negative fit's floor: the log's batches do not separate it from the fixed
  cost), or decode batches logged only up to a few sequences. A calibration at a light load
  (decode batches 1-3) fitted both as 0 and priced a 50-sequence batch as a 1-sequence
  one: capacity 15.4 req/s, where the live deployment collapsed at 11.6
  (`docs/results/fidelity.md`).

`docs/results/fidelity.md` measures it on a workload not used to fit it.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from pdserve.perf.fitted import PerfModel
from pdserve.perf.step_log import (
    PERF_MODEL_FILE,
    REQUESTS_FILE,
    RESPONSES_FILE,
    STEP_LOG_ENV,
    StepRow,
    fit_sides,
    read_role_log,
    rows_by_side,
)

# a log whose largest decode batch is below this leaves the per-sequence cost to extrapolation
NARROW_DECODE_BATCH = 8
# decode batch sizes the fit is checked on (the step log's decode-only batches, mean period
# against the model's mean, per range)
CHECK_BATCHES = ((1, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 128), (129, 1 << 20))


@dataclass(frozen=True)
class ControlLatency:
    median_s: float
    p90_s: float
    requests: int


@dataclass(frozen=True)
class BatchCheck:
    """Decode-only batches of `min_batch`..`max_batch` sequences: how many, their mean
    logged period, the fitted model's mean for the same batches."""

    min_batch: int
    max_batch: int
    batches: int
    logged_mean_s: float
    model_mean_s: float


@dataclass(frozen=True)
class Calibration:
    model: PerfModel
    prefill_rows: int  # batches the prefill side was fitted to
    decode_rows: int
    per_role: bool  # fitted per role (a role log with prefill and decode roles)
    base_origin: str  # where the KV and transfer figures came from
    control: ControlLatency | None  # None: the run logged no server responses
    decode_check: tuple[BatchCheck, ...]
    warnings: tuple[str, ...] = ()  # where the log cannot support the fit (the docstring)


def control_latency(directory: Path) -> ControlLatency | None:
    """The control plane's latency of the streamed requests logged under `directory`
    (median, P90), None when it logged none (a run without the HTTP server, or from
    before the server logged its side)."""
    responses_path, requests_path = directory / RESPONSES_FILE, directory / REQUESTS_FILE
    if not responses_path.exists() or not requests_path.exists():
        return None
    driver = {int(r["request_id"]): (r["admitted_s"], r["batch_end_s"])
              for r in _records(requests_path, ("request_id", "admitted_s", "batch_end_s"))}
    latencies: list[float] = []
    for record in _records(responses_path, ("request_id", "received_s", "first_sent_s")):
        row = driver.get(int(record["request_id"]))
        if row is None:  # failed before its first token
            continue
        admitted_s, batch_end_s = float(row[0]), float(row[1])
        received_s, sent_s = float(record["received_s"]), float(record["first_sent_s"])
        latencies.append(max(0.0, admitted_s - received_s) + max(0.0, sent_s - batch_end_s))
    if not latencies:
        return None
    values = np.asarray(latencies)
    return ControlLatency(float(np.percentile(values, 50)), float(np.percentile(values, 90)),
                          len(latencies))


def calibrate(directory: Path, base: PerfModel | None = None,
              progress: Callable[[str], None] = lambda _: None) -> Calibration:
    """The performance model of the deployment whose step logs are under `directory`
    (see the module's docstring); `base`: the model whose KV and transfer figures to keep
    (default: the one the deployment logged it ran on). Raises ValueError, saying what
    is wrong, for a directory that is missing, empty or holds malformed logs."""
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such directory (a step log is the directory a "
                         f"deployment served with {STEP_LOG_ENV}=DIR wrote)")
    steps = sorted(directory.glob("steps-*.csv"))
    if not steps:
        raise ValueError(f"{directory}: no steps-<instance>.csv step logs; serve with "
                         f"{STEP_LOG_ENV}={directory} and send it traffic first")
    base, base_origin = _base(directory, base)
    roles = read_role_log(directory)
    per_role = any(not (role.takes_prefill and role.takes_decode)
                   for changes in roles.values() for _, role in changes)
    prefill_rows, decode_rows = rows_by_side(directory)
    progress(f"read {directory}: " + ", ".join(f"{path.name}" for path in steps)
             + (f"; roles from {len(roles)} instances" if roles else "; no role log: one fit "
                "over every worker's batches"))
    progress(f"{len(prefill_rows)} batches on the prefill side"
             + ("" if decode_rows is prefill_rows else f", {len(decode_rows)} on the decode "
                "side"))
    for side, rows in (("prefill", prefill_rows), ("decode", decode_rows)):
        if len(rows) < 6:
            raise ValueError(f"{directory}: only {len(rows)} batches on the {side} side; "
                             f"a fit needs at least 6 (serve more traffic with "
                             f"{STEP_LOG_ENV} set)")
    if not any(row[2] > 0 for row in prefill_rows):
        raise ValueError(f"{directory}: no batch with prefill work was logged")
    if not any(row[0] > 0 for row in decode_rows):
        raise ValueError(f"{directory}: no batch with decodes was logged")
    how = (f"fitted {'per role ' if per_role else ''}to the step logs in {directory.name}")
    model = fit_sides(base, how, prefill_rows, decode_rows)
    model = replace(model, name=f"{base.name}, {how}" if base_origin == "--base" else
                    f"in situ: {how}")
    control = control_latency(directory)
    if control is not None:
        model = replace(model, control_latency_s=control.median_s,
                        control_latency_p90_s=control.p90_s)
    return Calibration(model, len(prefill_rows), len(decode_rows), per_role, base_origin,
                       control, decode_check(decode_rows, model),
                       fit_warnings(model, prefill_rows, decode_rows))


def fit_warnings(model: PerfModel, prefill_rows: list[StepRow],
                 decode_rows: list[StepRow]) -> tuple[str, ...]:
    """What in `model`'s fit the logged batches do not support (see the module docstring)."""
    sizes = sorted({int(row[2]) for row in prefill_rows if row[2] > 0})
    largest = max((int(row[0]) for row in decode_rows), default=0)
    warnings = []
    if sizes and (model.prefill.per_token_s == 0 or len(sizes) < 2
                  or sizes[-1] < 2 * sizes[0]):
        warnings.append(f"prefill batches of {sizes[0]}-{sizes[-1]} tokens were logged (cost "
                        f"per token fitted {model.prefill.per_token_s * 1e6:.3f} us): they do "
                        f"not separate it from the fixed cost, so other prompt lengths are "
                        f"priced by extrapolation")
    if model.decode.per_seq_s == 0 and model.decode.per_seq_squared_s == 0:
        warnings.append(f"the decode cost per sequence was fitted as 0 (decode batches of "
                        f"up to {largest} logged): a larger batch is priced as a batch of 1")
    if largest < NARROW_DECODE_BATCH:
        warnings.append(f"decode batches of at most {largest} sequences were logged: "
                        f"larger batches are extrapolated")
    if warnings:
        warnings.append("calibrate at a load that reaches the batch sizes and prompt "
                        "lengths you will simulate")
    return tuple(warnings)


def decode_check(rows: list[StepRow], model: PerfModel) -> tuple[BatchCheck, ...]:
    """The decode-only batches per batch-size range: logged mean period and the model's."""
    checks: list[BatchCheck] = []
    for low, high in CHECK_BATCHES:
        chosen = [(int(b), int(c), s) for b, c, tokens, _, s in rows
                  if tokens == 0 and low <= b <= high]
        if chosen:
            checks.append(BatchCheck(
                low, min(high, max(b for b, _, _ in chosen)), len(chosen),
                float(np.mean([s for _, _, s in chosen])),
                float(np.mean([model.decode.step_s(b, c) for b, c, _ in chosen]))))
    return tuple(checks)


def _base(directory: Path, base: PerfModel | None) -> tuple[PerfModel, str]:
    if base is not None:
        return base, "--base"
    logged = directory / PERF_MODEL_FILE
    if not logged.exists():
        raise ValueError(f"{directory}: no {PERF_MODEL_FILE} (the model the deployment ran "
                         f"on, logged since the server writes it): give --base FILE, a "
                         f"performance model of the served engine, for its KV capacity and "
                         f"transfer cost")
    return PerfModel.load(logged), str(logged)


def _records(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    """A timeline CSV's rows, each checked to hold `columns` as numbers."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in columns if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{path}: no {', '.join(missing)} column (expected "
                             f"{', '.join(columns)})")
        records = list(reader)
    for line, record in enumerate(records, start=2):
        try:
            int(record[columns[0]])
            for column in columns[1:]:
                if not math.isfinite(float(record[column])):
                    raise ValueError(f"{column} is not finite")
        except (TypeError, ValueError):
            raise ValueError(f"{path}: line {line} is not a timeline row: {record}") from None
    return records
