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

Structure: the simulator is the event loop and the simulated side of the one driver
contract (`cluster/actions.py: World`: a method per action, called by the shared
`apply_actions`). It owns the clock, the event heap, the instances and the scheduler, and
wires three collaborators that own their own state: `KVTransfers` (`sim/kv_transfers.py`:
hand-offs, migrations and history reads on the links), `InstanceLifecycle`
(`sim/lifecycle.py`: stopped instances and their time) and `SimSessions`
(`sim/sessions.py`: rounds and where their history KV is).

Token timing: at the end of each batch every decode records when its decode instance emitted
its first and last token of the batch and the widest gap in between
(`Request.record_decode_tokens`); for a span that is the last step, the longest, so the cost
is one call per decode per batch and no per-token list.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Sequence
from heapq import heappop, heappush

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
    Finished,
    InstanceStarted,
    PrefillDone,
    Tick,
)
from pdserve.cluster.history import ClusterHistory, DecisionKind, InstanceState
from pdserve.cluster.scheduler import GlobalScheduler
from pdserve.cluster.sessions import HistorySource
from pdserve.cluster.topology import Topology
from pdserve.instance.decode_forecast import DecodeLoadTracker
from pdserve.instance.local_scheduler import BatchPlan, LocalScheduler
from pdserve.instance.prefix_cache import PrefixCache
from pdserve.instance.queue_order import bind_order
from pdserve.metrics.attainment_watch import AttainmentWatch
from pdserve.perf.fitted import PerfModel
from pdserve.policies.base import Policy
from pdserve.sim.blocks import BlockTable
from pdserve.sim.instance import SimInstance
from pdserve.sim.kv_transfers import LINK_EVENT, KVTransfers
from pdserve.sim.lifecycle import INSTANCE_STARTED, InstanceLifecycle
from pdserve.sim.links import LinkSimulator
from pdserve.sim.records import SimResult, SimSettings
from pdserve.sim.sessions import SimSessions
from pdserve.types import KV_BLOCK_TOKENS, Request, record_decode_tokens

# event kinds on the heap
_BATCH_DONE, _LINK_EVENT, _TICK, _ARRIVAL, _INSTANCE_STARTED = 0, LINK_EVENT, 2, 3, \
    INSTANCE_STARTED


STALL_TICKS = 100  # consecutive ticks with nothing able to run before a run is declared stuck
# a run's monitor ticks at most (11.6 days at the default 1 s; each keeps a load sample):
# arrivals spread past that (a rate scale near 0, timestamps far apart, a tiny tick) would
# tick on for hours and fill the memory
MAX_TICKS = 1_000_000


class Simulator:
    """`perf` is one performance model for every instance or one per instance; `settings`
    are the run's config values (`pdserve.sim.runner.sim_settings`); `topology` places the
    instances and names their links (default: all on one node, each on its own model's GPU
    link)."""

    def __init__(self, policy: Policy, num_instances: int,
                 perf: PerfModel | Sequence[PerfModel], settings: SimSettings,
                 topology: Topology | None = None) -> None:
        self.settings = settings
        self.perfs = [perf] * num_instances if isinstance(perf, PerfModel) else list(perf)
        if len(self.perfs) != num_instances:
            raise ValueError(f"{len(self.perfs)} performance models for {num_instances} "
                             f"instances")
        self.topology = topology or Topology.for_perf_models(self.perfs, num_instances)
        if self.topology.num_instances != num_instances:
            raise ValueError(f"the topology places {self.topology.num_instances} instances, "
                             f"the cluster has {num_instances}")
        self.scheduler = GlobalScheduler(policy, num_instances)
        self.view = ClusterView(0.0, [], self.topology)
        aligned = self.settings.transfer_mode == "aligned"  # ids only matter for alignment
        prefix_tokens = self.settings.prefix_block_tokens
        self.instances = [
            SimInstance(LocalScheduler(i, model.kv_capacity_tokens // KV_BLOCK_TOKENS,
                                       self.settings.chunk_size_tokens,
                                       self.settings.max_batch_size, policy.queue_order(),
                                       policy.phase_priority,
                                       PrefixCache(prefix_tokens, aligned)
                                       if prefix_tokens else None),
                        model, self.view, self.settings.max_span_steps, self.settings.seed)
            for i, model in enumerate(self.perfs)]
        for instance in self.instances:
            if aligned:
                local = instance.local
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
        self.cluster_history = ClusterHistory()  # the decision log and the monitor's samples
        self._outstanding = 0  # arrived and not yet finished or rejected
        self._completed = 0
        self._arrivals_pending = False
        self._stalled_ticks = 0
        self._ticks = 0
        self._watch: AttainmentWatch | None = None  # a goodput step's early stop (`run`)
        self.transfers = KVTransfers(self.instances, self.perfs, LinkSimulator(self.topology),
                                     self.settings, self.view, self._push, self._touch)
        self.lifecycle = InstanceLifecycle(self.instances, self.settings.instance_startup_s)
        self.sessions = SimSessions([i.local for i in self.instances], self.perfs,
                                    lambda i: self._touch(self.instances[i]))
        self._apply(self.scheduler.initial_actions())  # reserves stopped, chunk sizes

    def _clock(self) -> float:
        return self.view.now_s

    # ---- event queue ----
    def _push(self, time_s: float, kind: int, payload: object, version: int = 0) -> None:
        self._seq += 1
        heappush(self._heap, (time_s, self._seq, kind, payload, version))

    def _touch(self, instance: SimInstance) -> None:
        """New work for `instance`: cut its span short, or start it after this event."""
        plan = instance.plan
        if plan is None:
            self._kicked.append(instance)
        elif plan.steps > 1:  # a one-step batch ends as planned
            new_end = instance.interrupt(self.view.now_s)
            if new_end is not None:
                self._push(new_end, _BATCH_DONE, instance, instance.version)

    def _start_kicked(self) -> None:
        now_s, heap = self.view.now_s, self._heap
        for instance in self._kicked:
            if instance.plan is None:
                end = instance.start_batch(now_s)
                if end is not None:
                    self._seq += 1
                    heappush(heap, (end, self._seq, _BATCH_DONE, instance, instance.version))
                if instance.local.history_reads:
                    self.sessions.start_history_reads(instance, self.transfers)
        self._kicked.clear()

    # ---- the scheduler's actions (`World`) ----
    def _apply(self, actions: list[Action]) -> None:
        if actions:  # (most finishes and ticks decide nothing)
            apply_actions(actions, self, self.scheduler.board.roles, self.cluster_history,
                          self.view.now_s)

    def serving(self, instance_id: int) -> bool:
        return instance_id not in self.lifecycle.stopped

    def dispatch_prefill(self, action: DispatchPrefill, history: HistorySource) -> None:
        request, instance = action.request, self.instances[action.instance_id]
        request.prefill_instance = action.instance_id
        if request.home_instance >= 0:
            self.sessions.on_dispatch_prefill(request, history)
        self._touch(instance)
        instance.local.enqueue_prefill(request)
        if instance.local.history_reads and instance.plan is not None:
            self.sessions.start_history_reads(instance, self.transfers)  # idle: when kicked

    def dispatch_decode(self, action: DispatchDecode) -> None:
        request, source = action.request, self.instances[action.source_id]
        if request.home_instance >= 0:
            self.sessions.on_dispatch_decode(request, action.target_id)
        if action.target_id == action.source_id:
            request.decode_instance = action.target_id
            request.decode_in_place()
            self._touch(source)
            source.local.continue_in_place(request)
        else:
            self.transfers.send(request, action.source_id, action.target_id)

    def reject(self, action: Reject) -> None:
        action.request.rejected_reason = action.reason
        self._outstanding -= 1
        self._completed += 1
        later_rounds = 0
        if action.request.session_id >= 0:
            later_rounds = self.sessions.on_reject(action.request, action.reason)
            self._completed += later_rounds
        if self._watch is not None:
            self._watch.rejected(action.request, later_rounds)

    def set_role(self, action: SetRole) -> None:
        pass  # the scheduler's board has the role; `apply_actions` logged the decision

    def set_chunk_size(self, action: SetChunkSize) -> None:
        instance = self.instances[action.instance_id]
        self._touch(instance)
        instance.local.set_chunk_size(action.chunk_size_tokens)

    def set_phase_priority(self, action: SetPhasePriority) -> None:
        instance = self.instances[action.instance_id]
        self._touch(instance)
        instance.local.set_phase_priority(action.priority)

    def migrate(self, action: Migrate) -> None:
        self.transfers.migrate(action)

    def stop_instance(self, action: StopInstance) -> None:
        self.lifecycle.stop(action.instance_id, self.view.now_s)

    def start_instance(self, action: StartInstance) -> None:
        due_s = self.lifecycle.start(action.instance_id, self.view.now_s)
        if due_s is not None:
            self._push(due_s, _INSTANCE_STARTED, action.instance_id)

    # ---- event handlers ----
    def _arrive(self, request: Request) -> None:
        self._outstanding += 1
        if self._watch is not None:
            self._watch.arrived(request)
        if request.history_tokens:
            self.sessions.on_arrival(request)
        self._apply(self.scheduler.handle(Arrival(request), self.view))

    def _on_batch_done(self, instance: SimInstance) -> None:
        plan = instance.plan
        assert plan is not None
        instance.plan = None
        now = self.view.now_s
        if plan.decodes:
            self._record_tokens(instance, plan, now)
        result = instance.local.complete(plan, now - instance.start_s)
        if instance.blocks is not None:
            instance.blocks.done(result.finished)
        handle = self.scheduler.handle
        if self.tracker is not None:
            for request in result.finished:
                self.tracker.observe_finished(request)
        for request in result.finished:  # (the loops below are empty in most batches)
            if math.isnan(request.first_token_s):
                request.first_token_s = now
            request.finish_s = now
            if self._watch is not None:
                self._watch.finished(request)
            self._outstanding -= 1
            self._completed += 1
            self._apply(handle(Finished(request, instance.local.instance_id), self.view))
            if request.session_id >= 0:
                after = self.sessions.follow_up(request, now)
                if after is not None:
                    self._push(after.arrival_s, _ARRIVAL, after)
        if result.recomputed:  # its decode instance emitted a token again
            record_decode_tokens(result.recomputed, now, now)
        for request in result.prefilled:
            request.first_token_s = now
            self._apply(handle(PrefillDone(request, instance.local.instance_id), self.view))
        if result.finished and instance.local.transfer_queue:
            self.transfers.start_transfers(instance)
        if self.transfers.migrations:
            self.transfers.start_migrations(instance)
        self._kicked.append(instance)

    def _record_tokens(self, instance: SimInstance, plan: BatchPlan, end_s: float) -> None:
        """Each decode of `plan` (it has some) emitted one token per step; steps grow longer
        as the context grows, so the last step is the widest gap inside the batch."""
        decodes = plan.decodes
        if plan.steps == 1:
            record_decode_tokens(decodes, end_s, end_s)
            return
        batch, steps = len(decodes), plan.steps
        record_decode_tokens(decodes, instance.start_s + instance.span.first_step_s,  # type: ignore[union-attr]
                             end_s, instance.perf.decode.step_s(
                                 batch, plan.decode_context_tokens + batch * (steps - 1)))

    def _on_instance_started(self, instance_id: int) -> None:
        if self.lifecycle.started(instance_id, self.view.now_s):
            self.cluster_history.record(self.view.now_s, DecisionKind.STARTED, instance_id,
                                "its start-up time passed")
            self._apply(self.scheduler.handle(InstanceStarted(instance_id), self.view))

    def _on_tick(self) -> None:
        self._ticks += 1
        if self._ticks > MAX_TICKS:
            raise ValueError(
                f"the simulation passed {MAX_TICKS} monitor ticks of "
                f"{self.settings.monitor_interval_s:g} s (at t={self.view.now_s:.3g} s): the "
                f"arrivals span too long for that tick (a rate scale near 0, timestamps far "
                f"apart?); clip the workload or raise monitor.interval_s")
        if self._watch is not None:
            self._watch.tick(self.view.now_s)
        self._apply(self.scheduler.handle(Tick(), self.view))
        states = [InstanceState.UP] * len(self.instances)
        for i in self.lifecycle.stopped:
            states[i] = InstanceState.STOPPED
        self.cluster_history.sample(self.view.now_s, self.instances, self.scheduler.roles,
                                    states)
        if self._outstanding > 0 or self._arrivals_pending or self.sessions.rounds.pending:
            self._push(self.view.now_s + self.settings.monitor_interval_s, _TICK, None)

    def _stalled(self) -> bool:
        """Requests outstanding, none still to arrive, nothing running (and, as the caller
        checks, nothing but the next monitor tick left to happen)."""
        return (self._outstanding > 0 and not self._arrivals_pending
                and all(instance.plan is None for instance in self.instances))

    # ---- main loop ----
    def run(self, requests: list[Request],
            on_progress: Callable[[int], None] | None = None,
            watch: AttainmentWatch | None = None) -> SimResult:
        """Simulate `requests` (sorted by arrival) to completion, or, with a `watch`, until
        it has decided the run's SLO attainment either way (`decided_early` in the result;
        the requests not done then stay unfinished).

        The cyclic garbage collector is paused meanwhile: the loop's objects (events,
        actions, plans, heap entries) die by reference counting, while a collection would
        re-scan every request and monitor sample the run holds, ever more of them (on
        bench/sim_speed.py one full collection and eight partial ones, 80 ms of a 0.9 s run)."""
        self.cluster_history.samples.clear()
        self._watch = watch
        collecting = gc.isenabled()
        gc.disable()
        try:
            events = self._loop(requests, on_progress, watch)
        finally:
            if collecting:
                gc.enable()
        if on_progress is not None:
            on_progress(self._completed)
        hits = sum(i.local.prefix_cache.hit_tokens_total for i in self.instances
                   if i.local.prefix_cache is not None)
        history = self.cluster_history
        return SimResult(requests, list(history.samples), list(history.decisions),
                         self.view.now_s, events, self._initial_roles, self.transfers.calls,
                         hits, self.sessions.stats,
                         self.lifecycle.instance_s_total(self.view.now_s),
                         self.transfers.migrated,
                         decided_early=watch is not None and watch.decided)

    def _loop(self, requests: list[Request], on_progress: Callable[[int], None] | None,
              watch: AttainmentWatch | None) -> int:
        """The event loop of `run`; returns the events handled."""
        view, heap, kicked, transfers = self.view, self._heap, self._kicked, self.transfers
        arrivals = iter(self.sessions.load(requests))
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
                time_s, _, kind, payload, version = heappop(heap)
                view.now_s = time_s
                if kind == _BATCH_DONE:
                    if version != payload.version:  # type: ignore[union-attr]
                        continue  # superseded by an interrupt
                    self._on_batch_done(payload)  # type: ignore[arg-type]
                elif kind == _LINK_EVENT:
                    if not transfers.current(version):
                        continue  # superseded: the links changed since
                    transfers.on_link_event()
                elif kind == _ARRIVAL:
                    self._arrive(payload)  # type: ignore[arg-type]
                elif kind == _INSTANCE_STARTED:
                    self._on_instance_started(payload)  # type: ignore[arg-type]
                else:
                    self._on_tick()
                    if on_progress is not None:
                        on_progress(self._completed)
            events += 1
            if kicked:
                self._start_kicked()
            if watch is not None and watch.decided:
                break
            if len(heap) == 1 and heap[0][2] == _TICK:  # only the next monitor tick left
                self._stalled_ticks = self._stalled_ticks + 1 if self._stalled() else 0
                if self._stalled_ticks >= STALL_TICKS:
                    raise RuntimeError(
                        f"simulation stalled at t={view.now_s:.3f}s: {self._outstanding} "
                        f"requests are waiting but no instance has run anything for "
                        f"{STALL_TICKS} monitor ticks (KV memory that never frees?)")
        return events
