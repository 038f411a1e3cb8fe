"""Multi-round sessions on the simulator's clock (a mixin of `Simulator`): a finished
round schedules its session's next one after the tool delay, and a remote prefill reads
its session's history KV over the links when it heads its queue (`sim/sessions.py` holds
the rounds and the history bookkeeping)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pdserve.cluster.events import ClusterView
from pdserve.perf.fitted import PerfModel
from pdserve.sim.instance import SimInstance
from pdserve.sim.links import LinkSimulator
from pdserve.sim.records import SimSettings
from pdserve.sim.sessions import HistoryRead, SessionRounds
from pdserve.types import Request

ARRIVAL = 3  # event kind on the simulator's heap: a request arrives


class SessionRoundsDriving:
    settings: SimSettings
    view: ClusterView
    instances: list[SimInstance]
    perfs: Sequence[PerfModel]
    links: LinkSimulator
    _rounds: SessionRounds
    _transfer_start_s: dict[int, float]
    _push: Callable[..., None]
    _touch: Callable[[SimInstance], None]
    _schedule_links: Callable[[], None]

    def _next_round(self, request: Request) -> None:
        after = self._rounds.follow_up(request, self.view.now_s)
        if after is not None:
            self._push(after.arrival_s, ARRIVAL, after)

    def _start_history_reads(self, instance: SimInstance) -> None:
        now, target = self.view.now_s, instance.local.instance_id
        for request in instance.local.history_reads_due():
            num_bytes = (request.cached_prefix_tokens
                         * self.perfs[request.home_instance].kv_bytes_per_token)
            self._rounds.stats.history_read_bytes += num_bytes
            self.links.start(HistoryRead(request, target), now, request.home_instance,
                             target, num_bytes, self.settings.transfer_calls)
            self._transfer_start_s[request.request_id] = now
            self._schedule_links()

    def _on_history_read(self, read: HistoryRead) -> None:
        request = read.request
        request.transfer_s += self.view.now_s - self._transfer_start_s.pop(request.request_id)
        instance = self.instances[read.instance_id]
        self._touch(instance)
        instance.local.history_read_done(request)
