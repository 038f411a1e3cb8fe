"""Where a live request's time to first token goes, for the fidelity benchmarks.

With `PDSERVE_STEP_LOG=DIR` set (as for the workers' step logs, `perf/step_log.py`), the
driver appends one row per request to `DIR/requests-driver.csv` when its first token
arrives: its id (the number in the response's `cmpl-N` id), when the driver admitted it,
when the worker that produced the first token finished that batch (`StepDone.sent_s`), and
when the driver received it. All times are `time.monotonic()`, one clock for every process
on the machine, so a client in another process can line its own send and receive times up
with them: what lies between admission and the batch's end is what the simulator models
(queueing and compute); the rest (HTTP, tokenizing, pipes, streaming) is the control
plane's latency, the config's `sim.control_latency_s`.

It also logs the roles the instances start with and every flip, with the same clock, to
`DIR/roles-driver.csv` (`perf.step_log.ROLES_FILE`), so the step logs of a policy that
flips roles can be fitted per role (`perf.step_log.fit_step_log_by_role`); the HTTP server's
side of each streamed request (when it received it, when it sent its first text) to
`DIR/responses-server.csv`, so the control plane's latency is measured without the client's
clock (`perf.in_situ.control_latency`); and the performance model the driver runs on to
`DIR/perf-model-driver.json`, whose KV and transfer figures a fit of the step logs keeps
(`pdserve profile --from-step-log`).
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from pdserve.perf.fitted import PerfModel
from pdserve.perf.step_log import (
    PERF_MODEL_FILE,
    REQUEST_COLUMNS,
    REQUESTS_FILE,
    RESPONSE_COLUMNS,
    RESPONSES_FILE,
    ROLE_COLUMNS,
    ROLES_FILE,
    STEP_LOG_ENV,
)
from pdserve.types import Role


class RequestTimeline:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory
        self._file, self._writer = _appender(directory / REQUESTS_FILE, REQUEST_COLUMNS)
        self._roles_file, self._roles = _appender(directory / ROLES_FILE, ROLE_COLUMNS)
        self._responses_file, self._responses = _appender(directory / RESPONSES_FILE,
                                                          RESPONSE_COLUMNS)

    @classmethod
    def from_env(cls, roles: Sequence[Role] = ()) -> RequestTimeline | None:
        """The timeline when `STEP_LOG_ENV` asks for one; `roles`: the instances' roles at
        the start, logged now."""
        directory = os.environ.get(STEP_LOG_ENV)
        if not directory:
            return None
        timeline = cls(Path(directory))
        for instance_id, role in enumerate(roles):
            timeline.role(instance_id, role, time.monotonic())
        return timeline

    def first_token(self, request_id: int, admitted_s: float, batch_end_s: float,
                    received_s: float) -> None:
        self._writer.writerow((request_id, f"{admitted_s:.6f}", f"{batch_end_s:.6f}",
                               f"{received_s:.6f}"))
        self._file.flush()

    def role(self, instance_id: int, role: Role, at_s: float) -> None:
        """`instance_id` holds `role` from `at_s` (`time.monotonic()`) on."""
        self._roles.writerow((f"{at_s:.6f}", instance_id, role.value))
        self._roles_file.flush()

    def first_sent(self, request_id: int, received_s: float, sent_s: float) -> None:
        """The HTTP server received request `request_id` (the driver's first-attempt id) at
        `received_s` and wrote its first text to the stream at `sent_s`."""
        self._responses.writerow((request_id, f"{received_s:.6f}", f"{sent_s:.6f}"))
        self._responses_file.flush()

    def perf_model(self, perf: PerfModel) -> None:
        """The driver runs on `perf` from now on (the last one written is the one kept)."""
        perf.save(self._directory / PERF_MODEL_FILE)


def _appender(path: Path, columns: Sequence[str]) -> tuple[TextIO, Any]:
    """A CSV file opened to append to, with its header when it is new."""
    new = not path.exists()
    handle: TextIO = path.open("a", newline="")
    writer = csv.writer(handle)
    if new:
        writer.writerow(columns)
    return handle, writer


def read_timeline(directory: Path) -> dict[int, tuple[float, float, float]]:
    """request id -> (admitted, batch end, driver received) from `requests-driver.csv`."""
    rows: dict[int, tuple[float, float, float]] = {}
    path = directory / REQUESTS_FILE
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
