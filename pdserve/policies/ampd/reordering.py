"""AMPD's TTFT-aware prefill reordering (Algorithm 2, Eq. 3-4), as a `QueueOrder`.

Each time the instance dequeues a prefill, it looks at the first `window` waiting tasks W
and picks the ordering pi of W that maximises the number of tasks expected to meet the TTFT
SLO (Eq. 4):
    S_pi = sum_k  1[ (T_now - T_enq(pi(k))) + C(pi(k)) <= TTFT_SLO ],
    C(pi(k)) = sum_{j <= k} t_pre(pi(j))                                        (Eq. 3)
where T_enq is the task's arrival (TTFT counts from there) and t_pre its estimated prefill
time (history-aware: the new tokens attend to the reused history). Orderings that postpone a
task whose postponement counter has reached `window` are skipped (lines 3-4); the chosen
ordering increments the counters of the tasks it postpones (line 7), then the window is
reordered and its head admitted (lines 8-9). A task is postponed when a task queued behind
it is put ahead of it. Ties keep the earlier ordering in lexicographic order, so with no
gain the queue stays first come, first served.

The search is exact: a dynamic programme over subsets of W (the completion time of a
prefix depends only on its set), O(2^w * w) rather than w!; `best_order_brute_force`
enumerates the orderings as the paper's Algorithm 2 writes it, and the tests check that
both agree.

The order needs the time and a prefill-time estimate; the driver gives them with
`bind_instance(clock, prefill_time_s)`. Until then it keeps FCFS.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdserve.types import Request

WINDOW = 3


@dataclass(frozen=True, slots=True)
class WindowTask:
    slack_s: float  # TTFT_SLO - (T_now - T_enq): completion time it can afford
    prefill_s: float  # t_pre
    capped: bool  # its postponement counter has reached the cap


def postponed(order: Sequence[int]) -> list[int]:
    """Tasks (original indices) that some task queued behind them overtakes in `order`."""
    result, highest = [], -1
    for task in order:
        if highest > task:
            result.append(task)
        highest = max(highest, task)
    return sorted(result)


def satisfied(tasks: Sequence[WindowTask], order: Sequence[int]) -> int:
    """S_pi of Eq. 4."""
    done, count = 0.0, 0
    for index in order:
        done += tasks[index].prefill_s
        count += done <= tasks[index].slack_s
    return count


def feasible(tasks: Sequence[WindowTask], order: Sequence[int]) -> bool:
    return not any(tasks[i].capped for i in postponed(order))


def best_order_brute_force(tasks: Sequence[WindowTask]) -> tuple[int, ...]:
    """Algorithm 2 lines 2-6 as written: every ordering, skip infeasible, keep the best."""
    best: tuple[int, ...] | None = None
    best_score = -1
    for order in itertools.permutations(range(len(tasks))):
        if not feasible(tasks, order):
            continue
        score = satisfied(tasks, order)
        if best is None or score > best_score:
            best, best_score = order, score
    assert best is not None  # the identity never postpones anything
    return best


def best_order(tasks: Sequence[WindowTask]) -> tuple[int, ...]:
    """An optimal feasible ordering by dynamic programming over subsets.

    A capped task t may not be overtaken: no task behind t is placed while t is still
    unplaced. best[mask] is the highest count for placing exactly `mask` first, ties
    broken towards the lexicographically smallest ordering."""
    n = len(tasks)
    total = [0.0] * (1 << n)
    for mask in range(1, 1 << n):
        low = (mask & -mask).bit_length() - 1
        total[mask] = total[mask & (mask - 1)] + tasks[low].prefill_s
    best: dict[int, tuple[int, tuple[int, ...]]] = {0: (0, ())}
    for mask in range(1 << n):
        if mask not in best:
            continue
        score, order = best[mask]
        for j in range(n):
            if mask >> j & 1:
                continue
            # j may go next unless a capped task before it is still waiting
            if any(tasks[t].capped and not mask >> t & 1 for t in range(j)):
                continue
            nxt = mask | 1 << j
            gained = score + (total[nxt] <= tasks[j].slack_s)
            candidate = (gained, order + (j,))
            current = best.get(nxt)
            if current is None or gained > current[0] or (
                    gained == current[0] and candidate[1] < current[1]):
                best[nxt] = candidate
    return best[(1 << n) - 1][1]


class TtftAwareOrder:
    """Algorithm 2. New tasks join at the back; the reordering happens at dequeue time."""

    def __init__(self, ttft_slo_s: float, window: int = WINDOW) -> None:
        if window < 1:
            raise ValueError(f"ampd reorder window must be at least 1, got {window}")
        self.ttft_slo_s = ttft_slo_s
        self.window = window
        self.postponements: dict[int, int] = {}  # request id -> times postponed
        self.reordered = 0  # dequeues whose ordering was not FCFS
        self.decisions: deque[str] = deque(maxlen=1000)  # each reordering and its reason
        self._reason = ""
        self._clock: Callable[[], float] | None = None
        self._prefill_time_s: Callable[[Request], float] | None = None

    def bind_instance(self, clock: Callable[[], float],
                      prefill_time_s: Callable[[Request], float]) -> None:
        self._clock, self._prefill_time_s = clock, prefill_time_s

    def insert(self, queue: list[Request], request: Request) -> None:
        queue.append(request)

    def window_tasks(self, queue: Sequence[Request], now_s: float) -> list[WindowTask]:
        assert self._prefill_time_s is not None
        return [WindowTask(self.ttft_slo_s - (now_s - r.arrival_s), self._prefill_time_s(r),
                           self.postponements.get(r.request_id, 0) >= self.window)
                for r in queue[:self.window]]

    def choose(self, queue: list[Request]) -> list[int] | None:
        """Alg. 2 lines 1-6: the best ordering of the window, or None to keep FCFS."""
        if len(queue) < 2 or self._clock is None:
            return None
        tasks = self.window_tasks(queue, self._clock())
        order = best_order(tasks)
        if list(order) == sorted(order):
            return None
        capped = [queue[i].request_id for i, t in enumerate(tasks) if t.capped]
        self._reason = (f"alg2: order {list(order)} of requests "
                        f"{[r.request_id for r in queue[:len(order)]]} meets the TTFT SLO "
                        f"for {satisfied(tasks, order)} of {len(order)} (FCFS: "
                        f"{satisfied(tasks, sorted(order))}); at the postponement cap: "
                        f"{capped or 'none'}")
        return list(order)

    def commit(self, queue: list[Request], order: list[int]) -> None:
        """Alg. 2 lines 7-8: count postponements, reorder the window (the caller dequeues
        its head)."""
        window = queue[:len(order)]
        for index in postponed(order):
            rid = window[index].request_id
            self.postponements[rid] = self.postponements.get(rid, 0) + 1
        queue[:len(order)] = [window[i] for i in order]
        self.postponements.pop(queue[0].request_id, None)  # dequeued next
        self.reordered += 1
        self.decisions.append(self._reason)
