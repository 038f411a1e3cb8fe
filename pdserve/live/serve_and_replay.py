"""Start `pdserve serve` as a subprocess, replay a workload against it over HTTP, stop it.

The benchmarks that compare the live cluster with the simulator (`bench/live_policies.py`,
`bench/live_fidelity.py`) share this, so both start servers and replay the same way.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pdserve.live.replay_client import (
    ClientTimeline,
    RequestBody,
    free_port,
    replay,
    trace_body,
    wait_until_healthy,
)
from pdserve.types import SLO, Request
from pdserve.workload.workload import Workload


def serve_and_replay(model: str, instances: int, policy_args: Sequence[str], perf_file: Path,
                     slo: SLO, workload: Workload, timeout_s: float, kv_blocks: int,
                     chunk_size_tokens: int, max_batch_size: int,
                     env: dict[str, str] | None = None,
                     timeline: ClientTimeline | None = None,
                     server_log: Path | None = None, body_of: RequestBody = trace_body,
                     before_stop: Callable[[str], None] | None = None) -> list[Request]:
    """One live run: a fresh server with `instances` workers and the given policy flags
    (e.g. `["--policy", "static-pd", "--prefill", "1", "--decode", "1"]`); `env` adds
    environment variables for the server and its workers; `timeline` collects each
    request's response id, send and first-text times (`bench.client.replay`); the server's
    output goes to `server_log` when given (else nowhere); `body_of` builds each request's
    body (`replay`: a trace's token ids by default); `before_stop(base_url)` runs after the
    replay, while the server still answers (e.g. to read its /metrics)."""
    port = free_port()
    command = [sys.executable, "-m", "pdserve.cli", "serve", "--model", model,
               "--instances", str(instances), *policy_args, "--port", str(port),
               "--perf-model", str(perf_file), "--kv-blocks", str(kv_blocks),
               "--chunk-size", str(chunk_size_tokens), "--max-batch-size", str(max_batch_size),
               "--ttft-slo", str(slo.ttft_s), "--tpot-slo", str(slo.tpot_s)]
    log = server_log.open("w") if server_log is not None else None
    output = log if log is not None else subprocess.DEVNULL
    server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                              env={**os.environ, **(env or {})})
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base, 180, lambda: server.poll() is None)
        requests = asyncio.run(replay(base, workload, model, timeout_s, timeline=timeline,
                                      body_of=body_of))
        if before_stop is not None:
            before_stop(base)
        return requests
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
        if log is not None:
            log.close()
