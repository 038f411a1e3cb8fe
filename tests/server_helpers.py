"""Start a real pdserve server (worker processes + uvicorn on 127.0.0.1) inside a test."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from conftest import make_perf

from pdserve.live.replay_client import free_port, wait_until_healthy
from pdserve.server.launch import ServeConfig, build_app


@contextmanager
def running_server(tmp_dir: Path, **options) -> Iterator[tuple[str, object]]:
    """Yields (base URL, driver); stops the server and its workers on exit."""
    options.setdefault("model", "tiny")
    perf_file = tmp_dir / "perf.json"
    make_perf(kv_capacity_tokens=options.get("kv_blocks", 512) * 16).save(perf_file)
    config = ServeConfig(port=options.pop("port", 0) or free_port(), perf_model=str(perf_file),
                         kv_blocks=options.pop("kv_blocks", 512), **options)
    app = build_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{config.port}"
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
