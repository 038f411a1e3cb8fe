"""The page that shows a run: `report.html` beside every `summary.json` (simulate, bench,
plan), and the live dashboard's page (`server/dashboard.py`). Both are one template
(`assets/page.html`) drawn by one script (`assets/page.js`) from a page state
(`views.page_state`); the report inlines plotly.js and the state, so it opens anywhere with
no network, the dashboard loads the same script and plotly.js from the server and polls
its state.

plotly.js comes from the `plotly` package (the `report` extra, also part of `serve`): a
base install simulates without it and says how to get the report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from pdserve.cluster.history import Decision, LoadSample
from pdserve.metrics.goodput import GoodputResult
from pdserve.metrics.views import (
    Figure,
    attainment_figure,
    attainment_vs_rate_figure,
    latency_cdf_figure,
    latency_rows,
    page_state,
)
from pdserve.types import SLO, Request

log = logging.getLogger("pdserve.report")
INSTALL_HINT = "pip install 'pdserve[report]' (plotly)"


class ReportUnavailable(RuntimeError):
    """plotly is not installed: no page can be drawn."""


def plotly_js() -> str:
    """plotly.js (minified), as the installed plotly package ships it."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as err:
        raise ReportUnavailable(f"the report needs plotly: {INSTALL_HINT}") from err
    return get_plotlyjs()


def page_script() -> str:
    return resources.files("pdserve.metrics").joinpath("assets/page.js").read_text()


def _template() -> str:
    return resources.files("pdserve.metrics").joinpath("assets/page.html").read_text()


def _json_in_html(value: Any) -> str:
    """JSON safe inside a <script> element."""
    return (json.dumps(value, separators=(",", ":"), allow_nan=False)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def render_page(state: dict[str, Any], plotly_tag: str, script_tag: str,
                live: dict[str, Any] | None = None) -> str:
    """The page of `state`; `live`: the dashboard's poll settings (`state_url`,
    `poll_ms`), None for a static report."""
    from html import escape

    page = _template()
    for key, value in (("__TITLE__", escape(state["title"])), ("__PLOTLY__", plotly_tag),
                       ("__STATE__", _json_in_html(state)),
                       ("__LIVE__", _json_in_html(live) if live else "null"),
                       ("__SCRIPT__", script_tag)):
        page = page.replace(key, value, 1)
    return page


def report_html(state: dict[str, Any]) -> str:
    """A self-contained page: plotly.js, the script and the state inlined."""
    plotly = plotly_js().replace("</script", "<\\/script")
    return render_page(state, f"<script>{plotly}</script>",
                       f"<script>{page_script()}</script>")


def write_report(path: Path, state: dict[str, Any]) -> bool:
    """Write `report.html`; without plotly, say how to get it (one log line) and skip."""
    try:
        html = report_html(state)
    except ReportUnavailable as err:
        log.warning("no %s: %s", path.name, err)
        return False
    path.write_text(html)
    return True


def write_plan(out: Path, title: str, subtitle: str, document: dict[str, Any],
               figures: Sequence[tuple[str, Figure]], results: dict[str, Any],
               cards: Sequence[tuple[str, str]] = ()) -> list[str]:
    """A planner's `summary.json` (`document`) and `report.html` (its Pareto plots and
    table) in `out`; returns the names of the files written."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(document, indent=2) + "\n")
    written = write_report(out / "report.html", page_state(
        title, subtitle, (), (), 0, None, list(figures), cards, [results]))
    return ["summary.json"] + (["report.html"] if written else [])


def ended_at(requests: Sequence[Request]) -> list[tuple[float, Request]]:
    """Each request with when it ended: its finish, or (rejected, unfinished) its arrival."""
    return [(r.finish_s if r.finished else r.arrival_s, r) for r in requests]


def run_state(title: str, subtitle: str, requests: Sequence[Request], slo: SLO,
              samples: Sequence[LoadSample] = (), decisions: Sequence[Decision] = (),
              goodput: GoodputResult | None = None, label: str = "",
              cards: Sequence[tuple[str, str]] = (),
              figures: Sequence[tuple[str, Figure]] = ()) -> dict[str, Any]:
    """The page state of a whole run (simulated, or a bench replay): the cluster's views
    when it has them, the latency table, CDFs and attainment over time, and the goodput
    search's attainment against rate."""
    ended = ended_at(requests)
    span_s = max((t for t, _ in ended), default=0.0) - min((t for t, _ in ended), default=0.0)
    bin_s = max(1.0, round(span_s / 60.0))
    shown: list[tuple[str, Figure]] = [("cdf", latency_cdf_figure(requests, slo)),
                                       ("attainment", attainment_figure(ended, slo, bin_s))]
    if goodput is not None:
        shown.append(("rate", attainment_vs_rate_figure(goodput, label)))
    return page_state(title, subtitle, samples, decisions, len(decisions),
                      latency_rows(requests, slo), [*shown, *figures], cards)
