"""How the simulator moves KV between instances: P->D hand-offs and migrations queue at the
target, start when it admits them, run on the cluster's links (`sim.links`, ports shared
max-min fairly) and free the source's blocks when they land. A mixin of `Simulator`, which
owns the state it reads (`instances`, `links`, `settings`, the transfer bookkeeping)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from pdserve.sim.sessions import HistoryRead
from pdserve.types import Request

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pdserve.cluster.actions import Migrate
    from pdserve.cluster.events import ClusterView
    from pdserve.perf.fitted import PerfModel
    from pdserve.sim.instance import SimInstance
    from pdserve.sim.links import LinkSimulator
    from pdserve.sim.records import SimSettings

TRANSFER_DONE = 1  # the event kind of the links' next join or end


class KVMovement:
    # the simulator's state this part reads and writes
    instances: list[SimInstance]
    perfs: Sequence[PerfModel]
    links: LinkSimulator
    settings: SimSettings
    view: ClusterView
    _migrations: dict[int, Migrate]
    _migrated: int
    _transfer_source: dict[int, int]
    _transfer_start_s: dict[int, float]
    _calls: dict[int, int]
    _link_event_s: float
    _link_version: int

    def _send_kv(self, request: Request, source_id: int, target_id: int) -> None:
        """Queue a held sequence's KV for `target_id`; `source_id` frees it when it lands
        (a P->D hand-off or a migration alike)."""
        self._transfer_source[request.request_id] = source_id
        request.decode_instance = target_id
        target = self.instances[target_id]
        self._touch(target)
        target.local.enqueue_transfer_in(request)
        self._start_transfers(target)

    def _start_migrations(self, source: SimInstance) -> None:
        """Detach the decodes waiting to leave `source` (between its steps) and send them."""
        for request_id, action in list(self._migrations.items()):
            if action.source_id != source.local.instance_id:
                continue
            del self._migrations[request_id]
            if source.local.detach(action.request):  # else finished or preempted meanwhile
                self._migrated += 1
                self._send_kv(action.request, action.source_id, action.target_id)

    def _start_transfers(self, target: SimInstance) -> None:
        now = self.view.now_s
        started = False
        for request in target.local.admit_transfers():
            source = self._transfer_source[request.request_id]
            tokens = request.sequence_tokens - 1  # less the session history already there:
            tokens -= target.local.transfer_reused_tokens.pop(request.request_id, 0)
            num_bytes = tokens * self.perfs[source].kv_bytes_per_token
            calls = self._transfer_calls(request, self.instances[source], target)
            self._calls[request.request_id] = self._calls.get(request.request_id, 0) + calls
            self.links.start(request, now, source, target.local.instance_id, num_bytes, calls)
            self._transfer_start_s[request.request_id] = now
            started = True
        if started:
            self._schedule_links()

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

    def _schedule_links(self) -> None:
        """Keep one pending event at the links' next join or end."""
        time_s = self.links.next_event_s()
        if time_s != self._link_event_s:
            self._link_event_s = time_s
            self._link_version += 1
            if time_s < math.inf:
                self._push(time_s, TRANSFER_DONE, None, self._link_version)

    def _on_links(self) -> None:
        self._link_event_s = math.inf
        for done in self.links.advance(self.view.now_s):
            if type(done) is HistoryRead:
                self._on_history_read(done)
            else:
                self._on_transfer_done(done)  # type: ignore[arg-type]
        self._schedule_links()

    def _on_transfer_done(self, request: Request) -> None:
        request.transfer_s += self.view.now_s - self._transfer_start_s.pop(request.request_id)
        source = self.instances[self._transfer_source.pop(request.request_id)]
        target = self.instances[request.decode_instance]
        self._touch(source)
        source.local.release_handoff(request)
        if source.blocks is not None:
            source.blocks.free(request.request_id)
        if source.local.transfer_queue:  # the freed blocks may admit KV waiting to come in
            self._start_transfers(source)
        self._touch(target)
        target.local.transfer_done(request)
