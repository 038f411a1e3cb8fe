"""FlowKV's elastic scaling on real worker processes: a reserve instance's worker is not
started until the policy scales up, then serves, and is stopped again once drained."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
from server_helpers import running_server, wait_until
from test_server import PROMPT, local_greedy

from pdserve.live.processes import WorkerState
from pdserve.policies.flowkv.settings import FlowKVSettings
from pdserve.types import Role

# thresholds low enough that a burst of prompts is "extreme" prefill load on the tiny model
EAGER = FlowKVSettings(low_prefill=0.02, low_decode=0.02, high_prefill=0.05,
                       high_decode=0.05, hysteresis=0.005, confirm_ticks=1, window_s=0.5,
                       scale_up_after_s=0.0, scale_cooldown_s=1.0, scale_down_below=0.01,
                       scale_down_after_s=1.0)


def test_reserve_worker_starts_on_scale_up_serves_and_stops_when_drained(tmp_path):
    with running_server(tmp_path, {
            "policy.name": "flowkv", "cluster.prefill": 1, "cluster.decode": 1,
            "cluster.reserve": 1, "policy.flowkv": EAGER, "monitor.interval_s": 0.1
    }) as (base, driver):
        workers = driver.workers
        assert driver.scheduler.roles == [Role.PREFILL, Role.DECODE, Role.RESERVE]
        assert workers.states[2] is WorkerState.STOPPED  # never started
        health = httpx.get(f"{base}/health", timeout=10).json()
        assert health["stopped"] == [2] and health["status"] == "ok"

        def complete(_: int) -> str:
            response = httpx.post(f"{base}/v1/completions", timeout=120, json={
                "model": "tiny", "prompt": PROMPT * 4, "max_tokens": 24, "temperature": 0})
            assert response.status_code == 200, response.text
            return response.json()["choices"][0]["text"]

        with ThreadPoolExecutor(8) as pool:  # keep load up until the reserve serves
            texts: list[str] = []
            for _ in range(6):
                texts += list(pool.map(complete, range(16)))
                if driver.scheduler.roles[2] is not Role.RESERVE:
                    break
        assert driver.scheduler.roles[2] is not Role.RESERVE  # its side (or lent: mixed)
        assert workers.states[2] is WorkerState.LIVE
        reasons = [r for _, i, _, r in driver.role_changes if i == 2]
        assert any("scale up" in r for r in reasons), reasons
        assert set(texts) == {local_greedy(PROMPT * 4, 24)}  # same text on every instance
        assert driver.metrics.total("pdserve:instance_starts") == 1
        # idle: scaled down after scale_down_after_s, drained, its worker stopped
        assert wait_until(lambda: workers.states[2] is WorkerState.STOPPED, 30)
        assert driver.scheduler.roles[2] is Role.RESERVE
        assert complete(0) == local_greedy(PROMPT * 4, 24)  # the others still serve
        assert driver.metrics.total("pdserve:worker_failures") == 0
