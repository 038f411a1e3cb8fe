"""A scaled-up worker that never comes up is reported dead, so the driver fails it and the
scheduler stops waiting for it (the scaler's side: tests/test_flowkv_policy.py)."""

from __future__ import annotations

import asyncio

from conftest import worker_settings

from pdserve.live.processes import WorkerProcesses, WorkerState
from pdserve.worker.faults import START_EXIT_ENV


def test_a_scaled_up_worker_that_cannot_start_is_reported_dead(monkeypatch):
    monkeypatch.setenv(START_EXIT_ENV, "1")  # instance 1's worker exits before it is ready
    exits: list[int] = []

    async def scenario() -> None:
        workers = WorkerProcesses(worker_settings(kv_blocks=64, max_restarts=0), 2)
        await workers.start(lambda message: None, lambda i, code: exits.append(i),
                            lambda i, stats, pool: None, stopped={1})
        try:
            assert workers.states == [WorkerState.LIVE, WorkerState.STOPPED]
            workers.start_worker(1)
            for _ in range(600):  # bounded: 60 s
                if exits:
                    break
                await asyncio.sleep(0.1)
        finally:
            await workers.stop()
        assert workers.states[1] is WorkerState.DEAD and workers.states[0] is WorkerState.LIVE

    asyncio.run(scenario())
    assert exits == [1]
