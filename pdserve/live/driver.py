"""The live driver: worker processes, the same pure global scheduler, an asyncio event loop.

Worker messages arrive on the event loop (`add_reader` on each connection). The driver
turns them into scheduler events (`PrefillDone`, `Finished`, `Tick`, `InstanceFailed`),
applies the actions it gets back by sending commands to workers, and streams each
request's text to its HTTP handler through an asyncio queue. The scheduler's view holds each
worker's latest `InstanceStats`; a dispatch also bumps the target's snapshot at once, so
a burst between two reports does not all land on one instance.

Faults: a worker that exits is reported to the scheduler (`InstanceFailed`) and every
request touching it is re-run elsewhere from its prompt; sampling is seeded per request, so
the re-run regenerates the tokens already streamed, which are skipped. With no instance
left, requests fail with an error. Admission is bounded: past `max_outstanding` requests,
`submit` raises `Overloaded` (the server answers 429).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field, replace

from pdserve.cluster.messages import (
    Action,
    Arrival,
    ClusterView,
    DispatchDecode,
    DispatchPrefill,
    Finished,
    InstanceFailed,
    Migrate,
    PrefillDone,
    Reject,
    SetChunkSize,
    SetRole,
    Tick,
)
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.text_stream import TextStream
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.engine.transfer import KVHandoff
from pdserve.live.messages import (
    AddRequest,
    AdoptKV,
    Cancel,
    Command,
    ContinueInPlace,
    Detach,
    Detached,
    Prefilled,
    ReleaseKV,
    SetChunk,
    StepDone,
    Transferred,
    WorkerError,
)
from pdserve.live.metrics import ServerMetrics
from pdserve.live.processes import WorkerProcesses, WorkerSettings
from pdserve.policies.base import Policy
from pdserve.types import Request, attn_units

_log = logging.getLogger(__name__)


class Overloaded(Exception):
    """Too many requests in flight; retry later."""


@dataclass
class LiveRequest:
    request: Request
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stream: TextStream
    events: asyncio.Queue[tuple[str, str]] = field(default_factory=asyncio.Queue)
    tokens_sent: int = 0  # tokens already streamed to the client
    skip_tokens: int = 0  # tokens a re-run will regenerate that were already streamed
    finish_reason: str = ""


class LiveDriver:
    def __init__(self, policy: Policy, num_instances: int, tokenizer: TextTokenizer,
                 workers: WorkerSettings, monitor_interval_s: float = 0.5,
                 max_outstanding: int = 256) -> None:
        self.scheduler = GlobalScheduler(policy, num_instances)
        self.tokenizer = tokenizer
        self.monitor_interval_s = monitor_interval_s
        self.max_outstanding = max_outstanding
        self.metrics = ServerMetrics()
        self.view = ClusterView(0.0, [])
        self.live: dict[int, LiveRequest] = {}
        self._pending_handoffs: dict[int, KVHandoff] = {}  # prefilled, awaiting a decode target
        self._migration_targets: dict[int, int] = {}  # detach asked: request -> target
        self._transfer_sources: dict[int, int] = {}  # KV copy in flight: request -> source
        self.workers = WorkerProcesses(workers, num_instances)
        self._next_id = 0
        self._tick_task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # ---- lifecycle ----
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.view.instances = await self.workers.start(self._on_message, self._on_exit)
        self._tick_task = asyncio.create_task(self._ticks())

    async def close(self) -> None:
        if self._tick_task is not None:
            self._tick_task.cancel()
        await self.workers.stop()
        for live in list(self.live.values()):
            self._fail(live, "the server is shutting down")

    # ---- requests ----
    def submit(self, prompt_ids: list[int], params: SamplingParams) -> LiveRequest:
        if len(self.live) >= self.max_outstanding:
            self.metrics.count("rejections")
            raise Overloaded(f"{len(self.live)} requests in flight (limit "
                             f"{self.max_outstanding})")
        self._next_id += 1
        request = Request(self._next_id, time.monotonic(), len(prompt_ids), params.max_tokens)
        live = LiveRequest(request, tuple(prompt_ids), params,
                           TextStream(self.tokenizer, params.stop))
        self.live[request.request_id] = live
        self.metrics.count("requests")
        self._handle(Arrival(request))
        return live

    def cancel(self, request_id: int) -> None:
        """The client went away: stop the request and free its KV everywhere."""
        live = self.live.pop(request_id, None)
        if live is None:
            return
        self.metrics.count("cancellations")
        holders = {live.request.prefill_instance, live.request.decode_instance,
                   self._transfer_sources.pop(request_id, -1)}
        for instance in holders - {-1}:
            self._send(instance, Cancel(request_id))

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
                self._bump_prefill(action.instance_id, live)
                self._send(action.instance_id, AddRequest(
                    live.request.request_id, live.prompt_ids, live.params))
            elif isinstance(action, DispatchDecode):
                self._dispatch_decode(action)
            elif isinstance(action, Reject):
                live = self.live.get(action.request.request_id)
                if live is not None:
                    self.metrics.count("rejections")
                    self._fail(live, action.reason)
            elif isinstance(action, SetRole):
                self.metrics.count("flips")
                _log.info("instance %d -> %s: %s", action.instance_id, action.role.value,
                          action.reason)
            elif isinstance(action, SetChunkSize):
                self._send(action.instance_id, SetChunk(action.chunk_size_tokens))
            elif isinstance(action, Migrate):
                if action.request.request_id in self.live:
                    self._migration_targets[action.request.request_id] = action.target_id
                    self._send(action.source_id, Detach(action.request.request_id))
            else:
                raise ValueError(f"the live driver cannot apply {type(action).__name__}")

    def _bump_prefill(self, instance: int, live: LiveRequest) -> None:
        stats = self.view.instances[instance]
        n = len(live.prompt_ids)
        self.view.instances[instance] = replace(  # type: ignore[index]
            stats, prefill_queue_len=stats.prefill_queue_len + 1,
            prefill_queue_tokens=stats.prefill_queue_tokens + n,
            prefill_queue_attn_units=stats.prefill_queue_attn_units + attn_units(n, 0))

    def _dispatch_decode(self, action: DispatchDecode) -> None:
        live = self.live.get(action.request.request_id)
        pending = self._pending_handoffs.pop(action.request.request_id, None)
        if live is None or pending is None:
            return
        live.request.decode_instance = action.target_id
        if action.target_id == action.source_id:
            self._send(action.source_id, ContinueInPlace(action.request.request_id))
        else:
            self.metrics.count("transfers")
            self._move(pending, action.source_id, action.target_id)

    def _move(self, handoff: KVHandoff, source: int, target: int) -> None:
        """Send a sequence's hand-off to `target`; `source` frees it once it is copied."""
        stats = self.view.instances[target]
        self.view.instances[target] = replace(  # type: ignore[index]
            stats, decode_queue_len=stats.decode_queue_len + 1,
            decode_queue_tokens=stats.decode_queue_tokens + len(handoff.token_ids))
        self._transfer_sources[handoff.request_id] = source
        self._send(target, AdoptKV(handoff))

    def migrate(self, request_id: int, target: int) -> None:
        """Move a running decode to `target` (an operator's or a test's request; policies
        do it by returning `Migrate` actions)."""
        live = self.live.get(request_id)
        if live is not None and live.request.decode_instance >= 0:
            self._apply([Migrate(live.request, live.request.decode_instance, target)])

    def _send(self, instance: int, command: Command) -> None:
        self.workers.send(instance, command)

    # ---- worker messages ----
    def _on_message(self, message: object) -> None:
        if isinstance(message, StepDone):
            self.view.instances[message.instance_id] = message.stats  # type: ignore[index]
            for request_id, token, reason in message.tokens:
                self._on_token(message.instance_id, request_id, token, reason)
        elif isinstance(message, Prefilled):
            live = self.live.get(message.handoff.request_id)
            if live is None:  # cancelled meanwhile
                self._send(message.instance_id, Cancel(message.handoff.request_id))
                return
            self._pending_handoffs[message.handoff.request_id] = message.handoff
            self._handle(PrefillDone(live.request, message.instance_id))
        elif isinstance(message, Detached):
            target = self._migration_targets.pop(message.request_id, -1)
            live = self.live.get(message.request_id)
            if message.handoff is None or live is None or target < 0:
                if message.handoff is not None:  # cancelled meanwhile: drop it there
                    self._send(message.instance_id, Cancel(message.request_id))
                return
            self.metrics.count("migrations")
            live.request.decode_instance = target
            self._move(message.handoff, message.instance_id, target)
        elif isinstance(message, Transferred):
            source = self._transfer_sources.pop(message.request_id, -1)
            if source >= 0:
                self._send(source, ReleaseKV(message.request_id))
        elif isinstance(message, WorkerError):
            live = self.live.get(message.request_id)
            if live is not None:
                self._fail(live, message.message)

    def _on_token(self, instance: int, request_id: int, token: int, reason: str) -> None:
        live = self.live.get(request_id)
        if live is None:
            return
        request, now = live.request, time.monotonic()
        request.generated_tokens += 1
        if live.skip_tokens > 0:  # a re-run regenerating what the client already has
            live.skip_tokens -= 1
        else:
            if math.isnan(request.first_token_s):
                request.first_token_s = now
                self.metrics.ttft.observe(now - request.arrival_s)
            live.tokens_sent += 1
            delta = live.stream.push(token)
            if delta:
                live.events.put_nowait(("text", delta))
        if reason or live.stream.stopped:
            self._finish(live, instance, reason, now)

    def _finish(self, live: LiveRequest, instance: int, worker_reason: str,
                now: float) -> None:
        """`worker_reason` is "" when this driver's text stream saw a stop string before
        the worker did; the worker is then told to stop."""
        request = live.request
        reason = worker_reason or "stop"
        tail = live.stream.finish()
        if tail:
            live.events.put_nowait(("text", tail))
        request.finish_s = now
        live.finish_reason = reason
        self.metrics.e2e.observe(now - request.arrival_s)
        if live.tokens_sent > 1:
            self.metrics.tpot.observe((now - request.first_token_s) / (live.tokens_sent - 1))
        self.metrics.count("completions")
        self.live.pop(request.request_id, None)
        if not worker_reason:
            self._send(instance, Cancel(request.request_id))
        live.events.put_nowait(("done", reason))
        self._handle(Finished(request, instance))

    def _fail(self, live: LiveRequest, message: str) -> None:
        self.live.pop(live.request.request_id, None)
        live.request.rejected_reason = message
        live.events.put_nowait(("error", message))

    # ---- faults and ticks ----
    @property
    def failed(self) -> set[int]:
        return self.workers.exited

    def _on_exit(self, instance: int) -> None:
        """A worker exited (called once per worker by `WorkerProcesses`)."""
        self.metrics.count("worker_failures")
        self._handle(InstanceFailed(instance))
        affected = [live for live in self.live.values()
                    if instance in (live.request.prefill_instance, live.request.decode_instance)]
        for live in affected:  # re-run from the prompt; skip what the client already has
            request = live.request
            for other in {request.prefill_instance, request.decode_instance} - {instance}:
                if other >= 0:
                    self._send(other, Cancel(request.request_id))
            self._pending_handoffs.pop(request.request_id, None)
            self._migration_targets.pop(request.request_id, None)
            source = self._transfer_sources.pop(request.request_id, -1)
            if source >= 0 and source != instance:
                self._send(source, Cancel(request.request_id))
            live.skip_tokens = live.tokens_sent
            request.generated_tokens = 0
            request.prefill_instance = request.decode_instance = -1
            self.metrics.count("retries")
            self._handle(Arrival(request))

    async def _ticks(self) -> None:
        while True:
            await asyncio.sleep(self.monitor_interval_s)
            self._handle(Tick())

    # ---- status ----
    def health(self) -> dict[str, object]:
        alive = [i for i in range(self.workers.count) if i not in self.failed]
        return {"status": "ok" if alive else "unavailable", "workers": self.workers.count,
                "alive": alive, "failed": sorted(self.failed),
                "roles": [role.value for role in self.scheduler.roles]}

    def metrics_text(self) -> str:
        gauges: dict[str, list[tuple[dict[str, str], float]]] = {
            "requests_in_flight": [({}, float(len(self.live)))]}
        for name in ("prefill_queue_len", "decode_queue_len", "running_decodes",
                     "used_blocks", "preemptions_total"):
            gauges[name] = [({"instance": str(s.instance_id)}, float(getattr(s, name)))
                            for s in self.view.instances]  # type: ignore[union-attr]
        roles = self.scheduler.roles
        gauges["pool_size"] = [({"role": role.value}, float(sum(r is role for r in roles)))
                               for role in dict.fromkeys(roles)]
        gauges["workers_failed"] = [({}, float(len(self.failed)))]
        return self.metrics.render(gauges)
