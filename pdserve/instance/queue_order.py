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

from typing import Protocol

from pdserve.types import Request


class QueueOrder(Protocol):
    def insert(self, queue: list[Request], request: Request) -> None:
        """Put `request` into `queue` (index 0 is scheduled next)."""
        ...


class FCFSOrder:
    """First come, first served."""

    def insert(self, queue: list[Request], request: Request) -> None:
        queue.append(request)
