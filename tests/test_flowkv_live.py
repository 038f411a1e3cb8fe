"""`pdserve serve --policy flowkv`: 1P1D workers, prefill-first local schedulers, the same
greedy text as a local engine, twice for a repeated prompt (its prefix cached)."""

from __future__ import annotations

import httpx
from server_helpers import running_server
from test_server import PROMPT, local_greedy

from pdserve.types import Role


def test_flowkv_serves_live_with_the_same_greedy_text(tmp_path):
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "flowkv",
                                   "cluster.prefill": 1, "cluster.decode": 1}) as (base, driver):
        assert driver.scheduler.roles == [Role.PREFILL, Role.DECODE]
        assert driver.workers.settings.phase_priority == "prefill-first"
        assert driver.workers.settings.prefix_block_tokens == 16
        for _ in range(2):
            response = httpx.post(f"{base}/v1/completions", timeout=60, json={
                "model": "tiny", "prompt": PROMPT * 3, "max_tokens": 8, "temperature": 0})
            assert response.status_code == 200
            assert response.json()["choices"][0]["text"] == local_greedy(PROMPT * 3, 8)
