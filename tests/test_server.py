"""The OpenAI-compatible server on real worker processes, through the official client."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import openai
import pytest
from engine_helpers import tiny_greedy_engine
from server_helpers import metric, running_server

from pdserve.engine.tokenizer import TextTokenizer

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """1 prefill + 1 decode worker: every multi-token request crosses a KV hand-off."""
    with running_server(tmp_path_factory.mktemp("server"), {"cluster.instances": 2,
                                                            "policy.name": "static-pd",
                                                            "cluster.prefill": 1,
                                                            "cluster.decode": 1}) as (base, driver):
        yield base, driver


def local_greedy(prompt: str, tokens: int) -> str:
    """The same request on one in-process engine, no hand-off."""
    engine, _ = tiny_greedy_engine(prompt, tokens)
    return engine.text_of(0)


def test_completion_through_a_p_to_d_hand_off_equals_single_instance_output(server):
    base, driver = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    result = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                       temperature=0)
    assert result.choices[0].text == local_greedy(PROMPT, 24)
    assert result.choices[0].finish_reason in ("length", "stop")
    assert result.usage.prompt_tokens == len(TextTokenizer.shipped().encode(PROMPT))
    assert 1 <= result.usage.completion_tokens <= 24
    assert driver.metrics.total("pdserve:kv_handoffs") >= 1


def test_streaming_chat_equals_non_streaming(server):
    base, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    messages = [{"role": "user", "content": "Write a haiku about queues."}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=20, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_async_client_concurrent_load_completes_every_request(server):
    base, driver = server

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", timeout=60)
        calls = [client.completions.create(model="tiny", prompt=f"{PROMPT} {i}", max_tokens=8,
                                           temperature=0.7, seed=i) for i in range(16)]
        results = await asyncio.wait_for(asyncio.gather(*calls), timeout=120)
        await client.close()
        return [r.choices[0].finish_reason for r in results]

    reasons = asyncio.run(run())
    assert len(reasons) == 16 and all(r in ("length", "stop") for r in reasons)
    assert driver.health()["failed"] == []
    assert not driver.live  # nothing left behind


def test_seeded_sampling_is_reproducible(server):
    base, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    texts = {client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12,
                                       temperature=1.0, seed=5).choices[0].text
             for _ in range(3)}
    assert len(texts) == 1


@pytest.mark.parametrize(("body", "status", "needle"), [
    ("{not json", 400, "not valid JSON"),
    (json.dumps({"model": "tiny", "prompt": "x", "max_tokens": "many"}), 400, "max_tokens"),
    (json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 0}), 400,
     "max_tokens: Input should be greater than or equal to 1"),
    (json.dumps({"model": "gpt-9", "prompt": "x"}), 404, "does not exist"),
    (json.dumps({"model": "tiny", "prompt": "x", "n": 17}), 400, "n: "),
    (json.dumps({"model": "tiny", "prompt": [5] * 9000}), 400, "exceeds the context"),
    (json.dumps({"model": "tiny", "prompt": ""}), 400, "empty"),
])
def test_bad_input_gets_an_openai_style_error(server, body, status, needle):
    base, _ = server
    response = httpx.post(f"{base}/v1/completions", content=body,
                          headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"] and error["type"]


def test_overload_answers_429_with_retry_after(server):
    base, driver = server
    limit, driver.max_outstanding = driver.max_outstanding, 0
    try:
        response = httpx.post(f"{base}/v1/completions", json={"model": "tiny", "prompt": "x"},
                              timeout=30)
    finally:
        driver.max_outstanding = limit
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_disconnecting_client_cancels_its_request(server):
    base, driver = server
    before = driver.metrics.total("pdserve:cancellations")
    with httpx.stream("POST", f"{base}/v1/completions", timeout=30, json={
            "model": "tiny", "prompt": PROMPT, "max_tokens": 2000, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                break  # one token received: hang up
    for _ in range(100):  # bounded: 10 s
        if driver.metrics.total("pdserve:cancellations") > before and not driver.live:
            break
        time.sleep(0.1)
    assert driver.metrics.total("pdserve:cancellations") > before
    assert not driver.live


def test_models_health_and_metrics(server):
    base, _ = server
    assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == "tiny"
    health = httpx.get(f"{base}/health").json()
    assert health["status"] == "ok" and health["alive"] == [0, 1]
    assert health["roles"] == ["prefill", "decode"]
    metrics = httpx.get(f"{base}/metrics").text
    for name in ("vllm:time_to_first_token_seconds_bucket",
                 "vllm:request_time_per_output_token_seconds_count",
                 "vllm:inter_token_latency_seconds_count", "vllm:e2e_request_latency_seconds_sum",
                 "pdserve:kv_handoffs_total", "pdserve:prefill_queue_len"):
        metric(metrics, name)
    assert metric(metrics, "pdserve:pool_size", role="prefill") == 1


GRAFANA = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "pdserve.json"


def test_metrics_parse_match_the_library_and_cover_the_grafana_dashboard(server):
    from prometheus_client.parser import text_string_to_metric_families

    base, driver = server
    assert httpx.post(f"{base}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": PROMPT, "max_tokens": 6}).status_code == 200
    answer = httpx.get(f"{base}/metrics")
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    parsed = {family.name: family for family in text_string_to_metric_families(answer.text)}
    # HELP and TYPE are the library's own for every family the server registers
    library = {family.name: family for family in driver.metrics.registry.collect()}
    assert parsed.keys() == library.keys()
    for name, family in library.items():
        assert (parsed[name].documentation, parsed[name].type) == (family.documentation,
                                                                  family.type), name
    samples = {sample.name for family in parsed.values() for sample in family.samples}
    assert all(name.startswith(("vllm:", "pdserve:")) for name in samples)
    # every name a Grafana panel queries is served (per-instance ones too: both are live)
    queried = set(re.findall(r"(?:vllm|pdserve):[A-Za-z0-9_:]+", GRAFANA.read_text()))
    assert len(queried) >= 20
    assert queried <= samples, queried - samples
    assert metric(answer.text, "vllm:num_requests_running", engine="1") >= 0
    assert metric(answer.text, "pdserve:instance_role", engine="0", role="prefill") == 1


def test_the_dashboard_page_and_its_state_show_the_cluster(server):
    base, _ = server
    assert httpx.post(f"{base}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": PROMPT, "max_tokens": 6}).status_code == 200
    time.sleep(1.2)  # a monitor tick samples the instances (0.5 s)
    page = httpx.get(f"{base}/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="dashboard/plotly.min.js">' in page.text
    assert '"state_url":"dashboard/state"' in page.text
    for script in ("plotly.min.js", "page.js"):
        answer = httpx.get(f"{base}/dashboard/{script}")
        assert answer.status_code == 200 and "javascript" in answer.headers["content-type"]
    state = httpx.get(f"{base}/dashboard/state", params={"window_s": 600}).json()
    assert [(i["instance"], i["role"], i["state"]) for i in state["instances"]] == [
        (0, "prefill", "up"), (1, "decode", "up")]
    assert state["latency"]["window_s"] == 600 and state["latency"]["requests"] >= 1
    assert state["latency"]["rows"][0]["metric"] == "TTFT"
    assert {f["id"] for f in state["figures"]} >= {"roles", "load", "pools", "attainment"}
    for bad in ("0", "-1", "x", "nan", "1e9"):
        refused = httpx.get(f"{base}/dashboard/state", params={"window_s": bad})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "window_s"


def test_bench_replays_a_trace_and_scores_it_like_the_simulator(server, tmp_path, capsys):
    base, _ = server
    from pdserve.cli import main

    out = tmp_path / "bench"
    assert main(["bench", "--url", base, "--trace", "azure-conv", "--start", "600",
                 "--rate-scale", "0.5", "--duration", "8", "--max-input-tokens", "256",
                 "--max-output-tokens", "16", "--ttft-slo", "5", "--tpot-slo", "1",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())["summary"]
    assert summary["requests"] >= 1 and summary["completed"] == summary["requests"]
    assert "SLO attainment" in printed
    rows = (out / "requests.csv").read_text().splitlines()
    assert len(rows) == summary["requests"] + 1


def test_api_key_is_required_when_configured():
    from fastapi.testclient import TestClient

    from pdserve.config import serve_defaults
    from pdserve.live.server_metrics import ClusterGauges, ServerMetrics
    from pdserve.server.app import ServerSettings, create_app

    class NoDriver:  # the routes below never reach the driver
        tokenizer = TextTokenizer.shipped()
        metrics = ServerMetrics("tiny", lambda: ClusterGauges([], [], [], 0))

    client = TestClient(create_app(NoDriver(), ServerSettings(  # no lifespan
        "tiny", 8192, 2048, serve_defaults().server.max_body_bytes, api_key="s3cret")))
    refused = client.get("/v1/models")
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    wrong = client.post("/v1/completions", headers={"Authorization": "Bearer nope"},
                        json={"model": "tiny", "prompt": "x"})
    assert wrong.status_code == 401
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).json()[
        "data"][0]["id"] == "tiny"
    # the dashboard too: a bearer token, or a browser's Basic credentials with the key
    for route in ("/dashboard", "/dashboard/state", "/dashboard/page.js",
                  "/dashboard/plotly.min.js"):
        refused = client.get(route)
        assert refused.status_code == 401, route
        assert refused.headers["www-authenticate"] == 'Basic realm="pdserve dashboard"'
        assert client.get(route, auth=("any", "nope")).status_code == 401
        assert client.get(route, headers={"Authorization": "Basic !!"}).status_code == 401
    assert client.get("/dashboard/page.js", auth=("anyone", "s3cret")).status_code == 200
    assert client.get("/dashboard/page.js",
                      headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert "WWW-Authenticate" not in client.get("/v1/models").headers


def test_stop_strings_cut_the_text_streaming_and_not(server):
    base, _ = server
    full = local_greedy(PROMPT, 24)
    stop = full[6:9]
    expected = full[:full.find(stop)]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24,
                                      temperature=0, stop=[stop])
    assert whole.choices[0].text == expected
    assert whole.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True))
    assert streamed == expected
