"""A live instance: a worker process running the shared local scheduler and the engine.

Loop: take every pending command (block only when there is nothing to run), start queued
KV transfers whose blocks are free, then plan one batch, execute it, complete it, and report
the sampled tokens with an `InstanceStats` snapshot. A first prefill that finishes is
reported with its hand-off (the driver decides where it decodes). One torch thread.

The interface is messages over one connection (`messages.py`), so a Ray actor can host the
same loop later.

Errors: an exception while running a batch fails only the request that caused it
(`batch_guard.run_guarded`; the others keep their state and tokens), reported as a
`WorkerError`; an exception handling a command fails that command's request. Before a batch
whose set of requests differs from the last one, the worker reports the set (`Executing`),
so if the process dies the driver knows which requests were running. An idle worker reports
its load (`StatsReport`) when it changed and every `IDLE_REPORT_S`.

The worker owns the requests here (by id) and the batch loop; it wires its collaborators:
`KVMoves` (hand-offs in and out, the peers' pools), `LoadReporter` (what a load report
carries and when an idle one is due), `WorkerSessions` (session histories),
`WorkerForecast` (ARES's decode-load forecast) and `ConstraintCompiles` (a request whose
structured-output constraint is new here waits for it to compile beside the loop, so a large
one does not stall the other requests' steps).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

import torch

from pdserve.engine.device import EngineDevice, limit_memory
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.transfer import attach_pool
from pdserve.instance.decode_forecast import ForecastSettings
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.phase_priority import parse_phase_priority
from pdserve.instance.prefix_cache import PrefixCache, chain_hashes
from pdserve.instance.queue_order import FCFSOrder, QueueOrder, bind_order
from pdserve.perf.fitted import PerfModel
from pdserve.perf.step_log import StepLog
from pdserve.types import Request
from pdserve.worker.batch_guard import describe, run_guarded
from pdserve.worker.constraint_compiles import ConstraintCompiles, request_of
from pdserve.worker.faults import exit_at_start_from_env, install_from_env
from pdserve.worker.forecast import WorkerForecast
from pdserve.worker.kv_moves import KVMoves, MapPeerPool
from pdserve.worker.messages import (
    AddRequest,
    AdoptKV,
    Cancel,
    Command,
    ContinueInPlace,
    Detach,
    DropHistory,
    Event,
    Executing,
    ExportHistory,
    ForgetPool,
    HistoryCopied,
    HistoryExported,
    Prefilled,
    ReleaseKV,
    SetChunk,
    SetPerfModel,
    SetPriority,
    Shutdown,
    StepDone,
    UnlockHistory,
    WorkerError,
    WorkerReady,
)
from pdserve.worker.reports import IDLE_REPORT_S, LoadReporter
from pdserve.worker.sessions import WorkerSessions

COMPILE_POLL_S = 0.01  # how often an idle worker looks for a finished constraint compile


def release_freed_memory() -> None:
    """Collect garbage and hand free heap pages back to the OS (glibc's `malloc_trim`), so
    a worker does not keep the peak of loading as resident memory."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class Worker:
    def __init__(self, instance_id: int, model_name: str, seed: int, num_blocks: int,
                 chunk_size_tokens: int, max_batch_size: int, connection: Connection,
                 phase_priority: str, prefix_block_tokens: int,
                 queue_order: Callable[[], QueueOrder] = FCFSOrder,
                 perf: PerfModel | None = None,
                 decode_forecast: ForecastSettings | None = None, pool_name: str = "",
                 device: EngineDevice | None = None,
                 map_peer_pool: MapPeerPool = attach_pool) -> None:
        """`queue_order`: the policy's prefill queue order; one that reads the time and
        prefill estimates (AMPD's Alg. 2) gets `time.monotonic` and `perf`.
        `decode_forecast`: keep ARES's decode-load forecast and report it with the stats
        (`worker/forecast.py`). `pool_name`: the KV pool's shared-memory name (default:
        from the PID and instance); `device`: the engine's device and dtype (default the
        CPU, float32); `map_peer_pool`: how another worker's pool is mapped (`kv_moves.py`;
        default from shared memory on this host)."""
        torch.set_num_threads(1)
        self.instance_id = instance_id
        self.connection = connection
        model, tokenizer = load_model(model_name, seed)
        if device is not None:
            limit_memory(device)  # this worker's share of a GPU
        self.engine = Engine(model, tokenizer, num_blocks,
                             shared_name=pool_name or f"pdserve-{os.getpid()}-{instance_id}",
                             device=device)
        install_from_env(self.engine)
        exit_at_start_from_env(instance_id)
        release_freed_memory()  # what resolving the model parsed and dropped
        self.local = LocalScheduler(
            instance_id, self.engine.allocator.num_blocks, chunk_size_tokens, max_batch_size,
            queue_order(), parse_phase_priority(phase_priority),
            PrefixCache(prefix_block_tokens, track_events=True) if prefix_block_tokens else None)
        if perf is not None:
            bind_order(self.local.prefills.order, time.monotonic, perf)
        self.prefix_block_tokens = prefix_block_tokens  # 0: no prefix cache
        if prefix_block_tokens:
            self.engine.enable_prefix_cache(prefix_block_tokens)
        self.kv_moves = KVMoves(instance_id, self.engine, self.local, self.send, self.drop,
                                self.follow_prefix_cache, map_peer_pool)
        self.sessions = WorkerSessions(self.engine, self.local, self.kv_moves.peer)
        self.step_log = StepLog.from_env(instance_id)  # in-situ profile rows, when asked
        self.requests: dict[int, Request] = {}
        self.running = True
        self._executing: frozenset[int] = frozenset()
        self.forecast = WorkerForecast.build(decode_forecast, self.engine, self.local)
        self.reports = LoadReporter(instance_id, self.local, self.forecast)
        self.compiles = ConstraintCompiles(self.engine)

    def send(self, event: Event) -> None:
        """An event to the driver (over the connection of the moment: a Ray-hosted worker
        connects after it is built)."""
        self.connection.send(event)

    def serve(self) -> None:
        assert self.engine.pool.shared_name is not None
        self.send(WorkerReady(self.instance_id, self.engine.pool.shared_name,
                              self.reports.ready_report()))
        try:
            idle = True
            while self.running:
                wait_s = COMPILE_POLL_S if self.compiles.waiting else IDLE_REPORT_S
                while self.connection.poll(wait_s if idle else 0):
                    self.handle_safely(self.connection.recv())
                    if not self.running:
                        return
                    idle = False
                for commands, error in self.compiles.released():
                    self.handle_compiled(commands, error)
                    idle = False
                self.kv_moves.start_transfers()
                idle = not self.step()
                if idle:
                    report = self.reports.idle_report()
                    if report is not None:
                        self.send(report)
        finally:
            self.compiles.close()
            self.kv_moves.close()
            self.engine.pool.close()

    # ---- commands ----
    def handle_safely(self, command: Command) -> None:
        """`handle`, failing the command's request (not the worker) if it raises. A command
        that waits for its constraint to compile is handled, and its dispatch counted (the
        driver keeps it in flight until then), once it has (`handle_compiled`)."""
        if isinstance(command, Cancel):  # a parked request's dispatch is resolved now
            for parked in self.compiles.forget(command.request_id):
                self.reports.count_dispatch(parked)
        if self.compiles.holds(command):
            return
        self.reports.count_dispatch(command)
        self._handle_guarded(command)

    def handle_compiled(self, commands: list[Command], error: Exception | None) -> None:
        """A parked request's commands, its constraint compiled; or its failure, if the
        constraint did not compile (as `add` fails an invalid one)."""
        for command in commands:
            self.reports.count_dispatch(command)
        if error is None:
            for command in commands:
                self._handle_guarded(command)
            return
        request_id = request_of(commands[0])
        assert request_id is not None
        self.drop(request_id)  # (a parked request holds nothing here yet)
        self.send(WorkerError(self.instance_id, request_id, str(error)))

    def _handle_guarded(self, command: Command) -> None:
        try:
            self.handle(command)
        except Exception as err:  # noqa: BLE001 - one request's failure, not the worker's
            request_id = request_of(command)
            if request_id is None:
                raise
            traceback.print_exc()
            self.drop(request_id)
            self.send(WorkerError(
                self.instance_id, request_id,
                f"the worker failed handling {type(command).__name__}: {describe(err)}",
                "server_error"))

    def drop(self, request_id: int) -> None:
        """Forget a request wherever it is here and free its KV."""
        request = self.requests.pop(request_id, None)
        if request is not None:
            self.local.abort(request)
        self.kv_moves.forget(request_id)
        if request_id in self.engine.sequences:
            self.engine.release(request_id)

    def handle(self, command: Command) -> None:
        local, engine = self.local, self.engine
        if isinstance(command, AddRequest):
            if command.history is not None:  # a remote prefill: read the history first
                copied = self.sessions.import_history(command.history)
                self.send(HistoryCopied(self.instance_id, command.request_id, copied))
            # resumed tokens are prefilled with the prompt; the local scheduler sees one
            # longer prompt and what is left of max_tokens, so the first prefill still hands
            # off, and the engine's sequence counts the resumed tokens as generated
            resumed, session = len(command.resume_ids), command.session_id
            request = Request(command.request_id, command.arrival_s,
                              len(command.prompt_ids) + resumed,
                              command.params.max_tokens - resumed, hash_ids=chain_hashes(
                                  command.prompt_ids, self.prefix_block_tokens)
                              if self.prefix_block_tokens else (), session_id=session,
                              retain_kv=session >= 0)
            try:
                reused = engine.add(command.request_id, list(command.prompt_ids),
                                    command.params, command.resume_ids, session)
            except ValueError as err:
                self.send(WorkerError(self.instance_id, command.request_id, str(err)))
                return
            if session >= 0:  # the scheduler counts the history the engine reused
                self.sessions.count_reuse(session, reused)
                request.cached_prefix_tokens = reused
            self.requests[request.request_id] = request
            local.enqueue_prefill(request)
        elif isinstance(command, ExportHistory):
            self.send(HistoryExported(self.instance_id, command.request_id,
                                      self.sessions.export(command.session_id)))
        elif isinstance(command, UnlockHistory):
            self.sessions.unlock(command.session_id)
        elif isinstance(command, DropHistory):
            self.sessions.drop(command.session_id)
        elif isinstance(command, ContinueInPlace):
            local.continue_in_place(self.requests[command.request_id])
        elif isinstance(command, AdoptKV):
            handoff, session = command.handoff, command.session_id
            if session >= 0:  # only the history that agrees with the sequence is merged
                self.sessions.agree_with(session, handoff)
            request = Request(handoff.request_id, 0.0, handoff.prompt_tokens,
                              handoff.params.max_tokens,
                              generated_tokens=len(handoff.token_ids) - handoff.prompt_tokens,
                              session_id=session, retain_kv=session >= 0)
            self.requests[request.request_id] = request
            self.kv_moves.receive(command, request)
        elif isinstance(command, Detach):
            self.kv_moves.detach(command.request_id, self.requests.get(command.request_id))
        elif isinstance(command, ReleaseKV):
            request = self.requests.pop(command.request_id, None)
            if request is not None:  # else cancelled meanwhile
                self.kv_moves.release(request)
        elif isinstance(command, ForgetPool):
            self.kv_moves.forget_pool(command.pool_name)
        elif isinstance(command, Cancel):
            self.drop(command.request_id)
        elif isinstance(command, SetChunk):
            local.set_chunk_size(command.chunk_size_tokens)
        elif isinstance(command, SetPriority):
            local.set_phase_priority(parse_phase_priority(command.priority))
        elif isinstance(command, SetPerfModel):
            bind_order(local.prefills.order, time.monotonic, command.perf)
        elif isinstance(command, Shutdown):
            self.running = False

    def follow_prefix_cache(self) -> None:
        cache = self.local.prefix_cache
        if cache is not None:
            self.engine.follow_prefix_cache(*cache.take_events())

    # ---- one batch ----
    def step(self) -> bool:
        plan = self.local.plan()
        if plan is None:
            if self.step_log is not None:
                self.step_log.idle()
            if self._executing:  # idle: no request is running
                self._executing = frozenset()
                self.send(Executing(self.instance_id, self._executing))
            return False
        batch = frozenset([*(r.request_id for r in plan.decodes),
                           *(r.request_id for r, _ in plan.chunks)])
        if batch != self._executing:
            self._executing = batch
            self.send(Executing(self.instance_id, batch))
        start = time.perf_counter()
        if self.step_log is not None:
            self.step_log.batch_started(start)
        self.follow_prefix_cache()  # evictions the plan made
        guarded = run_guarded(self.engine, plan)
        outputs, failures = guarded.outputs, guarded.failures
        stopped = frozenset(o.request_id for o in outputs if o.finish_reason)
        seconds = time.perf_counter() - start
        result = self.local.complete(plan, seconds, stopped)
        self.follow_prefix_cache()  # blocks the finished prefills gave the cache
        if self.step_log is not None and not failures:
            self.step_log.batch_ran(len(plan.decodes), plan.decode_context_tokens,
                                    plan.prefill_tokens, plan.prefill_attn_units, start)
        for request_id in failures:
            self.drop(request_id)
        tokens = tuple((o.request_id, o.token_id, o.finish_reason, o.logprob)
                       for o in outputs)
        stats, sent_s, acknowledged = self.reports.step_report()
        self.send(StepDone(self.instance_id, tokens, stats, self.engine.prefill_tokens_total,
                           self.engine.reused_tokens_total, sent_s, acknowledged))
        for request_id, (kind, message) in failures.items():
            self.send(WorkerError(self.instance_id, request_id, message, kind))
        for request in result.prefilled:
            if request.request_id not in failures:
                self.send(Prefilled(self.instance_id, self.engine.export(request.request_id)))
        if self.forecast is not None:
            self.forecast.after_step(result.finished)
        for request in result.finished:
            if request.request_id not in failures:
                self.requests.pop(request.request_id, None)
                self.engine.release(request.request_id,
                                    request.session_id if request.retain_kv else -1)
        return True


def worker_main(instance_id: int, model_name: str, seed: int, num_blocks: int,
                chunk_size_tokens: int, max_batch_size: int, connection: Connection,
                phase_priority: str, prefix_block_tokens: int,
                environment: dict[str, str] | None = None,
                queue_order: Callable[[], QueueOrder] = FCFSOrder,
                perf: PerfModel | None = None,
                decode_forecast: ForecastSettings | None = None,
                device: EngineDevice | None = None) -> None:
    """Entry point of a worker process; `environment`: the starting process's, to use
    instead of the fork server's."""
    if environment is not None:
        os.environ.clear()
        os.environ.update(environment)
    Worker(instance_id, model_name, seed, num_blocks, chunk_size_tokens, max_batch_size,
           connection, phase_priority, prefix_block_tokens, queue_order, perf,
           decode_forecast, device=device).serve()
