"""Schema fuzzing (schemathesis) against the live server's `/openapi.json`, loopback only.

Positive cases (bodies that fit the documented schemas) and negative ones (that do not)
for every operation, a bounded number of each: no answer is a 5xx, every negative case is
a 4xx, and at the end every worker is alive with its first PID and a normal request works.
The context is short (`max_model_len` 64) so a valid case that asks for many tokens still
ends quickly.
"""

from __future__ import annotations

import httpx
import pytest
from server_helpers import running_server

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.generation.modes import GenerationMode  # noqa: E402

EXAMPLES_PER_MODE = 60


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("fuzz"), {
            "cluster.instances": 2, "policy.name": "static-pd", "cluster.prefill": 1,
            "cluster.decode": 1, "server.max_model_len": 64
    }) as (base, driver):
        yield base, driver


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schema_fuzzing_finds_no_server_error(server, mode):
    base, driver = server
    pids = [driver.workers.pid(i) for i in range(2)]
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    seen: list[tuple[str, int]] = []

    @settings(max_examples=EXAMPLES_PER_MODE, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=schema.as_strategy(generation_mode=mode))
    def check(case) -> None:
        response = case.call(base_url=base, timeout=60)
        seen.append((f"{case.method} {case.path}", response.status_code))
        assert response.status_code < 500, (case.as_curl_command(), response.text[:300])
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
        if mode is GenerationMode.NEGATIVE and case.method == "POST":
            assert 400 <= response.status_code < 500, case.as_curl_command()

    check()
    assert len(seen) >= EXAMPLES_PER_MODE // 2
    assert {path for path, _ in seen} >= {"POST /v1/completions", "POST /v1/chat/completions"}
    if mode is GenerationMode.POSITIVE:  # some valid cases went all the way through
        assert any(path.startswith("POST") and status == 200 for path, status in seen)
    assert [driver.workers.pid(i) for i in range(2)] == pids
    assert driver.health()["status"] == "ok"
    after = httpx.post(f"{base}/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": "ok", "max_tokens": 2})
    assert after.status_code == 200
