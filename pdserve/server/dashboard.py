"""The live dashboard, `GET /dashboard`: the running cluster through the same views as a
run's report (`metrics/views.py`, drawn by `metrics/assets/page.js`).

Every instance's role and state over time with the decisions that changed them (flips,
migrations, rejections, starts and stops, deaths and restarts, each with its reason), its
queue, running batch and KV use, the pools, the decision log (filterable), and TTFT and
TPOT percentiles against the SLOs with the SLO attainment over a sliding window. The page
carries its state at load and polls `/dashboard/state` (`POLL_MS`); plotly.js and the page
script are served from the package (`/dashboard/plotly.min.js`, `/dashboard/page.js`), so
the dashboard needs no internet. The routes are in `app.py`, behind the API key.

`DashboardView` reads the driver's records (`LiveDriver.cluster_history`, its ended
requests, its metrics) and writes nothing: a refresh copies them on the event loop
(`snapshot`, cheap) and builds the page from the copy in a worker thread (`state`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

from pdserve.cluster.history import Decision, LoadSample
from pdserve.live.driver import LiveDriver
from pdserve.metrics.report_page import page_script, plotly_js, render_page
from pdserve.metrics.views import attainment_figure, latency_rows, page_state
from pdserve.types import SLO, Request

POLL_MS = 2000  # how often an open page fetches the state
DEFAULT_WINDOW_S = 60.0  # the latency table's sliding window unless the page asks otherwise
MAX_WINDOW_S = 3600.0
ATTAINMENT_BIN_S = 10.0
MAX_LOG_ROWS = 1000  # the newest decisions a refresh sends (the page filters these)


@dataclass(frozen=True)
class Snapshot:
    """What a refresh reads of the driver, copied on its event loop: the page is then built
    from it in a worker thread, so a refresh does not hold up token streaming."""

    now_s: float  # since the driver started, as the history's times
    samples: list[LoadSample]
    decisions: list[Decision]
    decisions_total: int
    ended: list[tuple[float, Request]]  # (since the start, request)
    cards: list[tuple[str, str]]
    instances: int


class DashboardView:
    """The dashboard of `driver`, serving `model_name` against `slo`."""

    def __init__(self, driver: LiveDriver, model_name: str, slo: SLO) -> None:
        self.driver = driver
        self.model_name = model_name
        self.slo = slo

    def snapshot(self) -> Snapshot:
        """Copy what the page shows (call it on the driver's event loop)."""
        driver = self.driver
        origin, history, metrics = driver.started_s, driver.cluster_history, driver.metrics
        now = time.monotonic() - origin
        health = driver.health()
        cards = [
            ("status", str(health["status"])), ("policy", driver.scheduler.policy.name),
            ("up for", f"{now:.0f} s"), ("in flight", str(health["requests_in_flight"])),
            ("admitted", f"{metrics.total('pdserve:requests'):.0f}"),
            ("role flips", f"{metrics.total('pdserve:role_flips'):.0f}"),
            ("migrations", f"{metrics.total('pdserve:migrations'):.0f}"),
            ("rejected", f"{metrics.total('pdserve:rejections'):.0f}"),
            ("restarts", f"{metrics.total('pdserve:worker_restarts'):.0f}"),
            ("perf model", str(health["perf_model"]))]
        return Snapshot(now, list(history.samples), list(history.decisions),
                        history.decisions_total,
                        [(end_s - origin, request) for end_s, request in driver.streams.ended],
                        cards, driver.workers.count)

    def state(self, snapshot: Snapshot, window_s: float = DEFAULT_WINDOW_S) -> dict[str, Any]:
        """The page state of `snapshot` (any thread); the latency table covers the requests
        that ended in the last `window_s` seconds."""
        slo = self.slo
        recent = [request for end_s, request in snapshot.ended
                  if end_s >= snapshot.now_s - window_s]
        latency = {**latency_rows(recent, slo), "window_s": window_s}
        figures = [("attainment", attainment_figure(snapshot.ended, slo, ATTAINMENT_BIN_S))]
        return page_state(
            f"pdserve: {self.model_name}", f"{snapshot.instances} instances; SLO TTFT "
            f"{slo.ttft_s:g} s, TPOT {slo.tpot_s:g} s; times in seconds since the server "
            f"started", snapshot.samples, snapshot.decisions, snapshot.decisions_total,
            latency, figures, snapshot.cards, max_log_rows=MAX_LOG_ROWS)

    def state_json(self, snapshot: Snapshot, window_s: float) -> bytes:
        """`state` as the JSON `/dashboard/state` answers (any thread)."""
        return json.dumps(self.state(snapshot, window_s), separators=(",", ":"),
                          allow_nan=False).encode()

    def page(self, snapshot: Snapshot) -> str:
        """The dashboard's HTML (any thread): the state of `snapshot`, then polling."""
        return render_page(self.state(snapshot), '<script src="dashboard/plotly.min.js"></script>',
                           '<script src="dashboard/page.js"></script>',
                           {"state_url": "dashboard/state", "poll_ms": POLL_MS})


@cache
def plotly_script() -> str:
    """plotly.js, read once (4.8 MB)."""
    return plotly_js()


@cache
def page_js() -> str:
    return page_script()
