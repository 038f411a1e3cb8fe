"""AMPD's prefill reordering (Alg. 2) in a live worker: the policy's queue order reaches the
worker's local scheduler with the worker's clock and performance model, and requests carry
the driver's arrival times, so the worker admits in the order the simulator would."""

from __future__ import annotations

import time
from functools import partial
from multiprocessing import Pipe

from pdserve.engine.sampling import SamplingParams
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs
from pdserve.policies.ampd.reordering import TtftAwareOrder
from pdserve.worker.messages import AddRequest, SetPerfModel
from pdserve.worker.worker import Worker

# 1 ms per prompt token: a 500-token prompt takes 0.5 s, a 200-token one 0.2 s
PERF = PerfModel("ms-per-token", PrefillCoeffs(0.0, 1e-3, 0.0),
                 DecodeCoeffs(0.01, 0.0, 0.0, 0.0), TransferCoeffs(1e-4, 1e10), 4096, 1 << 20)


def first_admitted(order_factory, perf, later_perf=None) -> tuple[int, Worker]:
    """`later_perf`: the model the driver sends after the worker started (`SetPerfModel`:
    the start-up profile, ready after the server started on its provisional model)."""
    _, connection = Pipe()
    worker = Worker(0, "tiny", 0, 128, 512, 16, connection, "decode-first", 0,
                    queue_order=order_factory, perf=perf)
    if later_perf is not None:
        worker.handle(SetPerfModel(later_perf))
    now = time.monotonic()
    params = SamplingParams(max_tokens=2, temperature=0.0)
    # request 0 has 1 s of slack and needs 0.5 s; request 1 arrived 0.5 s earlier and needs
    # 0.2 s: behind request 0 it misses its 1 s TTFT SLO, ahead of it both meet theirs
    worker.handle(AddRequest(0, tuple(range(5, 505)), params, arrival_s=now))
    worker.handle(AddRequest(1, tuple(range(5, 205)), params, arrival_s=now - 0.5))
    plan = worker.local.plan()
    assert plan is not None
    return plan.chunks[0][0].request_id, worker


def test_the_worker_reorders_with_the_policys_order():
    first, worker = first_admitted(partial(TtftAwareOrder, 1.0, 3), PERF)
    try:
        assert first == 1
        order = worker.local.prefills.order
        assert order.reordered == 1 and order.postponements == {0: 1}
        assert order.decisions[-1].startswith("alg2: order [1, 0]")
    finally:
        worker.engine.pool.close()
    fcfs_first, fcfs_worker = first_admitted(partial(TtftAwareOrder, 1.0, 3), None)
    fcfs_worker.engine.pool.close()  # no performance model: Alg. 2 cannot estimate, FCFS
    assert fcfs_first == 0


def test_a_model_sent_later_reaches_the_workers_queue_order():
    first, worker = first_admitted(partial(TtftAwareOrder, 1.0, 3), None, later_perf=PERF)
    worker.engine.pool.close()
    assert first == 1  # estimated with the model it was sent: reordered as above
