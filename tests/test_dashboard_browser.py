"""The dashboard and the report as a person sees them: Debian's headless Chromium renders
`/dashboard` of a live Arrow cluster that flips under a burst (behind an API key, opened with
Basic credentials as a browser would) and a simulated run's `report.html`, and the tests
read the rendered page: every instance listed, a flip with its reason in the decision log,
the live page updated by its polling.

    PDSERVE_WRITE_SCREENSHOTS=1 pytest -m slow tests/test_dashboard_browser.py

also writes the screenshots of `docs/results/dashboard/`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from server_helpers import running_server, wait_until

from pdserve.cli import main

CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "dashboard"
KEY = "dash-k3y"


def chromium(url: str, profile: Path, screenshot: Path | None = None,
             budget_ms: int = 5000) -> str:
    """The DOM of `url` after `budget_ms` of the page's (virtual) time; with `screenshot`,
    a PNG of it instead. A fresh profile, no network beyond the URL, bounded in time."""
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
               "--window-size=1400,1900", f"--virtual-time-budget={budget_ms}"]
    command += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    done = subprocess.run([*command, url], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Tables(HTMLParser):
    """The text of each cell of every table with an id, by table id, row by row; and the
    body's attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.body: dict[str, str] = {}
        self._table = ""
        self._cell: list[str] | None = None
        self._footer = False
        self.footer = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "body":
            self.body = {k: v or "" for k, v in found.items()}
        elif tag == "footer":
            self._footer = True
        elif tag == "table" and found.get("id"):
            self._table = found["id"] or ""
            self.tables[self._table] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][-1].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = ""
        elif tag == "footer":
            self._footer = False

    def handle_data(self, data: str) -> None:
        if self._footer:
            self.footer += data
        if self._cell is not None:
            self._cell.append(data)


def rendered(dom: str) -> Tables:
    page = Tables()
    page.feed(dom)
    return page


def burst(base: str, count: int, prompt_tokens: int) -> list[threading.Thread]:
    """`count` long prompts at once (each thread bounded by its timeout)."""
    def send(i: int) -> None:
        httpx.post(f"{base}/v1/completions", timeout=120,
                   headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": "tiny", "prompt": [5 + i % 7] * prompt_tokens,
                         "max_tokens": 64, "temperature": 0})

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    return threads


def test_the_live_dashboard_shows_an_arrow_flip_as_it_happens(tmp_path):
    # 1 prefill + 2 decode workers and a TTFT target a burst of long prompts cannot meet on
    # the one prefill instance: Arrow's Alg. 1 flips a decode instance to prefill
    with running_server(tmp_path, {"cluster.instances": 3, "policy.name": "arrow",
                                   "cluster.prefill": 1, "cluster.decode": 2,
                                   "slo.ttft_s": 0.05, "slo.tpot_s": 0.05,
                                   "server.api_key": KEY}) as (base, driver):
        assert httpx.get(f"{base}/dashboard").status_code == 401
        threads = burst(base, 16, 400)
        assert wait_until(lambda: driver.role_changes, 60, 0.05), "Arrow never flipped"
        time.sleep(1.0)  # a monitor tick samples the flipped roles
        url = base.replace("http://", f"http://viewer:{KEY}@") + "/dashboard"
        if os.environ.get("PDSERVE_WRITE_SCREENSHOTS"):
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            chromium(url, tmp_path / "shot", SCREENSHOTS / "live_arrow_flip.png", 3000)
        page = rendered(chromium(url, tmp_path / "profile"))
        for thread in threads:
            thread.join(120)
        flips = list(driver.role_changes)
    # drawn at load, then again from a poll
    assert int(page.body["data-updates"]) >= 2, page.footer
    instances = page.tables["instances"]
    assert instances[0][:3] == ["instance", "role", "state"]
    assert [row[0] for row in instances[1:]] == ["0", "1", "2"]
    assert all(row[2] == "up" for row in instances[1:])
    log = page.tables["decisions"][1:]
    shown = [row for row in log if row[1] == "flip"]
    assert shown, log
    assert any("alg1" in row[4] and "predicted TTFT" in row[4] for row in shown), shown
    first = flips[0]
    assert any(row[2] == f"#{first[1]} \u2192 {first[2]}" for row in shown), shown
    latency = page.tables["latency"]
    assert [row[0] for row in latency[1:]] == ["TTFT", "TPOT"]


def test_a_simulate_report_renders_every_instance_and_its_flips(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["simulate", "--trace", "synthetic", "--synthetic-arrival", "gamma",
                 "--synthetic-cv", "4", "--synthetic-lengths", "lognormal:2500:300:1.2",
                 "--synthetic-requests", "800", "--synthetic-rate", "40", "--policy", "arrow",
                 "--prefill", "2", "--decode", "2", "--model", "llama-3.1-8b", "--gpu",
                 "h800", "--no-progress", "--goodput", "--out", str(out)]) == 0
    assert "report.html" in capsys.readouterr().out
    url = (out / "report.html").as_uri()
    if os.environ.get("PDSERVE_WRITE_SCREENSHOTS"):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        chromium(url, tmp_path / "shot", SCREENSHOTS / "simulate_report.png", 3000)
    dom = chromium(url, tmp_path / "profile", budget_ms=3000)
    page = rendered(dom)
    assert page.body["data-updates"] == "1"  # a report draws once, and polls nothing
    assert [row[0] for row in page.tables["instances"][1:]] == ["0", "1", "2", "3"]
    flips = [row for row in page.tables["decisions"][1:] if row[1] == "flip"]
    assert len(flips) >= 2 and all(re.match(r"(alg\d|monitor|settle)", row[4])
                                   for row in flips)
    # plotly drew the figures: an SVG per view, the roles view with bars for every instance
    # in each role it held (a drawn bar is a `point` of a `trace bars` group)
    assert dom.count('class="main-svg"') >= 6
    roles = dom[dom.index('id="fig-roles"'):dom.index('id="fig-pools"')]
    assert roles.count('class="trace bars"') >= 2
    assert roles.count('class="point"') >= 4 + len(flips)
