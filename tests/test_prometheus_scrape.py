"""Debian's Prometheus server scrapes a live pdserve with the shipped scrape config
(`deploy/prometheus/prometheus.yml`, its target pointed at the test's server) and answers
PromQL over pdserve's metrics, the Grafana dashboard's TTFT panel query among them."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from server_helpers import running_server

from pdserve.live.replay_client import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    PROMETHEUS is None, reason="Debian's prometheus is not installed (apt-get install "
                               "prometheus)")]
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def query(url: str, promql: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_pdserve_and_answers_promql(tmp_path):
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 1}) as (base, _):
        config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
        config["global"]["scrape_interval"] = "1s"
        [job] = config["scrape_configs"]
        job["static_configs"] = [{"targets": [base.removeprefix("http://")]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            def scraped(promql: str, wanted: float) -> list[dict]:
                deadline, found = time.monotonic() + 60, []
                while time.monotonic() < deadline:
                    assert server.poll() is None, server.stderr.read().decode()[-2000:]
                    try:
                        found = query(url, promql)
                    except (httpx.HTTPError, ValueError):  # not ready: no JSON yet
                        found = []
                    if found and float(found[0]["value"][1]) == wanted:
                        break
                    time.sleep(0.5)
                return found

            # scraped before the requests, so rates over the window see them arrive
            assert scraped("sum(vllm:generation_tokens_total)", 0), "never scraped"
            time.sleep(1.5)
            for _ in range(3):
                assert httpx.post(f"{base}/v1/completions", timeout=120, json={
                    "model": "tiny", "prompt": "The quick brown fox", "max_tokens": 8}
                ).status_code == 200
            [tokens] = scraped("sum(vllm:generation_tokens_total)", 24)  # 3 x 8 tokens
            assert float(tokens["value"][1]) == 24
            [up] = query(url, 'up{job="pdserve"}')
            assert up["value"][1] == "1"
            pools = {r["metric"]["role"]: float(r["value"][1])
                     for r in query(url, "pdserve:pool_size")}
            assert pools["prefill"] == 1 and pools["decode"] == 1
            # the Grafana dashboard's TTFT query, its variables filled in
            dashboard = json.loads((DEPLOY / "grafana" / "pdserve.json").read_text())
            [panel] = [p for p in dashboard["panels"] if p["title"].startswith("Time to first")]
            promql = (panel["targets"][1]["expr"].replace("$model_name", "tiny")
                      .replace("$__rate_interval", "1m"))
            [p90] = query(url, promql)
            assert 0 < float(p90["value"][1]) < 60
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
