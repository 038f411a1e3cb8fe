"""The start-up profile measured in the background while the server already serves.

`pdserve serve` with no `--perf-model` and no cached profile starts on a provisional model
(`provisional_model.py`) and measures the real one here: `BackgroundProfile.run` starts a
child process (spawned: the server has threads) at the lowest CPU priority (`nice` 19), so
the workers, which compete for the same cores, take the CPU whenever they have work and the
profile gets what they leave. A busy machine therefore delays the profile, not the service.
The child measures CPU time, not wall time (`start_up_profile(clock=time.thread_time)`): a
point preempted by a busy worker measures what it would on an idle core.

The result goes to `on_ready(model, origin)`; an exception in the child, a child that dies,
or one that does not finish within `timeout_s` goes to `on_failed(message)`. Cancelling
`run` (the server stops) kills the child. Progress lines are logged by the child, on the
`pdserve.engine` logger at the parent's level.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

from pdserve.perf.fitted import PerfModel

log = logging.getLogger("pdserve.engine")

# what the child runs: measure (given a progress callback) -> (model, where it came from)
Measure = Callable[..., tuple[PerfModel, str]]
LOWEST_PRIORITY = 19


def _child(measure: Measure, connection: Connection, niceness: int, log_level: int) -> None:
    """The child process: lower its priority, measure, send ("ok", model, origin) or
    ("error", message)."""
    if niceness and hasattr(os, "nice"):
        os.nice(niceness)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pdserve").setLevel(log_level)
    try:
        model, origin = measure(progress=lambda message: log.info("start-up profile: %s",
                                                                  message))
        connection.send(("ok", model, origin))
    except Exception as err:  # reported to the server, which keeps serving
        log.debug("start-up profile failed:\n%s", traceback.format_exc())
        connection.send(("error", f"{type(err).__name__}: {err}"))
    finally:
        connection.close()


class BackgroundProfile:
    def __init__(self, measure: Measure, on_ready: Callable[[PerfModel, str], None],
                 on_failed: Callable[[str], None], niceness: int = LOWEST_PRIORITY,
                 timeout_s: float = 3600.0) -> None:
        """`measure` is called in the child as `measure(progress=callback)` (it must pickle:
        a module-level function, or a `functools.partial` of one)."""
        self.measure = measure
        self.on_ready = on_ready
        self.on_failed = on_failed
        self.niceness = niceness
        self.timeout_s = timeout_s
        self.started_s = 0.0

    async def run(self) -> None:
        """Measure in the child and report the outcome; kill the child if cancelled."""
        context = multiprocessing.get_context("spawn")
        receiver, sender = context.Pipe(duplex=False)
        process = context.Process(
            target=_child, name="pdserve-start-up-profile", daemon=True,
            args=(self.measure, sender, self.niceness,
                  logging.getLogger("pdserve").getEffectiveLevel()))
        self.started_s = time.monotonic()
        process.start()
        sender.close()
        log.info("start-up profile: measuring in the background (pid %d, nice %d); serving "
                 "on the provisional model meanwhile", process.pid, self.niceness)
        try:
            outcome = await asyncio.wait_for(self._receive(receiver), self.timeout_s)
        except TimeoutError:
            outcome = ("error", f"not done after {self.timeout_s:g}s")
        except EOFError:
            process.join(5)
            outcome = ("error", f"the profile process exited (code {process.exitcode}) "
                       f"without a result")
        finally:  # cancelled, timed out or done (the result is sent, the file saved):
            receiver.close()  # nothing more is needed of the child
            if process.is_alive():
                process.kill()
            process.join(5)
        if outcome[0] == "ok":
            _, model, origin = outcome
            self.on_ready(model, f"{origin} ({time.monotonic() - self.started_s:.0f}s in the "
                          f"background)")
        else:
            self.on_failed(outcome[1])

    @staticmethod
    async def _receive(receiver: Connection) -> tuple:
        """The child's one message, read when the pipe is readable (no thread blocks)."""
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        loop.add_reader(receiver.fileno(), lambda: readable.done() or readable.set_result(None))
        try:
            await readable
        finally:
            loop.remove_reader(receiver.fileno())
        return receiver.recv()  # EOFError: the child died before sending
