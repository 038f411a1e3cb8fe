"""The discrete-event driver: a virtual clock, simulated instances, the global scheduler.

Events: arrivals (read in order from the workload, never pushed on the heap), batch done,
KV transfer done, and a monitor tick. Ties are broken by insertion order, so a run is a pure
function of its inputs. After each event the driver applies the scheduler's actions and then
starts a batch on every instance that was idle and got work.

Speed: a decode-only batch is advanced over every step in which its composition cannot
change (`max_span_steps`), in closed form; work arriving mid-span cuts the span after the
step in progress. With `max_span_steps=1` the same code runs step by step, which is how the
tests check that the fast path changes nothing.

KV transfers run over the cluster's links (`pdserve.cluster.topology`): transfers that share
an instance's port share its bandwidth (`pdserve.sim.links`), and the prefill instance keeps
the KV until the transfer is done. Each instance may have its own performance model
(heterogeneous hardware): its batch times, its KV capacity and its intra-node link.

Token timing: at the end of each batch every decode records when its decode instance emitted
its first and last token of the batch and the widest gap in between
(`Request.record_decode_tokens`); for a span that is the last step, the longest, so the cost
is one call per decode per batch and no per-token list.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from pdserve.cluster.actions import Migrate
from pdserve.cluster.events import Arrival, ClusterView, Finished, PrefillDone, Tick
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.cluster.topology import Topology
from pdserve.instance.decode_forecast import DecodeLoadTracker
from pdserve.instance.local_scheduler import BatchPlan, LocalScheduler
from pdserve.instance.prefix_cache import PrefixCache
from pdserve.instance.queue_order import bind_order
from pdserve.perf.fitted import PerfModel
from pdserve.policies.base import Policy
from pdserve.sim.actions import ActionApplier
from pdserve.sim.blocks import BlockTable
from pdserve.sim.instance import SimInstance
from pdserve.sim.kv_movement import TRANSFER_DONE, KVMovement
from pdserve.sim.lifecycle import INSTANCE_STARTED, InstanceLifecycle
from pdserve.sim.links import LinkSimulator
from pdserve.sim.records import LoadSample, RoleChange, SimResult, SimSettings
from pdserve.sim.session_driving import ARRIVAL, SessionRoundsDriving
from pdserve.sim.sessions import (
    SessionKV,
    SessionRounds,
)
from pdserve.types import KV_BLOCK_TOKENS, Request, record_decode_tokens

_BATCH_DONE, _TRANSFER_DONE, _TICK, _ARRIVAL = 0, TRANSFER_DONE, 2, ARRIVAL


STALL_TICKS = 100  # consecutive ticks with nothing able to run before a run is declared stuck


def _only_tick_pending(heap: list[tuple[float, int, int, object, int]]) -> bool:
    return len(heap) == 1 and heap[0][2] == _TICK


class Simulator(ActionApplier, KVMovement, InstanceLifecycle, SessionRoundsDriving):
    """`perf` is one performance model for every instance or one per instance; `topology`
    places the instances and names their links (default: all on one node, each on its own
    model's GPU link)."""

    def __init__(self, policy: Policy, num_instances: int,
                 perf: PerfModel | Sequence[PerfModel], settings: SimSettings | None = None,
                 topology: Topology | None = None) -> None:
        self.settings = settings or SimSettings()
        self.perfs = [perf] * num_instances if isinstance(perf, PerfModel) else list(perf)
        if len(self.perfs) != num_instances:
            raise ValueError(f"{len(self.perfs)} performance models for {num_instances} "
                             f"instances")
        self.topology = topology or Topology.for_perf_models(self.perfs, num_instances)
        if self.topology.num_instances != num_instances:
            raise ValueError(f"the topology places {self.topology.num_instances} instances, "
                             f"the cluster has {num_instances}")
        self.links = LinkSimulator(self.topology)
        self.scheduler = GlobalScheduler(policy, num_instances)
        self.view = ClusterView(0.0, [], self.topology)
        self.instances = [
            SimInstance(LocalScheduler(i, model.kv_capacity_tokens // KV_BLOCK_TOKENS,
                                       self.settings.chunk_size_tokens,
                                       self.settings.max_batch_size, policy.queue_order()),
                        model, self.view, self.settings.max_span_steps, self.settings.seed)
            for i, model in enumerate(self.perfs)]
        aligned = self.settings.transfer_mode == "aligned"  # ids only matter for alignment
        for instance in self.instances:
            local = instance.local
            local.phase_priority = policy.phase_priority
            if self.settings.prefix_block_tokens:
                local.prefix_cache = PrefixCache(self.settings.prefix_block_tokens, aligned)
            if aligned:
                instance.blocks = BlockTable(local.total_blocks, local.prefix_cache)
        self.view.instances = self.instances
        self.tracker: DecodeLoadTracker | None = None
        if policy.decode_forecast is not None:  # ARES: one tracker (one shared predictor,
            self.tracker = DecodeLoadTracker(policy.decode_forecast)  # learning from all)
            for instance in self.instances:
                instance.tracker = self.tracker
        for instance in self.instances:  # orders that read the time and prefill estimates
            bind_order(instance.local.prefills.order, self._clock, instance.perf)
        self._initial_roles = list(self.scheduler.roles)
        self._heap: list[tuple[float, int, int, object, int]] = []
        self._seq = 0
        self._kicked: list[SimInstance] = []
        self._role_changes: list[RoleChange] = []
        self._outstanding = 0  # arrived and not yet finished or rejected
        self._completed = 0
        self._arrivals_pending = False
        self._stalled_ticks = 0
        self._migrations: dict[int, Migrate] = {}  # waiting for their source's step boundary
        self._migrated = 0  # migrations that left their source
        self._transfer_source: dict[int, int] = {}  # KV in flight: request -> source
        self._transfer_start_s: dict[int, float] = {}  # KV on the wire: request -> start
        self._link_event_s = math.inf  # when the pending link event is due
        self._link_version = 0  # bumps when the pending link event is superseded
        self._calls: dict[int, int] = {}  # transfer calls per request
        self._rounds = SessionRounds(())
        self._session_kv = SessionKV([i.local for i in self.instances], self._rounds.stats,
                                     lambda i: self._touch(self.instances[i]))
        self._init_lifecycle()
        self._apply(self.scheduler.initial_actions())  # reserves stopped, chunk sizes

    def _clock(self) -> float:
        return self.view.now_s

    # ---- event queue ----
    def _push(self, time_s: float, kind: int, payload: object, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (time_s, self._seq, kind, payload, version))

    def _touch(self, instance: SimInstance) -> None:
        """New work for `instance`: cut its span short, or start it after this event."""
        new_end = instance.interrupt(self.view.now_s)
        if new_end is not None:
            self._push(new_end, _BATCH_DONE, instance, instance.version)
        if instance.plan is None:
            self._kicked.append(instance)

    def _start_kicked(self) -> None:
        for instance in self._kicked:
            if instance.plan is None:
                end = instance.start_batch(self.view.now_s)
                if end is not None:
                    self._push(end, _BATCH_DONE, instance, instance.version)
                if instance.local.history_reads:
                    self._start_history_reads(instance)
        self._kicked.clear()

    # ---- sessions ----
    def _arrive(self, request: Request) -> None:
        self._outstanding += 1
        if request.history_tokens:
            self._session_kv.on_arrival(request)
        self._apply(self.scheduler.handle(Arrival(request), self.view))


    # ---- event handlers ----
    def _on_batch_done(self, instance: SimInstance) -> None:
        plan = instance.plan
        assert plan is not None
        instance.plan = None
        now = self.view.now_s
        self._record_tokens(instance, plan, now)
        result = instance.local.complete(plan, now - instance.start_s)
        if instance.blocks is not None:
            instance.blocks.done(result.finished)
        handle = self.scheduler.handle
        if self.tracker is not None:
            for request in result.finished:
                self.tracker.observe_finished(request)
        for request in result.finished:
            if math.isnan(request.first_token_s):
                request.first_token_s = now
            request.finish_s = now
            self._outstanding -= 1
            self._completed += 1
            self._apply(handle(Finished(request, instance.local.instance_id), self.view))
            if request.session_id >= 0:
                self._next_round(request)
        if result.recomputed:  # its decode instance emitted a token again
            record_decode_tokens(result.recomputed, now, now)
        for request in result.prefilled:
            request.first_token_s = now
            self._apply(handle(PrefillDone(request, instance.local.instance_id), self.view))
        if result.finished and instance.local.transfer_queue:
            self._start_transfers(instance)
        if self._migrations:
            self._start_migrations(instance)
        self._kicked.append(instance)

    def _record_tokens(self, instance: SimInstance, plan: BatchPlan, end_s: float) -> None:
        """Each decode of `plan` emitted one token per step; steps grow longer as the
        context grows, so the last step is the widest gap inside the batch."""
        decodes = plan.decodes
        if not decodes:
            return
        if plan.steps == 1:
            record_decode_tokens(decodes, end_s, end_s)
            return
        batch, context, steps = len(decodes), plan.decode_context_tokens, plan.steps
        step = instance.perf.decode.step_s
        record_decode_tokens(decodes, instance.start_s + step(batch, context), end_s,
                             step(batch, context + batch * (steps - 1)))

    def _on_tick(self) -> None:
        self._apply(self.scheduler.handle(Tick(), self.view))
        self.samples.append(LoadSample(
            self.view.now_s, [i.running_tokens for i in self.instances],
            [i.prefill_queue_tokens for i in self.instances],
            [i.used_blocks / i.total_blocks for i in self.instances],
            list(self.scheduler.roles)))
        if self._outstanding > 0 or self._arrivals_pending or self._rounds.pending:
            self._push(self.view.now_s + self.settings.monitor_interval_s, _TICK, None)

    def _stalled(self) -> bool:
        """Requests outstanding, none still to arrive, nothing running (and, as the caller
        checks, nothing but the next monitor tick left to happen)."""
        return (self._outstanding > 0 and not self._arrivals_pending
                and all(instance.plan is None for instance in self.instances))

    # ---- main loop ----
    def run(self, requests: list[Request],
            on_progress: Callable[[int], None] | None = None) -> SimResult:
        """Simulate `requests` (sorted by arrival) to completion."""
        self.samples: list[LoadSample] = []
        view, heap = self.view, self._heap
        self._rounds = SessionRounds(requests)
        self._session_kv.stats = self._rounds.stats
        arrivals = iter(self._rounds.first)
        next_arrival = next(arrivals, None)
        self._arrivals_pending = next_arrival is not None
        events = 0
        if next_arrival is not None:
            self._push(next_arrival.arrival_s, _TICK, None)
        while next_arrival is not None or heap:
            if next_arrival is not None and (not heap or next_arrival.arrival_s < heap[0][0]):
                view.now_s = next_arrival.arrival_s
                self._arrive(next_arrival)
                next_arrival = next(arrivals, None)
                self._arrivals_pending = next_arrival is not None
            else:
                time_s, _, kind, payload, version = heapq.heappop(heap)
                view.now_s = time_s
                if kind == _BATCH_DONE:
                    if version != payload.version:  # type: ignore[union-attr]
                        continue  # superseded by an interrupt
                    self._on_batch_done(payload)  # type: ignore[arg-type]
                elif kind == _TRANSFER_DONE:
                    if version != self._link_version:
                        continue  # superseded: the links changed since
                    self._on_links()
                elif kind == _ARRIVAL:
                    self._arrive(payload)  # type: ignore[arg-type]
                elif kind == INSTANCE_STARTED:
                    self._on_instance_started(payload)  # type: ignore[arg-type]
                else:
                    self._on_tick()
                    if on_progress is not None:
                        on_progress(self._completed)
            events += 1
            if self._kicked:
                self._start_kicked()
            if _only_tick_pending(heap):
                self._stalled_ticks = self._stalled_ticks + 1 if self._stalled() else 0
                if self._stalled_ticks >= STALL_TICKS:
                    raise RuntimeError(
                        f"simulation stalled at t={view.now_s:.3f}s: {self._outstanding} "
                        f"requests are waiting but no instance has run anything for "
                        f"{STALL_TICKS} monitor ticks (KV memory that never frees?)")
        if on_progress is not None:
            on_progress(self._completed)
        hits = sum(i.local.prefix_cache.hit_tokens_total for i in self.instances
                   if i.local.prefix_cache is not None)
        return SimResult(requests, self.samples, self._role_changes, view.now_s, events,
                         self._initial_roles, self._calls, hits, self._rounds.stats,
                         self.instance_s_total(view.now_s), self.scaling_events,
                         self._migrated)
