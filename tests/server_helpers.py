"""Start a real pdserve server (worker processes + uvicorn on 127.0.0.1) inside a test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from conftest import make_perf

from pdserve.config import serve_defaults
from pdserve.live.replay_client import free_port, wait_until_healthy
from pdserve.server.connections import HeaderDeadlineProtocol
from pdserve.server.launch import build_app


@contextmanager
def running_server(tmp_dir: Path, values: dict[str, object] | None = None
                   ) -> Iterator[tuple[str, object]]:
    """Yields (base URL, driver) of a server on `serve_defaults()` with `values` set (by
    dotted config path; the `tiny` model and 512 KV blocks unless they say otherwise);
    stops the server and its workers on exit."""
    values = {"engine.weights": "tiny", "engine.kv_blocks": 512, **(values or {})}
    perf_file = tmp_dir / "perf.json"
    kv_blocks = values["engine.kv_blocks"]
    assert isinstance(kv_blocks, int)
    make_perf(kv_capacity_tokens=kv_blocks * 16).save(perf_file)
    config = serve_defaults().with_values({"server.port": free_port(), **values,
                                           "perf.profile": str(perf_file)})
    app = build_app(config)
    port = config.server.port
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning", http=HeaderDeadlineProtocol))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(base, 120, thread.is_alive)
        yield base, app.state.driver
    finally:
        server.should_exit = True
        thread.join(60)


def wait_until(condition, timeout_s: float, poll_s: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    """Poll `condition` until it holds (True) or `timeout_s` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return False


def metric(text: str, name: str, **labels: str) -> float:
    """Sample `name` of the Prometheus text `text` (as `/metrics` serves it), summed over
    the samples whose labels include `labels`; AssertionError when there is none."""
    from prometheus_client.parser import text_string_to_metric_families

    found = [sample.value for family in text_string_to_metric_families(text)
             for sample in family.samples if sample.name == name
             and all(sample.labels.get(k) == v for k, v in labels.items())]
    assert found, f"no sample {name} {labels} in /metrics"
    return sum(found)
