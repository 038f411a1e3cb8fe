"""Worker failures on a live server: every affected request ends within a bounded time,
re-run elsewhere from its prompt when an instance is left, failed with a clear error when
none is."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import httpx
from server_helpers import running_server
from test_server import PROMPT, local_greedy


def stream_text(base: str, max_tokens: int, started: threading.Event, out: dict) -> None:
    text, error = [], None
    with httpx.stream("POST", f"{base}/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                error = chunk["error"]["message"]
                continue
            text.append(chunk["choices"][0]["text"])
            started.set()
    out.update(text="".join(text), error=error)


def kill_worker(driver, instance: int) -> None:
    os.kill(driver.workers.pid(instance), signal.SIGKILL)


def test_killed_worker_mid_stream_is_rerun_without_loss_or_duplication(tmp_path):
    with running_server(tmp_path, instances=2, policy="colocated") as (base, driver):
        started, out = threading.Event(), {}
        client = threading.Thread(target=stream_text, args=(base, 300, started, out))
        client.start()
        assert started.wait(60)
        [live] = driver.live.values()
        kill_worker(driver, live.request.prefill_instance)
        client.join(60)
        assert not client.is_alive()  # ended within the bound
        assert out["error"] is None
        assert out["text"] == local_greedy(PROMPT, 300)  # nothing lost, nothing repeated
        health = httpx.get(f"{base}/health").json()
        assert len(health["failed"]) == 1 and len(health["alive"]) == 1
        assert "pdserve_worker_failures_total 1" in httpx.get(f"{base}/metrics").text
        after = httpx.post(f"{base}/v1/completions", timeout=60, json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 5})
        assert after.status_code == 200  # the survivor keeps serving


def test_requests_fail_cleanly_when_no_decode_instance_is_left(tmp_path):
    with running_server(tmp_path, instances=2, policy="static-pd", prefill=1,
                        decode=1) as (base, driver):
        started, out = threading.Event(), {}
        client = threading.Thread(target=stream_text, args=(base, 300, started, out))
        client.start()
        assert started.wait(60)
        kill_worker(driver, 1)
        client.join(60)
        assert not client.is_alive()
        assert "no instance is available" in out["error"]
        assert httpx.get(f"{base}/health").json()["failed"] == [1]
        refused = httpx.post(f"{base}/v1/completions", timeout=30, json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 5})
        assert refused.status_code == 503
        assert "no instance is available" in refused.json()["error"]["message"]
        deadline = time.monotonic() + 10
        while driver.live and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not driver.live
