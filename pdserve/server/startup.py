"""How the server's start-up ends when it does not serve: it answers SIGINT and SIGTERM
at every stage, and a failure it can explain is one log line.

Uvicorn catches SIGINT and SIGTERM for its whole run, but during the application's
start-up (the lifespan, which starts the workers and joins Ray) it only notes them: the
start-up would run to its end, or forever if it never ends. `interruptible` therefore
catches them itself while `start` runs (in the main thread; elsewhere, as under a test's
server thread, signals are not this process's to take): the first one cancels `start`,
which stops what it started, and is passed on to the handler it replaced (uvicorn's, so it
exits rather than serves), and the start-up ends in `StartupInterrupted`.

A `StartupError` (this, a Ray cluster that cannot be joined, a worker that does not start)
states its cause in full, so the lifespan logs it as one line and `quiet_traceback` drops
uvicorn's traceback of the same error.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Awaitable
from types import FrameType

from pdserve.live.processes import StartupError

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StartupInterrupted(StartupError):
    """A signal stopped the start-up."""


async def interruptible(start: Awaitable[None]) -> None:
    """Await `start`; SIGINT or SIGTERM meanwhile cancels it and raises
    `StartupInterrupted`."""
    if threading.current_thread() is not threading.main_thread():
        await start
        return
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(start)
    received: list[signal.Signals] = []
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def on_signal(number: int, frame: FrameType | None) -> None:
        received.append(signal.Signals(number))
        loop.call_soon_threadsafe(task.cancel)
        handler = previous[signal.Signals(number)]
        if callable(handler) and handler is not signal.default_int_handler:
            handler(number, frame)  # uvicorn's notes it: it exits instead of serving

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    try:
        await task
    except asyncio.CancelledError:
        if not received:
            raise
        raise StartupInterrupted(f"start-up stopped by {received[0].name}; what had "
                                 f"started was stopped") from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _DropTraceback(logging.Filter):
    """Drops the next record that is a traceback ending in `error` (once)."""

    def __init__(self, logger: logging.Logger, error: BaseException) -> None:
        super().__init__()
        self.logger, self.error = logger, error

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "Traceback" in text and str(self.error) in text:
            self.logger.removeFilter(self)
            return False
        return True


def quiet_traceback(error: StartupError) -> None:
    """The error was logged in one line: uvicorn need not log its traceback."""
    logger = logging.getLogger("uvicorn.error")
    logger.addFilter(_DropTraceback(logger, error))
