"""Where a live request's time to first token goes, for the fidelity benchmarks.

With `PDSERVE_STEP_LOG=DIR` set (as for the workers' step logs, `perf/step_log.py`), the
driver appends one row per request to `DIR/requests-driver.csv` when its first token
arrives: its id (the number in the response's `cmpl-N` id), when the driver admitted it,
when the worker that produced the first token finished that batch (`StepDone.sent_s`), and
when the driver received it. All times are `time.monotonic()`, one clock for every process
on the machine, so a client in another process can line its own send and receive times up
with them: what lies between admission and the batch's end is what the simulator models
(queueing and compute); the rest (HTTP, tokenizing, pipes, streaming) is the control
plane's latency, `SimConfig.control_latency_s`.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import TextIO

from pdserve.perf.step_log import STEP_LOG_ENV

COLUMNS = ("request_id", "admitted_s", "batch_end_s", "driver_received_s")


class RequestTimeline:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "requests-driver.csv"
        new = not path.exists()
        self._file: TextIO = path.open("a", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(COLUMNS)

    @classmethod
    def from_env(cls) -> RequestTimeline | None:
        directory = os.environ.get(STEP_LOG_ENV)
        return cls(Path(directory)) if directory else None

    def first_token(self, request_id: int, admitted_s: float, batch_end_s: float,
                    received_s: float) -> None:
        self._writer.writerow((request_id, f"{admitted_s:.6f}", f"{batch_end_s:.6f}",
                               f"{received_s:.6f}"))
        self._file.flush()


def read_timeline(directory: Path) -> dict[int, tuple[float, float, float]]:
    """request id -> (admitted, batch end, driver received) from `requests-driver.csv`."""
    rows: dict[int, tuple[float, float, float]] = {}
    path = directory / "requests-driver.csv"
    if path.exists():
        with path.open(newline="") as handle:
            for record in csv.DictReader(handle):
                rows[int(record["request_id"])] = (float(record["admitted_s"]),
                                                   float(record["batch_end_s"]),
                                                   float(record["driver_received_s"]))
    return rows


def split_ttft(client: dict[int, tuple[str, float, float]],
               driver: dict[int, tuple[float, float, float]]) -> dict[str, list[float]]:
    """Each request's TTFT as the client saw it, in three parts, joined by the response id
    (`cmpl-N` is the driver's request N): client send -> driver admission ("in"), admission
    -> end of the batch that made the first token ("worker": what the simulator models),
    batch end -> client receipt ("out"). `client`: request -> (response id, sent, first
    text received), as `bench.client.replay` records it."""
    split: dict[str, list[float]] = {"in": [], "worker": [], "out": []}
    for response_id, sent_s, first_s in client.values():
        number = response_id.rsplit("-", 1)[-1]
        row = driver.get(int(number)) if number.isdigit() else None
        if row is None:
            continue
        admitted_s, batch_end_s, _ = row
        split["in"].append(admitted_s - sent_s)
        split["worker"].append(batch_end_s - admitted_s)
        split["out"].append(first_s - batch_end_s)
    return split
