"""A Ray-hosted worker's watch on what it serves for: its raylet and its driver.

A worker's actor runs one long `serve` call. If its node's raylet dies, Ray's own check
ends the process only when it can; if the driver's connection breaks, the loop ends but
the actor's process would stay (its owner's death is reported by a raylet, which may be the
dead one). Either way a worker could stay behind, holding its model and its KV pool.
`HostWatch` is a daemon thread in the actor's process that ends it: every `interval_s` it
checks that the raylet lives (RAY_RAYLET_PID, the process that started this one: this one's
parent changes the moment it dies, whether or not anyone reaps it), and `end` is called
when the driver's connection breaks. Ending removes the KV pool's shared-memory name (the
mapping stays valid for the instant left) and leaves with `os._exit`, as nothing else can
stop a thread inside a step.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from multiprocessing import shared_memory
from typing import NoReturn

from pdserve.engine.kv_pool import attach_untracked

RAYLET_PID_ENV = "RAY_RAYLET_PID"  # set by Ray in every worker process
HOST_LOST_EXIT_CODE = 75  # os.EX_TEMPFAIL: ended by its watch (a lost raylet or driver)
WATCH_INTERVAL_S = 0.5


class HostWatch:
    def __init__(self, raylet_pid: int, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.raylet_pid = raylet_pid
        self.interval_s = interval_s
        self.pool_name = ""  # the KV pool to remove on the way out, once there is one
        self._child_of_raylet = os.getppid() == raylet_pid
        self._stop = threading.Event()

    @classmethod
    def from_env(cls) -> HostWatch | None:
        """The watch of this Ray worker process (None outside one)."""
        pid = os.environ.get(RAYLET_PID_ENV, "")
        return cls(int(pid)) if pid.isdigit() and int(pid) > 0 else None

    def start(self) -> None:
        threading.Thread(target=self._run, name="pdserve-host-watch", daemon=True).start()

    def raylet_alive(self) -> bool:
        if self._child_of_raylet:
            return os.getppid() == self.raylet_pid
        try:
            os.kill(self.raylet_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        with contextlib.suppress(OSError), open(f"/proc/{self.raylet_pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.raylet_alive():
                self.end(f"its raylet (pid {self.raylet_pid}) is gone")

    def end(self, reason: str) -> NoReturn:
        """Leave now, removing the KV pool's name first."""
        print(f"pdserve worker (pid {os.getpid()}): ending: {reason}", file=sys.stderr,
              flush=True)
        if self.pool_name:
            with contextlib.suppress(OSError, ValueError):
                segment: shared_memory.SharedMemory = attach_untracked(self.pool_name)
                segment.close()
                segment.unlink()
        os._exit(HOST_LOST_EXIT_CODE)
