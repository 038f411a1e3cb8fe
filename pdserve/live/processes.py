"""Worker processes and their pipes, wired into an asyncio event loop, and their supervisor.

Starts one process per instance from a fork server that has imported torch and the worker
code once (`worker_context`): workers start without importing torch again and share those
pages copy-on-write, which with the shared weight file keeps N workers' memory well under N
times one's. Each worker gets the parent's environment as it is when the worker starts
(a fork server's own would be that of its first use). Then waits for
every `WorkerReady`, then hands each message to `on_message` from the loop (`add_reader` on
the pipe) and reports an exit (the process sentinel, or a broken pipe) once to `on_exit`,
after handing over whatever the worker wrote before it died.

Supervision: a worker that exits is restarted after a back-off (`restart_backoff_s`,
doubling with each restart still inside the budget window, capped at
`restart_backoff_max_s`), with a fresh KV pool; `on_ready` reports it back. A worker that
exits more than `max_restarts` times within `restart_window_s` stays dead, as does one that
does not start within `start_timeout_s`; a scaled-up worker (`start_worker`) that never
comes up is then reported through `on_exit`, so the scheduler stops waiting for it. The
dead worker's shared KV segment is unlinked.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing import shared_memory

from pdserve.engine.device import EngineDevice
from pdserve.instance.decode_forecast import ForecastSettings
from pdserve.instance.queue_order import FCFSOrder, QueueOrder
from pdserve.instance.stats import InstanceStats
from pdserve.perf.fitted import PerfModel
from pdserve.worker.messages import Command, ForgetPool, Shutdown, WorkerReady
from pdserve.worker.worker import worker_main


@dataclass(frozen=True)
class WorkerSettings:
    """What each worker runs with. The first fields are the config's (`pdserve serve`
    builds them, `server/launch.py`; the path beside each), so they have no defaults here;
    the supervision limits at the end are the worker pool's own."""

    model: str  # engine.weights
    seed: int  # seed
    kv_blocks: int  # engine.kv_blocks, resolved (`server.launch.kv_blocks_for`)
    chunk_size_tokens: int  # instance.chunk_size_tokens
    max_batch_size: int  # instance.max_batch_size
    phase_priority: str  # the policy's (`Policy.phase_priority`, policy.phase_priority)
    prefix_block_tokens: int  # instance.prefix_block_tokens; 0: no prefix cache
    queue_order: Callable[[], QueueOrder] = FCFSOrder  # the policy's (`Policy.queue_order`)
    perf: PerfModel | None = None  # for orders that read prefill estimates (AMPD's Alg. 2)
    decode_forecast: ForecastSettings | None = None  # the policy's (ARES); None: none kept
    device: EngineDevice | None = None  # the engine's device and dtype (None: CPU float32)
    kv_block_bytes: int = 0  # bytes of one KV block (the transfer metrics'; 0: not counted)
    start_timeout_s: float = 120.0
    max_restarts: int = 5  # per worker within restart_window_s; 0 disables restarts
    restart_window_s: float = 600.0
    restart_backoff_s: float = 0.5
    restart_backoff_max_s: float = 8.0


class StartupError(RuntimeError):
    """A start-up that cannot go on, for a reason its message states in full (the server
    logs it as one line, not a traceback)."""


class WorkerState(enum.Enum):
    STARTING = "starting"
    LIVE = "live"
    RESTARTING = "restarting"  # exited; a new process is due or starting
    DEAD = "dead"  # out of restarts
    STOPPED = "stopped"  # stopped on the scheduler's request (elastic scaling), no process


@dataclass(frozen=True)
class WorkerPlacement:
    """Where an instance's worker runs, for workers hosted on a cluster (`--ray`)."""

    node_id: str = ""  # the node of its live worker ("": none live)
    node_ip: str = ""
    waiting_for_resources: str = ""  # why its (re)start cannot be placed yet; "": it is not


ExitHandler = Callable[[int, int | None], None]  # instance, exit code
ReadyHandler = Callable[[int, InstanceStats, str], None]  # instance, first stats, pool name


WORKER_PRELOAD = ["pdserve.live.preload"]


def worker_context() -> multiprocessing.context.BaseContext:
    """The start method for worker processes: a fork server that preloads torch and the
    worker code (where the platform has one), else `spawn`."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WORKER_PRELOAD)
    return context


def _reap(process: multiprocessing.process.BaseProcess) -> None:
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(1)


class WorkerProcesses:
    def __init__(self, settings: WorkerSettings, count: int) -> None:
        self.settings = settings
        self.count = count
        self.states = [WorkerState.STARTING] * count
        self.restarts_total = 0
        self._restart_times: list[deque[float]] = [deque() for _ in range(count)]
        self._context = worker_context()
        self._processes: list = [None] * count
        self._pipes: list = [None] * count
        self._pool_names: list[str] = [""] * count
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_message: Callable[[object], None] = lambda message: None
        self._on_exit: ExitHandler = lambda instance, code: None
        self._on_ready: ReadyHandler = lambda instance, stats, pool: None
        self._timers: list[asyncio.TimerHandle | None] = [None] * count
        self._stopping = False
        self._scaling_up: set[int] = set()  # started by `start_worker`, not yet ready

    @property
    def exited(self) -> set[int]:
        """Instances not serving now (restarting, dead or stopped)."""
        return {i for i, state in enumerate(self.states) if state is not WorkerState.LIVE}

    def _spawn(self, instance: int) -> None:
        s = self.settings
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=worker_main, name=f"pdserve-worker-{instance}", daemon=True,
            args=(instance, s.model, s.seed, s.kv_blocks, s.chunk_size_tokens,
                  s.max_batch_size, child, s.phase_priority, s.prefix_block_tokens,
                  dict(os.environ), s.queue_order, s.perf, s.decode_forecast, s.device))
        process.start()
        child.close()
        self._processes[instance], self._pipes[instance] = process, parent

    async def start(self, on_message: Callable[[object], None], on_exit: ExitHandler,
                    on_ready: ReadyHandler, stopped: Collection[int] = ()
                    ) -> list[InstanceStats]:
        """Start every worker but the `stopped` ones; returns their first stats (an empty
        load for a stopped one). Raises if one does not start."""
        self._loop = asyncio.get_running_loop()
        self._on_message, self._on_exit, self._on_ready = on_message, on_exit, on_ready
        s = self.settings
        running = [i for i in range(self.count) if i not in stopped]
        stats = [InstanceStats.empty(i, s.kv_blocks) for i in range(self.count)]
        try:  # whatever ends the start (a worker that fails, a signal): stop what started
            for i in running:
                self._spawn(i)
            deadline = time.monotonic() + s.start_timeout_s
            for i in running:
                pipe = self._pipes[i]
                if not await self._ready_within(pipe, deadline - time.monotonic()):
                    raise StartupError(f"worker {i} did not start within "
                                       f"{s.start_timeout_s:.0f}s")
                try:
                    message = pipe.recv()
                except (EOFError, OSError) as err:
                    raise StartupError(f"worker {i} ended before it was ready: "
                                       f"{err or 'its pipe closed'}") from err
                assert isinstance(message, WorkerReady)
                stats[i] = message.stats
                self._pool_names[i] = message.pool_name
        except BaseException:
            await asyncio.shield(self.stop())
            raise
        for i in range(self.count):
            if i in running:
                self._watch(i)
            else:
                self.states[i] = WorkerState.STOPPED
        return stats

    async def _ready_within(self, pipe, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
        """Whether the worker's first message arrives within `timeout_s`, waited for on
        the event loop (so a cancelled start-up stops waiting at once)."""
        assert self._loop is not None
        if pipe.poll():
            return True
        arrived = self._loop.create_future()
        self._loop.add_reader(pipe.fileno(), lambda: arrived.done() or arrived.set_result(True))
        try:
            await asyncio.wait_for(arrived, max(0.0, timeout_s))
            return True
        except TimeoutError:
            return False
        finally:
            self._loop.remove_reader(pipe.fileno())

    def _watch(self, instance: int) -> None:
        assert self._loop is not None
        self.states[instance] = WorkerState.LIVE
        self._loop.add_reader(self._pipes[instance].fileno(), self._drain, instance)
        self._loop.add_reader(self._processes[instance].sentinel, self._exited, instance)

    def _drain(self, instance: int) -> None:
        pipe = self._pipes[instance]
        try:
            while pipe.poll():
                self._on_message(pipe.recv())
        except (EOFError, OSError):
            self._exited(instance)

    def _exited(self, instance: int) -> None:
        if self.states[instance] is not WorkerState.LIVE or self._stopping:
            return
        assert self._loop is not None
        self._loop.remove_reader(self._pipes[instance].fileno())
        self._loop.remove_reader(self._processes[instance].sentinel)
        with contextlib.suppress(EOFError, OSError):  # what it wrote before dying counts
            while self._pipes[instance].poll():
                self._on_message(self._pipes[instance].recv())
        process = self._processes[instance]
        process.join(1)
        self._unlink_pool(instance)
        self.states[instance] = (WorkerState.RESTARTING if self._may_restart(instance)
                                 else WorkerState.DEAD)
        self._on_exit(instance, process.exitcode)
        if self.states[instance] is WorkerState.RESTARTING and not self._stopping:
            self._schedule_restart(instance)

    def _unlink_pool(self, instance: int) -> None:
        name, self._pool_names[instance] = self._pool_names[instance], ""
        if name:
            with contextlib.suppress(FileNotFoundError):
                segment = shared_memory.SharedMemory(name=name)
                segment.close()
                segment.unlink()
            for other, state in enumerate(self.states):  # peers that mapped it unmap it
                if state is WorkerState.LIVE and other != instance:
                    self.send(other, ForgetPool(name))

    def pool_name(self, instance: int) -> str:
        return self._pool_names[instance]

    # ---- restarts ----
    def _may_restart(self, instance: int) -> bool:
        s, times, now = self.settings, self._restart_times[instance], time.monotonic()
        while times and times[0] < now - s.restart_window_s:
            times.popleft()
        return len(times) < s.max_restarts

    def _schedule_restart(self, instance: int) -> None:
        s, times = self.settings, self._restart_times[instance]
        delay = min(s.restart_backoff_s * 2 ** len(times), s.restart_backoff_max_s)
        times.append(time.monotonic())
        assert self._loop is not None
        self._timers[instance] = self._loop.call_later(delay, self._restart, instance)

    def _restart(self, instance: int, counted: bool = True) -> None:
        assert self._loop is not None
        self._timers[instance] = None
        if self._stopping:
            return
        if self._pipes[instance] is not None:
            self._pipes[instance].close()
        self._spawn(instance)
        self.restarts_total += counted
        self._loop.add_reader(self._pipes[instance].fileno(), self._first_message, instance)
        self._timers[instance] = self._loop.call_later(
            self.settings.start_timeout_s, self._start_failed, instance)

    def _first_message(self, instance: int) -> None:
        assert self._loop is not None
        pipe = self._pipes[instance]
        self._loop.remove_reader(pipe.fileno())
        timer, self._timers[instance] = self._timers[instance], None
        if timer is not None:
            timer.cancel()
        if self._stopping:
            return
        try:
            message = pipe.recv()
        except (EOFError, OSError):
            message = None
        if not isinstance(message, WorkerReady):  # died while starting: counts as an exit
            self._start_failed(instance)
            return
        self._pool_names[instance] = message.pool_name
        self._scaling_up.discard(instance)
        self._watch(instance)
        self._on_ready(instance, message.stats, message.pool_name)

    def _start_failed(self, instance: int) -> None:
        assert self._loop is not None
        self._timers[instance] = None
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self._pipes[instance].fileno())
        process = self._processes[instance]
        if process.is_alive():
            process.kill()
        process.join(1)
        if self._may_restart(instance) and not self._stopping:
            self._schedule_restart(instance)
        else:
            self.states[instance] = WorkerState.DEAD
            if instance in self._scaling_up and not self._stopping:  # never came up
                self._scaling_up.discard(instance)
                self._on_exit(instance, process.exitcode)

    # ---- elastic scaling ----
    def stop_worker(self, instance: int) -> None:
        """End a worker the scheduler no longer needs (it holds no work): a clean shutdown,
        no exit report, no restart; its KV pool is freed."""
        if self.states[instance] is not WorkerState.LIVE or self._loop is None:
            return
        self.states[instance] = WorkerState.STOPPED  # its exit is not a failure
        self._loop.remove_reader(self._pipes[instance].fileno())
        self._loop.remove_reader(self._processes[instance].sentinel)
        with contextlib.suppress(OSError, ValueError):
            self._pipes[instance].send(Shutdown())
        self._unlink_pool(instance)
        process = self._processes[instance]
        self._loop.run_in_executor(None, _reap, process)

    def start_worker(self, instance: int) -> None:
        """Start a stopped worker; `on_ready` reports it once it serves."""
        if self.states[instance] is WorkerState.STOPPED and not self._stopping:
            self.states[instance] = WorkerState.STARTING
            self._scaling_up.add(instance)
            self._restart(instance, counted=False)

    # ---- commands ----
    def send(self, instance: int, command: Command) -> None:
        if self.states[instance] is not WorkerState.LIVE or self._stopping:
            return
        try:
            self._pipes[instance].send(command)
        except OSError:
            self._exited(instance)

    def placements(self) -> list[WorkerPlacement]:
        """Each instance's placement on a cluster; none for processes on this host."""
        return []

    def pid(self, instance: int) -> int:
        """The worker's process id; 0 for one never started."""
        process = self._processes[instance]
        return process.pid if process is not None else 0

    async def stop(self) -> None:
        """Shut every worker down (no restarts, no exit reports from here on)."""
        self._stopping = True
        for i, timer in enumerate(self._timers):
            if timer is not None:
                timer.cancel()
                self._timers[i] = None
        for i, pipe in enumerate(self._pipes):
            if pipe is None:
                continue
            if self.states[i] is WorkerState.LIVE and self._loop is not None:
                self._loop.remove_reader(pipe.fileno())
                self._loop.remove_reader(self._processes[i].sentinel)
            with contextlib.suppress(OSError, ValueError):  # a dead worker's pipe is closed
                pipe.send(Shutdown())
        for i, process in enumerate(self._processes):
            if process is None:
                continue
            if self.states[i] not in (WorkerState.STARTING, WorkerState.RESTARTING):
                # (a worker still starting reads no command: it is killed at once)
                await asyncio.to_thread(process.join, 10)
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join, 1)
