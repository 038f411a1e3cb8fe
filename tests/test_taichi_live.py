"""`taichi` served live: two chunk sizes, flowing decode migrating a stream back and forth
mid-decode (text identical to one instance), and Alg. 2's early rejection as HTTP 429."""

from __future__ import annotations

import threading

import httpx
from server_helpers import metric, running_server
from test_server import local_greedy
from test_server_faults import stream_text

from pdserve.policies.taichi.settings import TaiChiSettings

PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


def test_taichi_serves_with_flowing_decode_and_early_rejection(tmp_path):
    # watermark 0: every decode on the D-heavy instance is degraded to the P-heavy one; a
    # TPOT SLO no step can meet: every degraded decode flows back. The stream ping-pongs.
    settings = TaiChiSettings(chunk_p_tokens=64, chunk_d_tokens=16, watermark=0.0,
                              no_feasible="reject")
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "taichi",
                                   "cluster.prefill": 1, "cluster.decode": 1,
                                   "policy.taichi": settings, "slo.ttft_s": 0.1, "slo.tpot_s": 1e-4,
                                   "monitor.interval_s": 0.05}) as (base, driver):
        started, out = threading.Event(), {}
        client = threading.Thread(target=stream_text, args=(base, 300, started, out, PROMPT))
        client.start()
        client.join(120)
        assert not client.is_alive()
        assert out["error"] is None
        assert out["text"] == local_greedy(PROMPT, 300)
        metrics = httpx.get(f"{base}/metrics").text
        migrations = metric(metrics, "pdserve:migrations_total")
        assert migrations >= 2  # degraded to P-heavy and flowed back at least once
        rebalancer = driver.scheduler.policy.rebalancer
        assert rebalancer.degradations >= 1 and rebalancer.backflows >= 1
        # the workers run the policy's chunk sizes
        assert driver.scheduler.initial_actions()[0].chunk_size_tokens == 64
        # a prompt no instance can prefill within the TTFT SLO is refused early
        response = httpx.post(f"{base}/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": "word " * 700, "max_tokens": 4})
        assert response.status_code == 429
        error = response.json()["error"]
        assert error["type"] == "rate_limit_error" and "TTFT SLO" in error["message"]
