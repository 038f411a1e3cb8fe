"""Worker processes and their pipes, wired into an asyncio event loop.

Spawns one process per instance (`spawn` start method: each loads torch itself), waits for
every `WorkerReady`, then hands each message to `on_message` from the loop (`add_reader` on
the pipe) and reports an exit (the process sentinel, or a broken pipe) once to `on_exit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.instance.stats import InstanceStats
from pdserve.live.messages import Command, Shutdown, WorkerReady
from pdserve.live.worker import worker_main


@dataclass(frozen=True)
class WorkerSettings:
    model: str = "tiny"
    seed: int = 0
    kv_blocks: int = 2048
    chunk_size_tokens: int = 512
    max_batch_size: int = 64
    start_timeout_s: float = 120.0


class WorkerProcesses:
    def __init__(self, settings: WorkerSettings, count: int) -> None:
        self.settings = settings
        self.count = count
        self.exited: set[int] = set()
        self._context = multiprocessing.get_context("spawn")
        self._processes: list = []
        self._pipes: list = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_exit: Callable[[int], None] = lambda instance: None

    async def start(self, on_message: Callable[[object], None],
                    on_exit: Callable[[int], None]) -> list[InstanceStats]:
        """Start every worker; returns their first stats. Raises if one does not start."""
        self._loop, self._on_exit = asyncio.get_running_loop(), on_exit
        s = self.settings
        for i in range(self.count):
            parent, child = self._context.Pipe()
            process = self._context.Process(
                target=worker_main, name=f"pdserve-worker-{i}", daemon=True,
                args=(i, s.model, s.seed, s.kv_blocks, s.chunk_size_tokens, s.max_batch_size,
                      child))
            process.start()
            child.close()
            self._processes.append(process)
            self._pipes.append(parent)
        deadline = time.monotonic() + s.start_timeout_s
        stats = []
        for i, pipe in enumerate(self._pipes):
            if not await asyncio.to_thread(pipe.poll, max(0, deadline - time.monotonic())):
                await self.stop()
                raise RuntimeError(f"worker {i} did not start within {s.start_timeout_s:.0f}s")
            message = pipe.recv()
            assert isinstance(message, WorkerReady)
            stats.append(message.stats)
        for i, pipe in enumerate(self._pipes):
            self._loop.add_reader(pipe.fileno(), self._drain, i, on_message)
            self._loop.add_reader(self._processes[i].sentinel, self._exited, i)
        return stats

    def _drain(self, instance: int, on_message: Callable[[object], None]) -> None:
        pipe = self._pipes[instance]
        try:
            while pipe.poll():
                on_message(pipe.recv())
        except (EOFError, OSError):
            self._exited(instance)

    def _exited(self, instance: int) -> None:
        if instance in self.exited:
            return
        self.exited.add(instance)
        if self._loop is not None:
            self._loop.remove_reader(self._pipes[instance].fileno())
            self._loop.remove_reader(self._processes[instance].sentinel)
        self._on_exit(instance)

    def send(self, instance: int, command: Command) -> None:
        if instance in self.exited:
            return
        try:
            self._pipes[instance].send(command)
        except OSError:
            self._exited(instance)

    def pid(self, instance: int) -> int:
        return self._processes[instance].pid

    async def stop(self) -> None:
        for i, pipe in enumerate(self._pipes):
            if i not in self.exited and self._loop is not None:
                self._loop.remove_reader(pipe.fileno())
                self._loop.remove_reader(self._processes[i].sentinel)
            with contextlib.suppress(OSError):  # a dead worker's pipe is closed
                pipe.send(Shutdown())
        for process in self._processes:
            await asyncio.to_thread(process.join, 10)
            if process.is_alive():
                process.kill()
