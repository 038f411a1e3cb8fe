"""The live driver: worker processes, the same pure global scheduler, an asyncio event loop.

Worker messages arrive on the event loop (`add_reader` on each connection). The driver
turns them into scheduler events (`PrefillDone`, `Finished`, `Tick`, `InstanceFailed`),
applies the actions it gets back by sending commands to workers, and streams each
request's text to its HTTP handler through an asyncio queue. The scheduler's view holds each
worker's latest `InstanceStats` plus the dispatches sent to it that it had not received
when it took that snapshot (`dispatch_ledger.py`), so a burst between two reports does not
all land on one instance, and a report does not erase a dispatch still in the pipe.

Structure: the driver implements the one driver contract (`cluster/actions.py: World`, a
method per action, applied by the shared `apply_actions`) over worker processes, and wires
collaborators that own their own state and never import it back: `WorkerLifecycle`
(workers started and stopped on request), `TokenStreams` (each token to its client),
`LiveSessions` and `HistoryReads` (sessions and their history reads); `failover.py` holds
the rules for a worker's death, `status.py` renders `/health`, `server_metrics.py` owns the
Prometheus metrics, and `cluster_history` (`cluster/history.py`) logs every decision with
its reason and samples the instances at each tick for the dashboard.

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
    apply_actions,
)
from pdserve.cluster.events import (
    Arrival,
    ClusterView,
    Event,
    Finished,
    InstanceFailed,
    InstanceStarted,
    PerfModelChanged,
    PrefillDone,
    Tick,
)
from pdserve.cluster.history import ClusterHistory, DecisionKind
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.cluster.sessions import HistorySource
from pdserve.engine.sampling import SamplingParams, TokenLogprob
from pdserve.engine.text_stream import TextStream
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.engine.transfer import KVHandoff
from pdserve.instance.prefix_cache import chain_hashes
from pdserve.instance.stats import InstanceStats
from pdserve.live import status
from pdserve.live.dispatch_ledger import DispatchLedger
from pdserve.live.failover import next_attempt, verdict
from pdserve.live.lifecycle import WorkerLifecycle
from pdserve.live.processes import WorkerProcesses, WorkerSettings
from pdserve.live.ray_cluster import RaySettings
from pdserve.live.requests import LiveRequest, Overloaded
from pdserve.live.server_metrics import ClusterGauges, ServerMetrics
from pdserve.live.sessions import HistoryReads, LiveSessions
from pdserve.live.status import GIVEN_PERF_MODEL, PROFILED, PerfModelState
from pdserve.live.timeline import RequestTimeline
from pdserve.live.token_stream import TokenStreams
from pdserve.perf.fitted import PerfModel
from pdserve.policies.base import Policy
from pdserve.types import Request
from pdserve.worker.messages import (
    AdoptKV,
    Cancel,
    Command,
    ContinueInPlace,
    Detach,
    Detached,
    DropHistory,
    Executing,
    HistoryCopied,
    HistoryExported,
    Prefilled,
    ReleaseKV,
    SetChunk,
    SetPerfModel,
    SetPriority,
    StatsReport,
    StepDone,
    Transferred,
    WorkerError,
)

__all__ = ["LiveDriver", "LiveRequest", "Overloaded"]
log = logging.getLogger("pdserve.live")
HISTORY_S = 900.0  # the load samples the dashboard can show reach this far back
MAX_DECISIONS = 5000  # the newest entries of the decision log kept
MAX_ENDED = 5000  # the newest ended requests kept for the latency window


class LiveDriver:
    def __init__(self, policy: Policy, num_instances: int, tokenizer: TextTokenizer,
                 workers: WorkerSettings, monitor_interval_s: float, max_outstanding: int,
                 ray: RaySettings | None = None,
                 perf_model: PerfModelState = GIVEN_PERF_MODEL,
                 model_name: str = "unnamed") -> None:
        """`monitor_interval_s` and `max_outstanding`: the config's (`monitor.interval_s`,
        `server.max_outstanding`); `ray`: host the workers in Ray actors
        (`live/ray_workers.py`) instead of local processes; nothing else changes.
        `perf_model`: what the model the policy and `workers` were built on is
        (`provisional` until `use_perf_model` replaces it); `model_name`: the served
        model's name, the metrics' `model_name` label."""
        self.scheduler = GlobalScheduler(policy, num_instances)
        self.started_s, self.started_wall_s = time.monotonic(), time.time()
        # the decision log and the instances' load over time (the dashboard's); the tick
        # interval's samples of the last 15 minutes at most
        self.cluster_history = ClusterHistory(self.started_s, max_decisions=MAX_DECISIONS,
                                      max_samples=max(1, int(HISTORY_S / monitor_interval_s)))
        self.perf_model = perf_model
        self._perf = workers.perf  # what the policy and the workers' queue orders read
        self.tokenizer = tokenizer
        self.monitor_interval_s = monitor_interval_s
        self.max_outstanding = max_outstanding
        self.metrics = ServerMetrics(model_name, self._gauges)
        self.view = ClusterView(0.0, [])
        self.ledger = DispatchLedger()  # dispatches in flight to each worker
        self.live: dict[int, LiveRequest] = {}  # by current attempt id
        self._pending_handoffs: dict[int, KVHandoff] = {}  # prefilled, awaiting a decode target
        self._migration_targets: dict[int, int] = {}  # detach asked: request -> target
        self._transfer_sources: dict[int, int] = {}  # KV copy in flight: request -> source
        self._executing: dict[int, frozenset[int]] = {}  # instance -> its running batch
        self.sessions = LiveSessions()  # X-Session-Id -> binding (AMPD sessions)
        self.history = HistoryReads(self.send, self.live.get)  # remote prefills' history
        # instance -> its engine's (prefill tokens computed, tokens reused from history)
        self.engine_counters: dict[int, tuple[int, int]] = {}
        if ray is None:
            self.workers = WorkerProcesses(workers, num_instances)
        else:  # imported only here: Ray is an optional extra
            from pdserve.live.ray_workers import RayWorkers

            self.workers = RayWorkers(workers, num_instances, ray)
        self.lifecycle = WorkerLifecycle(self.workers, self.metrics)
        self.timeline = RequestTimeline.from_env(self.scheduler.roles)  # step-log runs only
        if self.timeline is not None:
            self.timeline.perf_model(self._perf)
        self.streams = TokenStreams(self.metrics, self.timeline, max_ended=MAX_ENDED)
        self._batch_end_s = 0.0  # of the StepDone whose tokens are being handled
        self._next_id = 0
        self._tick_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # for calls from other threads

    @property
    def failed(self) -> set[int]:
        """Instances not serving now (restarting, dead or stopped)."""
        return self.workers.exited

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

    # ---- the performance model ----
    def use_perf_model(self, perf: PerfModel, origin: str) -> None:
        """From now on the policy and the workers' prefill queue orders read `perf` (the
        start-up profile, ready after the server started on a provisional model). The
        scheduler keeps its roles and its policy's state, requests in flight go on where
        they are; only decisions made after this call differ."""
        previous = self.perf_model
        self._perf = perf
        self.perf_model = PerfModelState(PROFILED, origin)
        if self.timeline is not None:
            self.timeline.perf_model(perf)
        self._handle(PerfModelChanged(perf))
        for instance in range(self.workers.count):  # live ones; a (re)starting one when ready
            self.send(instance, SetPerfModel(perf))
        prefill, decode = perf.prefill, perf.decode
        log.info("performance model: %s (was %s: %s), from %s; prefill %.3g s + %.3g s/token "
                 "+ %.3g s/attention unit (R^2 %.3f), decode step %.3g s + %.3g s/sequence + "
                 "%.3g s/context token (R^2 %.3f)", PROFILED, previous.state, previous.origin,
                 origin, prefill.intercept_s, prefill.per_token_s, prefill.per_attn_unit_s,
                 prefill.r2, decode.intercept_s, decode.per_seq_s, decode.per_context_token_s,
                 decode.r2)

    def perf_model_failed(self, error: str) -> None:
        """The start-up profile failed: serving goes on with the model it has."""
        self.perf_model = PerfModelState(self.perf_model.state, self.perf_model.origin, error)
        log.error("the start-up profile failed; serving goes on with the %s performance "
                  "model (%s): %s", self.perf_model.state, self.perf_model.origin, error)

    # ---- requests ----
    def submit(self, prompt_ids: list[int], params: SamplingParams,
               session: str = "") -> LiveRequest:
        """Admit a request; `session` names its conversation (`live/sessions.py`)."""
        if len(self.live) >= self.max_outstanding:
            self.metrics.add(self.metrics.rejections, 1, "max_outstanding")
            message = f"{len(self.live)} requests in flight (limit {self.max_outstanding})"
            self.cluster_history.record(time.monotonic(), DecisionKind.REJECT, -1,
                                f"server overloaded: {message}")
            raise Overloaded(message)
        self._next_id += 1
        if params.seed is None:  # a re-run (a new attempt id) must draw as this one does
            params = replace(params, seed=self._next_id)
        block_tokens = self.workers.settings.prefix_block_tokens
        request = Request(self._next_id, time.monotonic(), len(prompt_ids), params.max_tokens,
                          hash_ids=chain_hashes(prompt_ids, block_tokens) if block_tokens else ())
        if session:
            self.sessions.attach(request, session)
        live = LiveRequest(request, tuple(prompt_ids), params,
                           TextStream.for_params(self.tokenizer, params,
                                                 self.tokenizer.eos_token_ids),
                           client_id=self._next_id)
        self.live[request.request_id] = live
        self.metrics.add(self.metrics.requests)
        self._handle(Arrival(request))
        return live

    def cancel(self, request_id: int) -> None:
        """The client went away: stop the request and free its KV everywhere. Either id of
        the request (its first or its current attempt's) names it."""
        live = self.live.get(request_id) or next(
            (x for x in self.live.values() if x.client_id == request_id), None)
        if live is None:
            return
        self.metrics.add(self.metrics.cancellations)
        self._drop(live)

    def move_decode(self, request_id: int, target: int) -> None:
        """Move a running decode to `target` (an operator's or a test's request; policies
        do it by returning `Migrate` actions)."""
        live = self.live.get(request_id)
        if live is not None and live.request.decode_instance >= 0:
            self._apply([Migrate(live.request, live.request.decode_instance, target)])

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

    def _finish(self, live: LiveRequest, instance: int, worker_reason: str, now: float) -> None:
        """The request ended on `instance`; the worker is told to stop when it did not say
        so itself (the driver's stream saw a stop string first)."""
        self.streams.finish(live, worker_reason, now)
        request = live.request
        self.live.pop(request.request_id, None)
        if not worker_reason:
            self.send(instance, Cancel(request.request_id))
        if request.session_id >= 0:
            self.sessions.finished(request, instance)
        self._handle(Finished(request, instance))

    def _fail(self, live: LiveRequest, message: str, http_status: int, reason: str,
              except_instance: int = -1) -> None:
        """End the request with an error the client sees (`reason` labels the metric)."""
        self._drop(live, except_instance)
        self.streams.fail(live, message, http_status, reason)

    # ---- the scheduler and its actions (`World`) ----
    def _handle(self, event: Event) -> None:
        self.view.now_s = time.monotonic()
        self._apply(self.scheduler.handle(event, self.view))

    def _apply(self, actions: list[Action]) -> None:
        apply_actions(actions, self, self.scheduler.board.roles, self.cluster_history,
                      time.monotonic())

    def serving(self, instance_id: int) -> bool:
        return instance_id not in self.workers.exited

    def dispatch_prefill(self, action: DispatchPrefill, history: HistorySource) -> None:
        live = self.live.get(action.request.request_id)
        if live is None:
            return
        live.request.prefill_instance = action.instance_id
        if history is HistorySource.READ:
            self.history.read_first(live, action.instance_id)
            return
        if history in (HistorySource.RECOMPUTE, HistorySource.GONE):
            live.request.cached_prefix_tokens = 0  # the prefill computes its history
        if history is HistorySource.RECOMPUTE:  # the copy at home is no longer needed
            self.send(live.request.home_instance, DropHistory(live.request.session_id))
        self.send(action.instance_id, self.history.add_request(live))

    def dispatch_decode(self, action: DispatchDecode) -> None:
        live = self.live.get(action.request.request_id)
        pending = self._pending_handoffs.pop(action.request.request_id, None)
        if live is None or pending is None:
            return
        request = live.request
        request.decode_instance = action.target_id
        if request.session_id >= 0 and 0 <= request.home_instance != action.target_id:
            # it decodes away from its history: the copy at home is no longer needed
            self.send(request.home_instance, DropHistory(request.session_id))
        if action.target_id == action.source_id:
            live.request.decode_in_place()
            self.send(action.source_id, ContinueInPlace(action.request.request_id))
        else:
            self.metrics.add(self.metrics.handoffs)
            self._move(pending, action.source_id, action.target_id, "handoff")

    def reject(self, action: Reject) -> None:
        live = self.live.get(action.request.request_id)
        if live is None:
            return
        unavailable = not (self.scheduler.board.prefill_candidates
                           and self.scheduler.board.decode_candidates)
        reason = "overloaded" if action.overloaded else (
            "no_instance" if unavailable else "cannot_fit")
        self.metrics.add(self.metrics.rejections, 1, reason)
        if action.overloaded:  # early rejection: retry later
            self._fail(live, action.reason, 429, "overloaded")
            live.error_type = "rate_limit_error"
        else:
            self._fail(live, action.reason, 503 if unavailable else 400,
                       "no_instance" if unavailable else "invalid_request")

    def set_role(self, action: SetRole) -> None:
        self.metrics.add(self.metrics.flips, 1, action.role.value)
        if self.timeline is not None:
            self.timeline.role(action.instance_id, action.role, time.monotonic())
        log.info("instance %d -> %s: %s", action.instance_id, action.role.value, action.reason)

    def set_chunk_size(self, action: SetChunkSize) -> None:
        self.send(action.instance_id, SetChunk(action.chunk_size_tokens))

    def set_phase_priority(self, action: SetPhasePriority) -> None:
        log.info("instance %d serves %s first: %s", action.instance_id, action.priority.value,
                 action.reason)
        self.send(action.instance_id, SetPriority(action.priority.value))

    def migrate(self, action: Migrate) -> None:
        if action.request.request_id not in self.live:
            return
        if action.reason:
            log.info("request %d: instance %d -> %d: %s", action.request.request_id,
                     action.source_id, action.target_id, action.reason)
        self._migration_targets[action.request.request_id] = action.target_id
        self.send(action.source_id, Detach(action.request.request_id))

    def stop_instance(self, action: StopInstance) -> None:
        self.lifecycle.stop(action.instance_id, action.reason)
        self.set_load(action.instance_id, InstanceStats.empty(
            action.instance_id, self.view.instances[action.instance_id].total_blocks))

    def start_instance(self, action: StartInstance) -> None:
        self.lifecycle.start(action.instance_id, action.reason)

    def _move(self, handoff: KVHandoff, source: int, target: int, kind: str) -> None:
        """Send a sequence's hand-off to `target`; `source` frees it once it is copied.
        `kind`: a "handoff" (prefill to decode) or a "migration" (the transfer metrics')."""
        self.metrics.add(self.metrics.transfer_bytes,
                         len(handoff.blocks) * self.workers.settings.kv_block_bytes, kind)
        self._transfer_sources[handoff.request_id] = source
        live = self.live.get(handoff.request_id)
        self.send(target, AdoptKV(handoff, live.request.session_id if live else -1))

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

    def _on_token(self, instance: int, request_id: int, token: int, reason: str,
                  logprob: TokenLogprob | None = None) -> None:
        live = self.live.get(request_id)
        if live is None or live.tokens_sent >= live.params.max_tokens:
            return
        now = time.monotonic()
        if self.streams.push(live, instance, token, reason, logprob, now, self._batch_end_s):
            self._finish(live, instance, reason, now)

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
            self.metrics.add(self.metrics.migrations)
            live.request.decode_instance = target
            self._move(message.handoff, message.instance_id, target, "migration")

    # ---- worker exits and starts ----
    def _on_exit(self, instance: int, exit_code: int | None) -> None:
        """A worker exited (called once per exit by `WorkerProcesses`): the scheduler
        hears it, its requests are re-run or failed by `failover.verdict`."""
        self.metrics.add(self.metrics.worker_failures)
        log.error("worker %d exited (code %s); %s", instance, exit_code,
                  self.workers.states[instance].value)
        self.cluster_history.record(time.monotonic(), DecisionKind.FAILED, instance,
                            f"worker exited (code {exit_code}); "
                            f"{self.workers.states[instance].value}")
        self.lifecycle.exited(instance)
        batch = self._executing.pop(instance, frozenset())
        total_blocks = self.view.instances[instance].total_blocks
        # its work is gone: policies must not count it
        self.set_load(instance, InstanceStats.empty(instance, total_blocks))
        self._handle(InstanceFailed(instance))
        self.history.source_lost(instance)
        self.sessions.instance_lost(instance)
        for live in [x for x in self.live.values() if instance in self._holders(x)]:
            judged = verdict(instance, exit_code, live.request.request_id in batch,
                             live.retries)
            if judged.retry:
                self._rerun(live, instance)
            else:
                self._fail(live, judged.message, 500, judged.reason, except_instance=instance)

    def _rerun(self, live: LiveRequest, dead: int) -> None:
        """A new attempt of the request that resumes after the tokens the client has."""
        self._drop(live, except_instance=dead)
        self._next_id += 1
        request = next_attempt(live.request, self._next_id, len(live.token_ids))
        live.request, live.retries = request, live.retries + 1
        self.live[request.request_id] = live
        self.metrics.add(self.metrics.retries)
        self.metrics.add(self.metrics.resumed_tokens, len(live.token_ids))
        self._handle(Arrival(request))

    def _on_ready(self, instance: int, stats: InstanceStats, pool_name: str) -> None:
        """A started or restarted worker is up, empty: the scheduler may use it."""
        self.set_load(instance, stats)
        if self._perf is not self.workers.settings.perf:  # it started on an older model
            self.send(instance, SetPerfModel(self._perf))  # type: ignore[arg-type]
        event = self.lifecycle.ready(instance)
        self.cluster_history.record(time.monotonic(), DecisionKind.STARTED if isinstance(
            event, InstanceStarted) else DecisionKind.RECOVERED, instance,
            f"worker up (pid {self.workers.pid(instance)})")
        self._handle(event)

    # ---- ticks ----
    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(self.monitor_interval_s)
            self._handle(Tick())
            self.cluster_history.sample(time.monotonic(), self.view.instances,  # type: ignore[arg-type]
                                self.scheduler.roles, status.instance_states(self.workers))

    # ---- status ----
    @property
    def role_changes(self) -> list[status.RoleChangeRecord]:
        """The flips of the decision log, with wall-clock times."""
        return [(self.started_wall_s + d.time_s, d.instance_id, d.role.value, d.reason)
                for d in self.cluster_history.role_changes() if d.role is not None]

    def health(self) -> dict[str, object]:
        return status.health(self.scheduler.board, self.workers, len(self.live),
                             self.role_changes, self.perf_model)

    def _gauges(self) -> ClusterGauges:
        return ClusterGauges(self.scheduler.roles, status.instance_states(self.workers),
                             self.view.instances, len(self.live), self.workers.placements())
