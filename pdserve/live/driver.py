"""The live driver: worker processes, the same pure global scheduler, an asyncio event loop.

Worker messages arrive on the event loop (`add_reader` on each connection). The driver
turns them into scheduler events (`PrefillDone`, `Finished`, `Tick`, `InstanceFailed`),
applies the actions it gets back by sending commands to workers, and streams each
request's text to its HTTP handler through an asyncio queue. The scheduler's view holds each
worker's latest `InstanceStats` plus the dispatches sent to it that it had not received
when it took that snapshot (`dispatch_ledger.py`), so a burst between two reports does not
all land on one instance, and a report does not erase a dispatch still in the pipe.

Faults (`failover.py` holds the rules): a request that fails on a worker fails alone
(`WorkerError`). A worker that exits is reported to the scheduler (`InstanceFailed`), its
requests are re-run on live instances resuming after the tokens the client has seen (at
most once each), except those in the batch a crashed worker was running, which fail; the
supervisor restarts the worker and the scheduler takes it back (`InstanceRecovered`).
Each attempt of a request has its own worker-side request id, so a late token of an
abandoned attempt can never reach the client. Admission is bounded: past
`max_outstanding` requests, `submit` raises `Overloaded` (the server answers 429).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import replace

from pdserve.cluster.actions import (
    Action,
    DispatchDecode,
    DispatchPrefill,
    Migrate,
    Reject,
    SetChunkSize,
    SetPhasePriority,
    SetRole,
    StartInstance,
    StopInstance,
)
from pdserve.cluster.events import Arrival, ClusterView, PrefillDone, Tick
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.text_stream import TextStream
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.engine.transfer import KVHandoff
from pdserve.instance.prefix_cache import chain_hashes
from pdserve.instance.stats import InstanceStats
from pdserve.live import status
from pdserve.live.dispatch_ledger import DispatchLedger
from pdserve.live.failover import Failover
from pdserve.live.lifecycle import WorkerLifecycle
from pdserve.live.processes import WorkerProcesses, WorkerSettings
from pdserve.live.ray_cluster import RaySettings
from pdserve.live.requests import LiveRequest, Overloaded
from pdserve.live.server_metrics import ServerMetrics
from pdserve.live.sessions import HistoryReads, LiveSessions
from pdserve.live.timeline import RequestTimeline
from pdserve.live.token_stream import TokenStreams
from pdserve.policies.base import Policy
from pdserve.types import Request
from pdserve.worker.messages import (
    AdoptKV,
    Cancel,
    Command,
    ContinueInPlace,
    Detach,
    Detached,
    Executing,
    HistoryCopied,
    HistoryExported,
    Prefilled,
    ReleaseKV,
    SetChunk,
    SetPriority,
    StatsReport,
    StepDone,
    Transferred,
    WorkerError,
)

__all__ = ["LiveDriver", "LiveRequest", "Overloaded"]
log = logging.getLogger("pdserve.live")


class LiveDriver(Failover, WorkerLifecycle, TokenStreams):
    def __init__(self, policy: Policy, num_instances: int, tokenizer: TextTokenizer,
                 workers: WorkerSettings, monitor_interval_s: float = 0.5,
                 max_outstanding: int = 256, ray: RaySettings | None = None) -> None:
        """`ray`: host the workers in Ray actors (`live/ray_workers.py`) instead of local
        processes; nothing else changes."""
        self.scheduler = GlobalScheduler(policy, num_instances)
        self.tokenizer = tokenizer
        self.monitor_interval_s = monitor_interval_s
        self.max_outstanding = max_outstanding
        self.metrics = ServerMetrics()
        self.view = ClusterView(0.0, [])
        self.ledger = DispatchLedger()  # dispatches in flight to each worker
        self.live: dict[int, LiveRequest] = {}  # by current attempt id
        self._pending_handoffs: dict[int, KVHandoff] = {}  # prefilled, awaiting a decode target
        self._migration_targets: dict[int, int] = {}  # detach asked: request -> target
        self._transfer_sources: dict[int, int] = {}  # KV copy in flight: request -> source
        self._executing: dict[int, frozenset[int]] = {}  # instance -> its running batch
        self.role_changes: deque[tuple[float, int, str, str]] = deque(maxlen=32)
        self.sessions = LiveSessions()  # X-Session-Id -> binding (AMPD sessions)
        self.history = HistoryReads(self)  # remote prefills reading a session's history
        # instance -> its engine's (prefill tokens computed, tokens reused from history)
        self.engine_counters: dict[int, tuple[int, int]] = {}
        if ray is None:
            self.workers = WorkerProcesses(workers, num_instances)
        else:  # imported only here: Ray is an optional extra
            from pdserve.live.ray_workers import RayWorkers

            self.workers = RayWorkers(workers, num_instances, ray)
        self._starting: set[int] = set()  # workers started on request, not yet ready
        self.timeline = RequestTimeline.from_env(self.scheduler.roles)  # fidelity runs only
        self._batch_end_s = 0.0  # of the StepDone whose tokens are being handled
        self._next_id = 0
        self._tick_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # for calls from other threads

    # ---- lifecycle ----
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        initial = self.scheduler.initial_actions()  # reserves stopped, chunk sizes
        stopped = {a.instance_id for a in initial if isinstance(a, StopInstance)}
        self.view.instances = await self.workers.start(self._on_message, self._on_exit,
                                                       self._on_ready, stopped)
        for i, stats in enumerate(self.view.instances):
            self.set_load(i, stats)  # type: ignore[arg-type]
        self._apply([a for a in initial if not isinstance(a, StopInstance)])
        self._tick_task = asyncio.create_task(self._ticks())

    async def close(self) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
        await self.workers.stop()
        for live in list(self.live.values()):
            self._fail(live, "the server is shutting down", 503, "shutdown")

    # ---- requests ----
    def submit(self, prompt_ids: list[int], params: SamplingParams,
               session: str = "") -> LiveRequest:
        """Admit a request; `session` names its conversation (`live/sessions.py`)."""
        if len(self.live) >= self.max_outstanding:
            self.metrics.count("rejections")
            raise Overloaded(f"{len(self.live)} requests in flight (limit "
                             f"{self.max_outstanding})")
        self._next_id += 1
        if params.seed is None:  # a re-run (a new attempt id) must draw as this one does
            params = replace(params, seed=self._next_id)
        block_tokens = self.workers.settings.prefix_block_tokens
        request = Request(self._next_id, time.monotonic(), len(prompt_ids), params.max_tokens,
                          hash_ids=chain_hashes(prompt_ids, block_tokens) if block_tokens else ())
        if session:
            self.sessions.attach(request, session)
        live = LiveRequest(request, tuple(prompt_ids), params,
                           TextStream(self.tokenizer, params.stop, params.min_tokens),
                           client_id=self._next_id)
        self.live[request.request_id] = live
        self.metrics.count("requests")
        self._handle(Arrival(request))
        return live

    def cancel(self, request_id: int) -> None:
        """The client went away: stop the request and free its KV everywhere. Either id of
        the request (its first or its current attempt's) names it."""
        live = self.live.get(request_id) or next(
            (x for x in self.live.values() if x.client_id == request_id), None)
        if live is None:
            return
        self.metrics.count("cancellations")
        self._drop(live)

    def _holders(self, live: LiveRequest) -> set[int]:
        """Instances holding state of the request's current attempt."""
        request = live.request
        if request.decode_instance < 0:
            return {request.prefill_instance} - {-1}
        source = self._transfer_sources.get(request.request_id, -1)
        return {request.decode_instance, source} - {-1}

    def _drop(self, live: LiveRequest, except_instance: int = -1) -> None:
        """Forget the current attempt here and on every instance holding it."""
        rid = live.request.request_id
        for instance in self._holders(live) - {except_instance}:
            self.send(instance, Cancel(rid))
        self.live.pop(rid, None)
        self.history.forget(rid)
        self._pending_handoffs.pop(rid, None)
        self._migration_targets.pop(rid, None)
        self._transfer_sources.pop(rid, None)

    # ---- scheduler ----
    def _handle(self, event: object) -> None:
        self.view.now_s = time.monotonic()
        self._apply(self.scheduler.handle(event, self.view))  # type: ignore[arg-type]

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, DispatchPrefill):
                live = self.live.get(action.request.request_id)
                if live is None:
                    continue
                live.request.prefill_instance = action.instance_id
                if not self.history.read_first(live, action.instance_id):
                    self.send(action.instance_id, self.history.add_request(live))
            elif isinstance(action, DispatchDecode):
                self._dispatch_decode(action)
            elif isinstance(action, Reject):
                live = self.live.get(action.request.request_id)
                if live is not None:
                    self.metrics.count("rejections")
                    unavailable = not (self.scheduler.board.prefill_candidates
                                       and self.scheduler.board.decode_candidates)
                    if action.overloaded:  # early rejection: retry later
                        self._fail(live, action.reason, 429, "overloaded")
                        live.error_type = "rate_limit_error"
                    else:
                        self._fail(live, action.reason, 503 if unavailable else 400,
                                   "no_instance" if unavailable else "invalid_request")
            elif isinstance(action, SetRole):
                self.metrics.count("flips")
                self.role_changes.append((time.time(), action.instance_id, action.role.value,
                                          action.reason))
                if self.timeline is not None:
                    self.timeline.role(action.instance_id, action.role, time.monotonic())
                log.info("instance %d -> %s: %s", action.instance_id, action.role.value,
                         action.reason)
            elif isinstance(action, SetChunkSize):
                self.send(action.instance_id, SetChunk(action.chunk_size_tokens))
            elif isinstance(action, SetPhasePriority):
                log.info("instance %d serves %s first: %s", action.instance_id,
                         action.priority.value, action.reason)
                self.send(action.instance_id, SetPriority(action.priority.value))
            elif isinstance(action, Migrate):
                if action.request.request_id in self.live:
                    if action.reason:
                        log.info("request %d: instance %d -> %d: %s",
                                 action.request.request_id, action.source_id,
                                 action.target_id, action.reason)
                    self._migration_targets[action.request.request_id] = action.target_id
                    self.send(action.source_id, Detach(action.request.request_id))
            elif isinstance(action, StartInstance | StopInstance):
                self._apply_lifecycle(action)
            else:
                raise ValueError(f"the live driver cannot apply {type(action).__name__}")

    def _dispatch_decode(self, action: DispatchDecode) -> None:
        live = self.live.get(action.request.request_id)
        pending = self._pending_handoffs.pop(action.request.request_id, None)
        if live is None or pending is None:
            return
        live.request.decode_instance = action.target_id
        if action.target_id == action.source_id:
            live.request.decode_in_place()
            self.send(action.source_id, ContinueInPlace(action.request.request_id))
        else:
            self.metrics.count("transfers")
            self._move(pending, action.source_id, action.target_id)

    def _move(self, handoff: KVHandoff, source: int, target: int) -> None:
        """Send a sequence's hand-off to `target`; `source` frees it once it is copied."""
        self._transfer_sources[handoff.request_id] = source
        live = self.live.get(handoff.request_id)
        self.send(target, AdoptKV(handoff, live.request.session_id if live else -1))

    def migrate(self, request_id: int, target: int) -> None:
        """Move a running decode to `target` (an operator's or a test's request; policies
        do it by returning `Migrate` actions)."""
        live = self.live.get(request_id)
        if live is not None and live.request.decode_instance >= 0:
            self._apply([Migrate(live.request, live.request.decode_instance, target)])

    def send(self, instance: int, command: Command) -> None:
        """Every command to a worker goes through here: the view counts a dispatch at once."""
        if self.ledger.sent(instance, command):
            self.view.instances[instance] = self.ledger.view(instance)  # type: ignore[index]
        self.workers.send(instance, command)

    def set_load(self, instance: int, stats: InstanceStats) -> None:
        """A worker exited, stopped or (re)started: `stats` is its load, nothing in flight."""
        self.view.instances[instance] = self.ledger.reset(instance, stats)  # type: ignore[index]

    # ---- worker messages ----
    def _on_message(self, message: object) -> None:
        if isinstance(message, StepDone):
            self.view.instances[message.instance_id] = self.ledger.reported(  # type: ignore[index]
                message.instance_id, message.stats, message.dispatches_received)
            self.engine_counters[message.instance_id] = (message.prefill_tokens_total,
                                                         message.reused_tokens_total)
            self._batch_end_s = message.sent_s
            for request_id, token, reason, logprob in message.tokens:
                self._on_token(message.instance_id, request_id, token, reason, logprob)
        elif isinstance(message, Executing):
            self._executing[message.instance_id] = message.request_ids
        elif isinstance(message, StatsReport):
            self.view.instances[message.instance_id] = self.ledger.reported(  # type: ignore[index]
                message.instance_id, message.stats, message.dispatches_received)
        elif isinstance(message, Prefilled):
            live = self.live.get(message.handoff.request_id)
            if live is None:  # cancelled meanwhile
                self.send(message.instance_id, Cancel(message.handoff.request_id))
                return
            self._pending_handoffs[message.handoff.request_id] = message.handoff
            self._handle(PrefillDone(live.request, message.instance_id))
        elif isinstance(message, Detached):
            self._on_detached(message)
        elif isinstance(message, HistoryExported | HistoryCopied):
            self.history.on_message(message)
        elif isinstance(message, Transferred):
            source = self._transfer_sources.pop(message.request_id, -1)
            if source >= 0:
                self.send(source, ReleaseKV(message.request_id))
        elif isinstance(message, WorkerError):
            live = self.live.get(message.request_id)
            if live is not None:
                content = message.kind == "invalid_request"
                self._fail(live, message.message, 400 if content else 500,
                           "invalid_request" if content else "engine_error",
                           except_instance=message.instance_id)

    def _on_detached(self, message: Detached) -> None:
        target = self._migration_targets.pop(message.request_id, -1)
        live = self.live.get(message.request_id)
        if message.handoff is None:
            return
        if live is None:  # cancelled meanwhile: drop it there
            self.send(message.instance_id, Cancel(message.request_id))
        elif target < 0 or target in self.workers.exited:  # the target died: stay here
            self.send(message.instance_id, ContinueInPlace(message.request_id))
        else:
            self.metrics.count("migrations")
            live.request.decode_instance = target
            self._move(message.handoff, message.instance_id, target)

    # ---- ticks ----
    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(self.monitor_interval_s)
            self._handle(Tick())

    # ---- status ----
    def health(self) -> dict[str, object]:
        return status.health(self)

    def metrics_text(self) -> str:
        return self.metrics.render(status.metric_families(self))
