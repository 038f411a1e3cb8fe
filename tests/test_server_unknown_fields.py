"""Unknown request-body fields cannot grow server state or the log without bound, and cannot
forge a log line (issue 27, part 1). The app runs in-process (no workers, no network): the
fields are counted when the body is parsed, before anything reaches a worker."""

from __future__ import annotations

import io
import json
import logging

import pytest
from conftest import make_perf
from fastapi.testclient import TestClient
from server_helpers import metric

from pdserve.config import serve_defaults
from pdserve.server.launch import build_app
from pdserve.server.unknown_fields import (
    DEFAULT_LINES_PER_WINDOW,
    DEFAULT_MAX_TRACKED,
    MAX_NAME_CHARS,
    UnknownFields,
)

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # serve_cli's


@pytest.fixture
def client(tmp_path):
    perf = tmp_path / "perf.json"
    make_perf().save(perf)
    app = build_app(serve_defaults().with_values({
        "engine.weights": "tiny", "perf.profile": str(perf), "cluster.instances": 1}))
    return TestClient(app)  # no lifespan: no workers


@pytest.fixture
def server_log():
    """Everything the `pdserve` loggers write, formatted as `pdserve serve` formats it."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter(FORMAT))
    logger = logging.getLogger("pdserve")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(level)


def refused_body(fields: dict[str, int]) -> bytes:
    """A body refused after parsing (max_tokens past the context): no worker needed."""
    return json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 9000, **fields}).encode()


def test_many_unique_keys_keep_the_tracking_and_the_log_bounded(client, server_log):
    requests, keys = 20, 5000  # 100k distinct names, ~110 kB a body
    for r in range(requests):
        body = refused_body({f"k{r}_{i}": 1 for i in range(keys)})
        response = client.post("/v1/completions", content=body,
                               headers={"content-type": "application/json"})
        assert response.status_code == 400
        assert "max_tokens" in response.json()["error"]["message"]
    counts = client.app.state.unknown_fields.counts()
    assert counts.total == requests * keys
    assert counts.tracked == DEFAULT_MAX_TRACKED  # full, and no further
    assert counts.untracked == requests * keys - DEFAULT_MAX_TRACKED
    written = server_log.getvalue()
    lines = written.splitlines()
    assert 1 <= len(lines) <= DEFAULT_LINES_PER_WINDOW
    assert len(written.encode()) < 16_000, len(written.encode())
    assert all("(+" in line and "more)" in line for line in lines)  # 8 names, then a count
    metrics = client.get("/metrics").text
    assert metric(metrics, "pdserve:ignored_request_fields_total") == requests * keys


def test_a_key_with_a_newline_is_one_escaped_log_line(client, server_log):
    forged = "\n2026-01-01 00:00:00,000 CRITICAL pdserve.server: FORGED LINE\r\x1b[2J"
    response = client.post("/v1/completions", content=refused_body({forged: 1}),
                           headers={"content-type": "application/json"})
    assert response.status_code == 400
    lines = server_log.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert " WARNING pdserve.server: ignoring unknown CompletionRequest field(s): " in lines[0]
    assert "'\\n2026-01-01" in lines[0] and "LINE\\r\\x1b[" in lines[0]  # cut at 64
    assert "\x1b" not in lines[0] and "\r" not in lines[0]
    again = client.post("/v1/completions", content=refused_body({forged: 1}),
                        headers={"content-type": "application/json"})
    assert again.status_code == 400
    assert len(server_log.getvalue().splitlines()) == 1  # a known name is logged once


def test_a_long_key_is_cut_in_the_log(client, server_log):
    client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 9000,
        "k" * 100_000: 1})
    [line] = server_log.getvalue().splitlines()
    assert f"'{'k' * MAX_NAME_CHARS}'..." in line and len(line) < 300


def test_warning_lines_are_rate_limited_and_say_what_was_suppressed(caplog):
    now = [0.0]
    fields = UnknownFields(max_tracked=4, lines_per_window=2, window_s=60.0,
                           clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="pdserve.server"):
        for i in range(5):
            fields.note("CompletionRequest", [f"a{i}"])
        assert len(caplog.records) == 2
        now[0] = 61.0
        fields.note("CompletionRequest", ["b"])
    assert len(caplog.records) == 3
    assert "3 similar warnings suppressed" in caplog.records[-1].getMessage()
    counts = fields.counts()
    assert (counts.total, counts.tracked, counts.untracked, counts.suppressed_lines) == (
        6, 4, 2, 3)
