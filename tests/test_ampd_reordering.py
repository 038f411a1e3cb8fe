"""AMPD's Algorithm 2: prefill reordering inside a lookahead window."""

from __future__ import annotations

import itertools
import random

import pytest

from pdserve.instance.prefill_queue import PrefillQueue
from pdserve.policies.ampd.reordering import (
    TtftAwareOrder,
    WindowTask,
    best_order,
    best_order_brute_force,
    feasible,
    postponed,
    satisfied,
)
from pdserve.types import Request


def test_postponed_means_overtaken_by_a_later_task() -> None:
    assert postponed((0, 1, 2)) == []
    assert postponed((1, 0, 2)) == [0]
    assert postponed((2, 0, 1)) == [0, 1]
    assert postponed((0, 2, 1)) == [1]
    assert postponed((2, 1, 0)) == [0, 1]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
def test_dynamic_programme_equals_brute_force(size: int) -> None:
    rng = random.Random(size)
    for _ in range(300):
        tasks = [WindowTask(rng.uniform(-0.2, 1.5), rng.uniform(0.05, 0.6),
                            rng.random() < 0.3) for _ in range(size)]
        fast, slow = best_order(tasks), best_order_brute_force(tasks)
        assert fast == slow
        assert feasible(tasks, fast)
        best_possible = max(satisfied(tasks, order)
                            for order in itertools.permutations(range(size))
                            if feasible(tasks, order))
        assert satisfied(tasks, fast) == best_possible


def test_reordering_saves_a_task_fcfs_would_miss() -> None:
    # a long task first makes the two short, nearly late ones miss; moving it back saves both
    tasks = [WindowTask(2.0, 1.0, False), WindowTask(0.3, 0.1, False),
             WindowTask(0.4, 0.1, False)]
    assert satisfied(tasks, (0, 1, 2)) == 1
    assert best_order(tasks) == (1, 2, 0)
    assert satisfied(tasks, (1, 2, 0)) == 3
    capped = [replace_capped(t, i == 0) for i, t in enumerate(tasks)]
    assert best_order(capped) == (0, 1, 2)  # the long one may not be postponed again


def replace_capped(task: WindowTask, capped: bool) -> WindowTask:
    return WindowTask(task.slack_s, task.prefill_s, capped)


def make_queue(window: int, now: list[float]) -> tuple[PrefillQueue, TtftAwareOrder]:
    order = TtftAwareOrder(ttft_slo_s=1.0, window=window)
    order.bind_instance(lambda: now[0],
                        lambda r: (r.prefill_target_tokens - r.prefilled_tokens) * 1e-3)
    return PrefillQueue(order), order


def test_queue_reorders_at_dequeue_and_keeps_fcfs_without_gain() -> None:
    now = [0.0]
    queue, order = make_queue(3, now)
    queue.push(Request(0, 0.0, 500, 5))  # 0.5 s, 1 s of slack
    queue.push(Request(1, -0.5, 200, 5))  # 0.2 s, 0.5 s of slack: misses behind the first
    assert queue.peek().request_id == 1
    assert queue.admit_head().request_id == 1
    assert order.postponements == {0: 1}
    assert order.decisions[-1].startswith("alg2: order [1, 0] of requests [0, 1] meets the TTFT "
                                          "SLO for 2 of 2 (FCFS: 1)")
    assert [r.request_id for r in queue.waiting] == [0]
    fresh, _ = make_queue(3, now)
    for rid in range(3):
        fresh.push(Request(rid, 0.0, 100, 5))  # all fit in FCFS order: nothing moves
    assert [fresh.admit_head().request_id for _ in range(3)] == [0, 1, 2]


@pytest.mark.parametrize("window", [2, 3, 4])
def test_postponement_cap_holds(window: int) -> None:
    """A long, already late task at the head keeps being overtaken by short urgent ones;
    it is postponed exactly `window` times and then runs."""
    now = [0.0]
    queue, order = make_queue(window, now)
    queue.push(Request(0, -5.0, 900, 5))
    overtaken = {0: 0}
    next_id = 1
    for _ in range(window + 1):
        queue.push(Request(next_id, now[0], 200, 5))
        overtaken[next_id] = 0
        next_id += 1
        waiting_before = [r.request_id for r in queue.waiting]
        admitted = queue.admit_head() if queue.peek() else None
        assert admitted is not None
        for rid in waiting_before[:waiting_before.index(admitted.request_id)]:
            overtaken[rid] += 1
        assert all(count <= window for count in overtaken.values())
        assert all(count <= window for count in order.postponements.values())
        queue.active.clear()
        now[0] += 0.2
    assert overtaken[0] == window
    assert 0 not in [r.request_id for r in queue.waiting]  # the cap let it run
