"""Multi-round sessions in the simulator (AMPD sec. 3, "Overall workflow").

A session's rounds arrive one after another: round r+1 is sent `tool_delay_s` after round r
finished (the tool or environment interaction), so only first rounds come from the
workload's arrival times. Its prompt is the history (earlier prompts and outputs) plus new
tokens; the history's KV stays on the instance that decoded the previous round (the
session's binding, `home_instance`) unless it was evicted there under memory pressure.

Where the history goes, per dispatch:
  prefill on the home instance       local: the prefill takes the history blocks over
  prefill on a prefill-only instance remote: it reads the history from home when it heads
                                     that queue (lazily), and hands back only the new KV
  prefill on another instance that   no history there: the round recomputes it, and the
  decodes (colocated elsewhere)      copy at home is dropped
  decode on an instance other than   the hand-off carries the whole sequence and the copy at
  home                               home is dropped
Counters (`SessionStats`): rounds whose history had been evicted (a forced re-prefill),
rounds that recomputed history for lack of affinity, history bytes read, local and remote
prefills of rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.types import Request, Role


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """A remote prefill reading its session's history KV from the home instance (a
    transfer on the links, like a hand-off)."""

    request: Request
    instance_id: int  # the prefill instance


@dataclass
class SessionStats:
    rounds: int = 0  # rounds after the first that arrived
    history_evicted: int = 0  # their history KV had been evicted: re-prefilled
    history_recomputed: int = 0  # prefilled away from the history: recomputed
    history_read_bytes: float = 0.0  # read by remote prefills
    local_prefills: int = 0  # rounds prefilled on their home (decode) instance
    remote_prefills: int = 0  # rounds with a home prefilled elsewhere


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
        first.sort(key=lambda r: r.arrival_s)
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


class SessionKV:
    """Where a round's history KV is, as the cluster's instances hold it."""

    def __init__(self, locals_: Sequence[LocalScheduler], stats: SessionStats,
                 on_freed: Callable[[int], None]) -> None:
        self.locals = locals_
        self.stats = stats
        self.on_freed = on_freed  # an instance got blocks back (it may have been waiting)

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

    def on_dispatch_prefill(self, request: Request, instance_id: int, role: Role) -> None:
        home = request.home_instance
        if request.history_tokens <= 0 or home < 0:
            return
        if instance_id == home:
            self.stats.local_prefills += 1
            return
        self.stats.remote_prefills += 1
        if request.cached_prefix_tokens and role.takes_decode:
            self._drop_at_home(request)
            request.cached_prefix_tokens = 0
            self.stats.history_recomputed += 1

    def on_dispatch_decode(self, request: Request, target_id: int) -> None:
        if request.home_instance >= 0 and target_id != request.home_instance:
            self._drop_at_home(request)

    def _drop_at_home(self, request: Request) -> None:
        home = self.locals[request.home_instance]
        freed = home.sessions.drop(request.session_id)
        if freed:
            home.free_blocks += freed
            self.on_freed(request.home_instance)
