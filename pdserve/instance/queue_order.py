"""The ordering hook of an instance's prefill queue.

The local scheduler keeps waiting prefills in a list and asks a `QueueOrder` where a new
request goes. FCFS appends; AMPD's TTFT-aware reordering (a later policy) inserts elsewhere.
Preempted requests always go back to the front, ahead of any ordering, as in vLLM.

An order may also decide at admission time (AMPD's Alg. 2 reorders a window at the head
each time a task is dequeued): `choose(queue)` returns a permutation of the first indices
of the queue without changing anything, and `commit(queue, permutation)` applies it when
the chosen request is admitted (`PrefillQueue.peek` / `admit_head`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from pdserve.types import Request, attn_units

if TYPE_CHECKING:
    from pdserve.perf.fitted import PerfModel


class QueueOrder(Protocol):
    def insert(self, queue: list[Request], request: Request) -> None:
        """Put `request` into `queue` (index 0 is scheduled next)."""
        ...


class FCFSOrder:
    """First come, first served."""

    def insert(self, queue: list[Request], request: Request) -> None:
        queue.append(request)


def bind_order(order: QueueOrder, clock: Callable[[], float], perf: PerfModel) -> None:
    """Give an order that reads the time and prefill estimates (one with `bind_instance`,
    AMPD's Alg. 2) its instance's clock and performance model; the simulator binds its
    simulated clock, a live worker `time.monotonic` (arrival times are the driver's
    `time.monotonic`, the same clock on one host)."""
    bind = getattr(order, "bind_instance", None)
    if bind is None:
        return

    def remaining_prefill_s(request: Request) -> float:
        tokens = request.prefill_target_tokens - request.prefilled_tokens
        return perf.prefill.time_s(tokens, attn_units(tokens, request.prefilled_tokens))

    bind(clock, remaining_prefill_s)
