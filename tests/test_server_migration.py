"""A running decode migrated between live workers mid-stream: the client's text continues
with nothing lost and nothing repeated."""

from __future__ import annotations

import threading
import time

import httpx
from server_helpers import metric, running_server
from test_server import PROMPT, local_greedy
from test_server_faults import stream_text


def test_migration_mid_stream_loses_and_duplicates_nothing(tmp_path):
    with running_server(tmp_path, {"cluster.instances": 3, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 2}) as (base, driver):
        started, out = threading.Event(), {}
        client = threading.Thread(target=stream_text, args=(base, 200, started, out))
        client.start()
        assert started.wait(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # wait for the decode to settle on a worker
            lives = list(driver.live.values())
            if lives and lives[0].request.decode_instance in (1, 2) and \
                    lives[0].tokens_sent > 5:
                break
            time.sleep(0.05)
        live = lives[0]
        source = live.request.decode_instance
        target = 3 - source
        driver._loop.call_soon_threadsafe(driver.move_decode, live.request.request_id, target)
        client.join(60)
        assert not client.is_alive()
        assert out["error"] is None
        assert out["text"] == local_greedy(PROMPT, 200)
        assert live.request.decode_instance == target
        # the driver timed the decode instances' tokens (TaiChi TTFT, AMPD ITL)
        request = live.request
        assert request.first_token_s < request.decode_first_token_s < request.finish_s
        assert request.last_token_s == request.finish_s and request.max_itl_s > 0
        metrics = httpx.get(f"{base}/metrics").text
        assert metric(metrics, "pdserve:migrations_total") == 1
        assert metric(metrics, "pdserve:kv_transfer_bytes_total", kind="migration") > 0
        assert not driver._transfer_sources  # the source was told to free the KV
