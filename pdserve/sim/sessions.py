"""Multi-round sessions in the simulator (AMPD sec. 3, "Overall workflow").

A session's rounds arrive one after another: round r+1 is sent `tool_delay_s` after round r
finished (the tool or environment interaction), so only first rounds come from the
workload's arrival times. Its prompt is the history (earlier prompts and outputs) plus new
tokens; the history's KV stays on the instance that decoded the previous round (the
session's binding, `home_instance`) unless it was evicted there under memory pressure.

Where a dispatched round's history comes from is decided once for both worlds
(`cluster/sessions.py: history_source`); this module carries the decision out:
  LOCAL      the prefill takes the history blocks over (`LocalScheduler.enqueue_prefill`)
  READ       it reads the history from home when it heads its prefill queue (lazily,
             `start_history_reads`, over the links) and hands back only the new KV
  RECOMPUTE  no history there: the round recomputes it, and the copy at home is dropped
  GONE       its history is gone (evicted, or home stopped): it computes it all
and a decode continued on an instance other than home carries the whole sequence (the copy
at home is dropped).
Counters (`SessionStats`): rounds whose history had been evicted (a forced re-prefill),
rounds that recomputed history for lack of affinity, history bytes read, local and remote
prefills of rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

from pdserve.cluster.sessions import HistorySource
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.perf.fitted import PerfModel
from pdserve.sim.instance import SimInstance
from pdserve.sim.kv_transfers import KVTransfers
from pdserve.sim.records import SessionStats
from pdserve.types import Request


class SessionRounds:
    """The rounds of every session, chained: `first` are the requests that arrive on
    their own (single requests and first rounds, in arrival order); `follow_up` releases
    the next round of a finished one."""

    def __init__(self, requests: Sequence[Request]) -> None:
        self._next: dict[int, Request] = {}
        self.stats = SessionStats()
        by_session: dict[int, list[Request]] = {}
        first: list[Request] = []
        for request in requests:
            if request.session_id < 0:
                first.append(request)
            else:
                by_session.setdefault(request.session_id, []).append(request)
        for rounds in by_session.values():
            rounds.sort(key=lambda r: r.round_index)
            first.append(rounds[0])
            for before, after in zip(rounds, rounds[1:], strict=False):
                self._next[before.request_id] = after
        first.sort(key=attrgetter("arrival_s"))  # (a C key: no Python call per request)
        self.first = first
        self.pending = len(self._next)  # rounds not yet released

    def follow_up(self, request: Request, now_s: float) -> Request | None:
        """The round after `request` (finished at `now_s`), with its arrival set, or None."""
        after = self._next.pop(request.request_id, None)
        if after is None:
            return None
        self.pending -= 1
        after.arrival_s = now_s + after.tool_delay_s
        after.home_instance = request.decode_instance
        return after

    def rest_of_session(self, request: Request) -> list[Request]:
        """The rounds after a rejected one: they can never be sent."""
        rest = []
        while (after := self._next.pop(request.request_id, None)) is not None:
            self.pending -= 1
            rest.append(after)
            request = after
        return rest


class SimSessions:
    """The sessions of a run: their rounds (`SessionRounds`) and where each round's history
    KV is, as the cluster's instances hold it. `on_freed(instance_id)`: an instance got
    blocks back (it may have been waiting for memory)."""

    def __init__(self, locals_: Sequence[LocalScheduler], perfs: Sequence[PerfModel],
                 on_freed: Callable[[int], None]) -> None:
        self.locals = locals_
        self.perfs = perfs
        self.on_freed = on_freed
        self.rounds = SessionRounds(())

    @property
    def stats(self) -> SessionStats:
        return self.rounds.stats

    def load(self, requests: Sequence[Request]) -> list[Request]:
        """Chain the rounds of a run's requests; returns those that arrive on their own
        (single requests and first rounds, in arrival order)."""
        self.rounds = SessionRounds(requests)
        return self.rounds.first

    def on_arrival(self, request: Request) -> None:
        """Pin the history at home for this round; 0 tokens if it was evicted."""
        if request.history_tokens <= 0:
            return
        self.stats.rounds += 1
        home = request.home_instance
        if home < 0:  # its earlier rounds are not in the workload (a clipped trace)
            return
        cached = self.locals[home].sessions.pin(request.session_id)
        request.cached_prefix_tokens = min(cached, request.history_tokens)
        if not cached:
            self.stats.history_evicted += 1

    def on_dispatch_prefill(self, request: Request, history: HistorySource) -> None:
        """Carry out `history_source`'s decision for a round dispatched to prefill."""
        if history is HistorySource.LOCAL:
            self.stats.local_prefills += 1
        elif history.remote:
            self.stats.remote_prefills += 1
            if history is HistorySource.RECOMPUTE:
                self._drop_at_home(request)
                request.cached_prefix_tokens = 0
                self.stats.history_recomputed += 1
            elif history is HistorySource.GONE and request.cached_prefix_tokens:
                self._drop_at_home(request)  # home stopped: whatever it kept is gone
                request.cached_prefix_tokens = 0

    def on_dispatch_decode(self, request: Request, target_id: int) -> None:
        """A decode continued away from home carries its whole sequence: drop the copy."""
        if request.home_instance >= 0 and target_id != request.home_instance:
            self._drop_at_home(request)

    def on_reject(self, request: Request, reason: str) -> int:
        """A round was rejected: its history is no longer needed and the session's later
        rounds can never be sent (rejected too); returns how many those were."""
        if request.home_instance >= 0:
            self._drop_at_home(request)
        later = self.rounds.rest_of_session(request)
        for after in later:
            after.rejected_reason = f"an earlier round was rejected: {reason}"
        return len(later)

    def follow_up(self, request: Request, now_s: float) -> Request | None:
        """The session's next round after `request` finished at `now_s`, or None."""
        return self.rounds.follow_up(request, now_s)

    def start_history_reads(self, instance: SimInstance, transfers: KVTransfers) -> None:
        """Start the history reads of the rounds now heading `instance`'s prefill queue."""
        for request in instance.local.history_reads_due():
            num_bytes = (request.cached_prefix_tokens
                         * self.perfs[request.home_instance].kv_bytes_per_token)
            self.stats.history_read_bytes += num_bytes
            transfers.read_history(request, instance.local.instance_id, num_bytes)

    def _drop_at_home(self, request: Request) -> None:
        if self.locals[request.home_instance].drop_session_history(request.session_id):
            self.on_freed(request.home_instance)
