"""The live driver's view between worker reports: a report taken before a dispatch reached
the worker must not erase that dispatch (else the router sends the next arrival behind a
prefill it cannot see: the live-only TTFT tail of docs/results/fidelity.md)."""

from __future__ import annotations

import threading
from dataclasses import replace

import httpx
from conftest import make_perf
from server_helpers import running_server, wait_until

from pdserve.engine.sampling import SamplingParams
from pdserve.engine.transfer import KVHandoff
from pdserve.instance.stats import InstanceStats
from pdserve.live.dispatch_ledger import DispatchLedger
from pdserve.policies.min_load import MinLoadPrefillRouter
from pdserve.types import attn_units
from pdserve.worker.messages import AddRequest, AdoptKV, Cancel

PARAMS = SamplingParams(max_tokens=4)


def add(request_id: int, tokens: int, resumed: int = 0) -> AddRequest:
    return AddRequest(request_id, tuple(range(tokens)), PARAMS, tuple(range(resumed)))


def adopt(request_id: int, tokens: int) -> AdoptKV:
    return AdoptKV(KVHandoff(request_id, tuple(range(tokens)), tokens - 1, tokens - 1, PARAMS,
                             (0,), None))


def idle(instance: int) -> InstanceStats:
    return InstanceStats.empty(instance, 100)


def test_a_report_taken_before_a_dispatch_arrived_keeps_it_in_the_view():
    ledger = DispatchLedger()
    ledger.reset(0, idle(0))
    assert ledger.sent(0, add(1, 500, resumed=12))
    assert not ledger.sent(0, Cancel(7))  # carries no load, is not numbered
    stale = ledger.reported(0, idle(0), received=0)  # the step that ended before it arrived
    assert (stale.prefill_queue_len, stale.prefill_queue_tokens) == (1, 512)
    assert stale.prefill_queue_attn_units == attn_units(512, 0)
    # the worker's next report counts the prefill itself: nothing is added twice
    running = replace(idle(0), prefill_queue_len=1, prefill_queue_tokens=400,
                      prefill_queue_attn_units=attn_units(400, 112), prefill_running_len=1)
    assert ledger.reported(0, running, received=1) == running
    assert ledger.in_flight(0) == 0


def test_decodes_in_flight_count_and_a_count_acknowledges_every_earlier_dispatch():
    ledger = DispatchLedger()
    ledger.reset(1, idle(1))
    ledger.sent(1, adopt(1, 40))
    ledger.sent(1, add(2, 10))
    ledger.sent(1, adopt(3, 60))
    view = ledger.view(1)
    assert (view.decode_queue_len, view.decode_queue_tokens) == (2, 100)
    assert (view.prefill_queue_len, view.prefill_queue_tokens) == (1, 10)
    view = ledger.reported(1, idle(1), received=2)  # the first two reached the worker
    assert (view.decode_queue_len, view.decode_queue_tokens, view.prefill_queue_len) == (1, 60, 0)


def test_a_worker_that_restarts_starts_a_new_count():
    ledger = DispatchLedger()
    ledger.reset(0, idle(0))
    ledger.sent(0, add(1, 100))
    ledger.sent(0, add(2, 100))
    assert ledger.reset(0, idle(0)) == idle(0)  # it died: what was in flight is gone
    ledger.sent(0, add(3, 50))  # number 1 of the new worker
    assert ledger.reported(0, idle(0), received=1) == idle(0)


def test_the_router_sees_a_prefill_still_in_the_pipe():
    """Two workers equally loaded; request 1 went to worker 0, whose report then arrived
    from before it got there. Request 2 must go to worker 1, not behind request 1."""
    ledger = DispatchLedger()
    busy = replace(idle(0), running_decodes=3, running_tokens=300, used_blocks=21)
    for i in (0, 1):
        ledger.reset(i, busy)
    ledger.sent(0, add(1, 512))
    view = [ledger.reported(0, busy, received=0), ledger.view(1)]

    class Board:
        prefill_candidates = (0, 1)

    class View:
        instances = view

    router = MinLoadPrefillRouter(make_perf().prefill)
    assert router.route(None, View(), Board()) == 1  # type: ignore[arg-type]


def stream(base: str, prompt: str, max_tokens: int) -> None:
    with httpx.stream("POST", f"{base}/v1/completions", timeout=120, json={
            "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}) as response:
        for _ in response.iter_lines():
            pass


def test_live_arrivals_during_a_prefill_go_to_the_other_worker(tmp_path):
    """Both workers decode; A's prefill starts on one of them, so its step report from
    before A arrived is in the pipe ahead of A's; B, sent while A prefills, must be routed
    to the other worker."""
    long_prompt = "the quick brown fox jumps over the lazy dog " * 50
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "colocated",
                                   "instance.chunk_size_tokens": 512}) as (base, driver):
        # Long enough that the first is still decoding when the second starts on a fast box
        # (400 tokens took 0.6 s here, and a fixed 0.3 s gap between them once lost the race).
        clients = [threading.Thread(target=stream, args=(base, "Hello", 1500))
                   for _ in range(2)]
        clients[0].start()
        assert wait_until(lambda: sum(s.running_decodes for s in driver.view.instances) == 1,
                          60, poll_s=0.002)
        clients[1].start()
        assert wait_until(lambda: all(s.running_decodes == 1 for s in driver.view.instances),
                          60)
        background = set(driver.live)
        first = threading.Thread(target=stream, args=(base, long_prompt, 40))
        first.start()

        def executing_a() -> bool:
            return any(rid not in background for batch in driver._executing.values()
                       for rid in batch)

        assert wait_until(executing_a, 60, poll_s=0.002)
        (rid_a,) = set(driver.live) - background
        second = threading.Thread(target=stream, args=(base, long_prompt, 40))
        second.start()
        assert wait_until(lambda: len(driver.live) == 4, 60, poll_s=0.002)
        (rid_b,) = set(driver.live) - background - {rid_a}
        instance_a = driver.live[rid_a].request.prefill_instance
        assert driver.live[rid_b].request.prefill_instance == 1 - instance_a
        for thread in (*clients, first, second):
            thread.join(120)
        assert wait_until(lambda: all(driver.ledger.in_flight(i) == 0 for i in (0, 1)), 10)
