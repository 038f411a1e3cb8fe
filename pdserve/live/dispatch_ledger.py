"""The driver's view of a worker's load between its reports: the reported snapshot plus the
dispatches the worker had not yet received when it took it.

A worker reports its load (`InstanceStats`) after every step and, when idle, whenever it
changed. A report is a snapshot of the moment it was sent; a request the driver dispatched
a moment earlier may still sit in the pipe, so the snapshot does not count it. Taking the
snapshot as the view would erase that dispatch until the worker's next report, a whole step
later: with a 512-token prefill that is ~80 ms on the CPU, during which a busy worker looks
idle to the router and the next arrival can land behind that prefill. The simulator's view
is exact, so this was a live-only queue (docs/results/fidelity.md measures it).

So the ledger numbers the load-carrying commands it sends to each worker (`AddRequest`: a
prefill queued; `AdoptKV`: a decode queued), the worker counts those it has handled and
sends the count with every report (`dispatches_received`), and the view is the report plus
every dispatch numbered above that count. Pipes are FIFO, so a count acknowledges every
dispatch up to it. A worker that exits, stops or starts begins a new count (`reset`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

from pdserve.instance.stats import InstanceStats
from pdserve.types import attn_units
from pdserve.worker.messages import AddRequest, AdoptKV, Command


@dataclass(frozen=True)
class Dispatch:
    """One load-carrying command in flight to a worker: its number and what it queues."""

    number: int
    is_prefill: bool  # an AddRequest (a prefill queued), else an AdoptKV (a decode queued)
    tokens: int  # the prefill's tokens (prompt + resumed), or the decoding sequence's


def dispatch_of(command: Command, number: int) -> Dispatch | None:
    """The load `command` puts on its worker, or None for a command that queues nothing."""
    if isinstance(command, AddRequest):
        return Dispatch(number, True, len(command.prompt_ids) + len(command.resume_ids))
    if isinstance(command, AdoptKV):
        return Dispatch(number, False, len(command.handoff.token_ids))
    return None


class DispatchLedger:
    def __init__(self) -> None:
        self._sent: dict[int, int] = {}  # instance -> dispatches numbered so far
        self._in_flight: dict[int, deque[Dispatch]] = {}
        self._reported: dict[int, InstanceStats] = {}

    def sent(self, instance: int, command: Command) -> bool:
        """Count `command` if it carries load; True when it did (the view changed)."""
        dispatch = dispatch_of(command, self._sent.get(instance, 0) + 1)
        if dispatch is None:
            return False
        self._sent[instance] = dispatch.number
        self._in_flight.setdefault(instance, deque()).append(dispatch)
        return True

    def reported(self, instance: int, stats: InstanceStats, received: int) -> InstanceStats:
        """The worker's snapshot, taken after it had handled `received` dispatches; returns
        the view: the snapshot plus what it has not received yet."""
        self._reported[instance] = stats
        in_flight = self._in_flight.get(instance)
        while in_flight and in_flight[0].number <= received:
            in_flight.popleft()
        return self.view(instance)

    def view(self, instance: int) -> InstanceStats:
        stats = self._reported[instance]
        in_flight = self._in_flight.get(instance)
        if not in_flight:
            return stats
        prefills = [d.tokens for d in in_flight if d.is_prefill]
        decodes = [d.tokens for d in in_flight if not d.is_prefill]
        return replace(
            stats, prefill_queue_len=stats.prefill_queue_len + len(prefills),
            prefill_queue_tokens=stats.prefill_queue_tokens + sum(prefills),
            prefill_queue_attn_units=(stats.prefill_queue_attn_units
                                      + sum(attn_units(n, 0) for n in prefills)),
            decode_queue_len=stats.decode_queue_len + len(decodes),
            decode_queue_tokens=stats.decode_queue_tokens + sum(decodes))

    def in_flight(self, instance: int) -> int:
        return len(self._in_flight.get(instance, ()))

    def reset(self, instance: int, stats: InstanceStats) -> InstanceStats:
        """The instance's worker exited, stopped or (re)started: nothing is in flight to it
        and its count starts again from 0; `stats` is its load now."""
        self._sent[instance] = 0
        self._in_flight.pop(instance, None)
        self._reported[instance] = stats
        return stats
