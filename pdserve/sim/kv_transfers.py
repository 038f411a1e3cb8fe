"""KV on the simulated cluster's links: P->D hand-offs, migrations and session-history reads.

A hand-off or a migration queues at its target (`LocalScheduler.enqueue_transfer_in`),
starts when the target can reserve its blocks (`admit_transfers`), runs on the cluster's
links (`sim/links.py`: ports shared max-min fairly) and frees the source's blocks when it
lands. A migration waits for its source's next step boundary before it leaves. A session
round prefilled away from its history reads the history over the same links.

`KVTransfers` owns this bookkeeping (what is in flight from where since when, the calls
each request's transfers made, the pending migrations, the links' one scheduled event) and
nothing else: the simulator wires it with its instances, its cluster view (read for the
current time only) and two callables (a push onto its event heap, and `touch`: an instance
got work or memory).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdserve.cluster.actions import Migrate
from pdserve.cluster.events import ClusterView
from pdserve.perf.fitted import PerfModel
from pdserve.sim.instance import SimInstance
from pdserve.sim.links import LinkSimulator
from pdserve.sim.records import SimSettings
from pdserve.types import Request

LINK_EVENT = 1  # the event kind, on the simulator's heap, of the links' next join or end


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """A remote prefill reading its session's history KV from the home instance (a
    transfer on the links, like a hand-off)."""

    request: Request
    instance_id: int  # the prefill instance


class KVTransfers:
    def __init__(self, instances: Sequence[SimInstance], perfs: Sequence[PerfModel],
                 links: LinkSimulator, settings: SimSettings, view: ClusterView,
                 push: Callable[[float, int, object, int], None],
                 touch: Callable[[SimInstance], None]) -> None:
        self.instances = instances
        self.perfs = perfs
        self.links = links
        self.settings = settings
        self._view, self._push, self._touch = view, push, touch
        self.migrations: dict[int, Migrate] = {}  # waiting for their source's step boundary
        self.migrated = 0  # migrations that left their source
        self.calls: dict[int, int] = {}  # transfer calls per request
        self._source: dict[int, int] = {}  # KV in flight: request -> source
        self._start_s: dict[int, float] = {}  # KV on the wire: request -> start
        self._event_s = math.inf  # when the pending link event is due
        self._version = 0  # bumps when the pending link event is superseded
        # the calls of every transfer in the "fixed" mode (0: counted per transfer)
        self._fixed_calls = settings.transfer_calls if settings.transfer_mode == "fixed" else 0

    # ---- hand-offs and migrations ----
    def send(self, request: Request, source_id: int, target_id: int) -> None:
        """Queue a held sequence's KV for `target_id`; `source_id` frees it when it lands
        (a P->D hand-off or a migration alike)."""
        self._source[request.request_id] = source_id
        request.decode_instance = target_id
        target = self.instances[target_id]
        self._touch(target)
        target.local.enqueue_transfer_in(request)
        self.start_transfers(target)

    def migrate(self, action: Migrate) -> None:
        """Move a running decode at its source's next step boundary."""
        source = self.instances[action.source_id]
        self._touch(source)
        self.migrations[action.request.request_id] = action
        if source.plan is None:
            self.start_migrations(source)

    def start_migrations(self, source: SimInstance) -> None:
        """Detach the decodes waiting to leave `source` (between its steps) and send them."""
        for request_id, action in list(self.migrations.items()):
            if action.source_id != source.local.instance_id:
                continue
            del self.migrations[request_id]
            if source.local.detach(action.request):  # else finished or preempted meanwhile
                self.migrated += 1
                self.send(action.request, action.source_id, action.target_id)

    def start_transfers(self, target: SimInstance) -> None:
        """Start the transfers into `target` that it can reserve blocks for now."""
        local = target.local
        started = local.admit_transfers()
        if not started:
            return
        now = self._view.now_s
        for request in started:
            request_id = request.request_id
            source = self._source[request_id]
            tokens = request.sequence_tokens - 1  # less the session history already there:
            tokens -= local.transfer_reused_tokens.pop(request_id, 0)
            num_bytes = tokens * self.perfs[source].kv_bytes_per_token
            calls = self._fixed_calls or self._transfer_calls(request, self.instances[source],
                                                              target)
            self.calls[request_id] = self.calls.get(request_id, 0) + calls
            self.links.start(request, now, source, local.instance_id, num_bytes, calls)
            self._start_s[request_id] = now
        self._schedule()

    def _transfer_calls(self, request: Request, source: SimInstance,
                        target: SimInstance) -> int:
        settings = self.settings
        if target.blocks is None or source.blocks is None:
            if settings.transfer_mode == "per-block-per-layer":
                return request.kv_blocks * settings.kv_layers * 2
            return settings.transfer_calls
        target.blocks.sync_cache()
        target.blocks.resize(request.request_id, request.kv_blocks)
        return target.blocks.transfer_calls(source.blocks, request, settings.transfer_mode,
                                            settings.kv_layers, settings.transfer_calls)

    # ---- session history ----
    def read_history(self, request: Request, target_id: int, num_bytes: float) -> None:
        """Read a remote prefill's session history from its home instance."""
        now = self._view.now_s
        self.links.start(HistoryRead(request, target_id), now, request.home_instance,
                         target_id, num_bytes, self.settings.transfer_calls)
        self._start_s[request.request_id] = now
        self._schedule()

    # ---- the links' events ----
    def _schedule(self) -> None:
        """Keep one pending event at the links' next join or end."""
        time_s = self.links.next_event_s()
        if time_s != self._event_s:
            self._event_s = time_s
            self._version += 1
            if time_s < math.inf:
                self._push(time_s, LINK_EVENT, None, self._version)

    def current(self, version: int) -> bool:
        """Whether a link event of `version` is still the pending one (not superseded)."""
        return version == self._version

    def on_link_event(self) -> None:
        """The links' scheduled (current) event is due."""
        self._event_s = math.inf
        for done in self.links.advance(self._view.now_s):
            if type(done) is HistoryRead:
                self._history_read_done(done)
            else:
                self._transfer_done(done)  # type: ignore[arg-type]
        self._schedule()

    def _history_read_done(self, read: HistoryRead) -> None:
        request = read.request
        request.transfer_s += self._view.now_s - self._start_s.pop(request.request_id)
        instance = self.instances[read.instance_id]
        self._touch(instance)
        instance.local.history_read_done(request)

    def _transfer_done(self, request: Request) -> None:
        request.transfer_s += self._view.now_s - self._start_s.pop(request.request_id)
        source = self.instances[self._source.pop(request.request_id)]
        target = self.instances[request.decode_instance]
        self._touch(source)
        source.local.release_handoff(request)
        if source.blocks is not None:
            source.blocks.free(request.request_id)
        if source.local.transfer_queue:  # the freed blocks may admit KV waiting to come in
            self.start_transfers(source)
        self._touch(target)
        target.local.transfer_done(request)
