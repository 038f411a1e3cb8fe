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
flips roles can be fitted per role (`perf.step_log.fit_step_log_by_role`).
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from pdserve.perf.step_log import ROLE_COLUMNS, ROLES_FILE, STEP_LOG_ENV
from pdserve.types import Role

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
        roles_path = directory / ROLES_FILE
        new = not roles_path.exists()
        self._roles_file: TextIO = roles_path.open("a", newline="")
        self._roles = csv.writer(self._roles_file)
        if new:
            self._roles.writerow(ROLE_COLUMNS)

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
