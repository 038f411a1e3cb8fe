"""The views of a cluster's run, one set for the HTML report of every run (`report_page.py`)
and the live dashboard (`server/dashboard.py`): each instance's role and state over time
with the decisions that changed them, queues, running batches and KV use, the pools, the
decision log with its reasons, latency percentiles against the SLOs, latency CDFs, SLO
attainment over time and against the request rate.

Each view is a plotly figure as plain JSON data (`{"data": [...], "layout": {...}}`, plotly's
figure schema), so building one needs no plotly import: the report hands it to plotly.js
inlined in the page, the dashboard sends it to the browser, where the same page script
(`assets/page.js`) draws both. `page_state` assembles what that script renders.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from pdserve.cluster.history import Decision, DecisionKind, InstanceState, LoadSample
from pdserve.metrics.goodput import GoodputResult
from pdserve.metrics.summary import Percentiles, meets_slo, tpot_s, ttft_s
from pdserve.types import SLO, Request, Role

Figure = dict[str, Any]
MAX_POINTS = 1500  # per line: longer series are thinned evenly (the last point kept)
MAX_LOG_ROWS = 5000  # the newest decisions shown in a page
ROLE_COLORS = {Role.PREFILL.value: "#1f77b4", Role.D_TO_P.value: "#9ecae1",
               Role.DECODE.value: "#2ca02c", Role.P_TO_D.value: "#a1d99b",
               Role.MIXED.value: "#9467bd", Role.RESERVE.value: "#bdbdbd",
               InstanceState.STOPPED.value: "#e0e0e0", InstanceState.RESTARTING.value: "#ff9f1c",
               InstanceState.DEAD.value: "#d62728"}
MARKERS = {DecisionKind.FLIP: ("diamond", "#000000"), DecisionKind.MIGRATE: ("triangle-right",
           "#8c564b"), DecisionKind.STOP: ("square", "#636363"),
           DecisionKind.START: ("triangle-up", "#17becf"),
           DecisionKind.STARTED: ("circle", "#17becf"), DecisionKind.FAILED: ("x", "#d62728"),
           DecisionKind.RECOVERED: ("star", "#ff9f1c")}


def _layout(title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title, "font": {"size": 15}}, "margin": {"l": 60, "r": 20,
            "t": 40, "b": 40}, "legend": {"orientation": "h", "y": -0.2},
            "hovermode": "closest", **extra}


def _thin(count: int) -> list[int]:
    """Indices of at most `MAX_POINTS` evenly spread samples, the last one included."""
    if count <= MAX_POINTS:
        return list(range(count))
    step = count / MAX_POINTS
    picked = [int(i * step) for i in range(MAX_POINTS - 1)]
    return [*picked, count - 1]


def _label(instance: int) -> str:
    return f"#{instance}"


# ---- instances over time ----
def roles_figure(samples: Sequence[LoadSample], decisions: Sequence[Decision],
                 title: str = "instances: role and state over time") -> Figure:
    """One bar per instance, coloured by role while it is up and by state otherwise,
    with the decisions that changed the cluster marked (hover: the reason)."""
    segments: dict[str, tuple[list[str], list[float], list[float]]] = {}
    if samples:
        count = len(samples[0].roles)
        end_s = samples[-1].time_s + (samples[-1].time_s - samples[-2].time_s
                                      if len(samples) > 1 else 1.0)
        for instance in range(count):
            start, current = samples[0].time_s, _shown(samples[0], instance)
            for sample in samples[1:]:
                now = _shown(sample, instance)
                if now != current:
                    _segment(segments, current, instance, start, sample.time_s)
                    start, current = sample.time_s, now
            _segment(segments, current, instance, start, end_s)
    data: list[dict[str, Any]] = [
        {"type": "bar", "orientation": "h", "name": name, "y": ys, "base": bases, "x": widths,
         "marker": {"color": ROLE_COLORS.get(name, "#7f7f7f")},
         "hovertemplate": f"{name}<br>%{{base:.1f}} s for %{{x:.1f}} s<extra></extra>"}
        for name, (ys, bases, widths) in sorted(segments.items())]
    for kind, (symbol, color) in MARKERS.items():
        marked = [d for d in decisions if d.kind is kind and d.instance_id >= 0]
        if marked:
            data.append({"type": "scatter", "mode": "markers", "name": kind.value,
                         "x": [d.time_s for d in marked],
                         "y": [_label(d.instance_id) for d in marked],
                         "text": [_describe(d) for d in marked], "hoverinfo": "text",
                         "marker": {"symbol": symbol, "color": color, "size": 9,
                                    "line": {"width": 1, "color": "#ffffff"}}})
    count = len(samples[0].roles) if samples else 0
    return {"data": data, "layout": _layout(
        title, barmode="overlay", xaxis={"title": {"text": "time (s)"}},
        yaxis={"autorange": "reversed", "type": "category", "categoryorder": "array",
               "categoryarray": [_label(i) for i in range(count)]}, bargap=0.35,
        height=max(260, 60 + 34 * count))}


def _shown(sample: LoadSample, instance: int) -> str:
    state = sample.states[instance]
    return sample.roles[instance].value if state is InstanceState.UP else state.value


def _segment(segments: dict[str, tuple[list[str], list[float], list[float]]], name: str,
             instance: int, start_s: float, end_s: float) -> None:
    ys, bases, widths = segments.setdefault(name, ([], [], []))
    ys.append(_label(instance))
    bases.append(start_s)
    widths.append(max(end_s - start_s, 1e-9))


def load_figure(samples: Sequence[LoadSample]) -> Figure:
    """Per instance: requests waiting (prefill queue and decode queue), the running batch
    (sequences decoding) and KV use, one row each, over time."""
    picked = [samples[i] for i in _thin(len(samples))]
    times = [s.time_s for s in picked]
    count = len(picked[0].roles) if picked else 0
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
              "#7f7f7f", "#bcbd22", "#17becf"]
    data: list[dict[str, Any]] = []
    rows = (("waiting", "y", lambda s, i: s.waiting[i]),
            ("running", "y2", lambda s, i: s.running[i]),
            ("KV %", "y3", lambda s, i: round(100 * s.memory_fraction[i], 2)))
    for instance in range(count):
        color = colors[instance % len(colors)]
        for row, (name, axis, value) in enumerate(rows):
            data.append({"type": "scatter", "mode": "lines", "name": _label(instance),
                         "legendgroup": _label(instance), "showlegend": row == 0,
                         "x": times, "y": [value(s, instance) for s in picked],
                         "yaxis": axis, "line": {"width": 1.2, "color": color},
                         "hovertemplate": f"{_label(instance)} {name}: %{{y}}<extra></extra>"})
    return {"data": data, "layout": _layout(
        "queues, running batches and KV use per instance", height=520,
        xaxis={"title": {"text": "time (s)"}, "anchor": "y3"},
        yaxis={"title": {"text": "waiting"}, "domain": [0.7, 1.0], "rangemode": "tozero"},
        yaxis2={"title": {"text": "running"}, "domain": [0.37, 0.63], "rangemode": "tozero"},
        yaxis3={"title": {"text": "KV %"}, "domain": [0.0, 0.3], "range": [0, 100]})}


def pools_figure(samples: Sequence[LoadSample]) -> Figure:
    """How many instances are up in each role over time."""
    picked = [samples[i] for i in _thin(len(samples))]
    counts = [Counter(r.value for r, state in zip(s.roles, s.states, strict=True)
                      if state is InstanceState.UP) for s in picked]
    names = sorted({name for count in counts for name in count})
    data = [{"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 1.5,
             "color": ROLE_COLORS.get(name)}, "name": name, "x": [s.time_s for s in picked],
             "y": [count[name] for count in counts]} for name in names]
    return {"data": data, "layout": _layout("pool sizes (instances up in each role)",
                                            xaxis={"title": {"text": "time (s)"}},
                                            yaxis={"title": {"text": "instances"},
                                                   "rangemode": "tozero", "dtick": 1})}


# ---- the decision log ----
def decision_rows(decisions: Sequence[Decision],
                  max_rows: int = MAX_LOG_ROWS) -> list[dict[str, Any]]:
    """The newest `max_rows` decisions, newest first, as the page's log shows them."""
    rows = list(decisions)[-max_rows:]
    return [{"time_s": round(d.time_s, 3), "kind": d.kind.value, "instance": d.instance_id,
             "target": d.target_id, "request": d.request_id,
             "role": d.role.value if d.role is not None else "", "reason": d.reason}
            for d in reversed(rows)]


def _describe(decision: Decision) -> str:
    head = f"{decision.time_s:.2f}s {decision.kind.value} {_label(decision.instance_id)}"
    if decision.role is not None:
        head += f" -> {decision.role.value}"
    if decision.target_id >= 0:
        head += f" -> {_label(decision.target_id)} (request {decision.request_id})"
    return f"{head}<br>{decision.reason}"


# ---- latency ----
def latency_rows(ended: Sequence[Request], slo: SLO) -> dict[str, Any]:
    """TTFT and TPOT percentiles of the finished requests against their SLOs, and the SLO
    attainment of all of them (a request that failed or was rejected misses)."""
    done = [r for r in ended if r.finished]
    rows = []
    for name, target, values in (("TTFT", slo.ttft_s, [ttft_s(r) for r in done]),
                                 ("TPOT", slo.tpot_s, [tpot_s(r) for r in done])):
        stats = Percentiles.of(np.array(values, dtype=float))
        met = sum(1 for v in values if v <= target)
        rows.append({"metric": name, "slo_s": target, "mean_s": _num(stats.mean),
                     "p50_s": _num(stats.p50), "p90_s": _num(stats.p90),
                     "p99_s": _num(stats.p99),
                     "attained": _num(met / len(ended) if ended else math.nan)})
    met = sum(1 for r in ended if meets_slo(r, slo))
    return {"requests": len(ended), "finished": len(done), "rows": rows,
            "attainment": _num(met / len(ended) if ended else math.nan)}


def _num(value: float) -> float | None:
    """JSON has no NaN: None."""
    return None if math.isnan(value) else round(float(value), 6)


def latency_cdf_figure(requests: Sequence[Request], slo: SLO) -> Figure:
    """CDFs of TTFT and TPOT over the finished requests, with the SLO lines."""
    done = [r for r in requests if r.finished]
    data: list[dict[str, Any]] = []
    shapes = []
    for axis, (name, target, values) in enumerate(
            (("TTFT", slo.ttft_s, [ttft_s(r) for r in done]),
             ("TPOT", slo.tpot_s, [tpot_s(r) for r in done if r.generated_tokens != 1]))):
        ordered = np.sort(np.maximum(np.array(values, dtype=float), 1e-6))
        keep = _thin(len(ordered))
        suffix = "" if axis == 0 else "2"
        data.append({"type": "scatter", "mode": "lines", "name": f"{name} CDF",
                     "x": [float(ordered[i]) for i in keep],
                     "y": [(i + 1) / len(ordered) for i in keep],
                     "xaxis": f"x{suffix}", "yaxis": f"y{suffix}"})
        shapes.append({"type": "line", "xref": f"x{suffix}", "yref": f"y{suffix} domain",
                       "x0": target, "x1": target, "y0": 0, "y1": 1,
                       "line": {"color": "#d62728", "dash": "dash", "width": 1.5}})
        data.append({"type": "scatter", "mode": "markers", "name": f"{name} SLO {target:g}s",
                     "x": [target], "y": [0.5], "marker": {"color": "#d62728", "size": 1},
                     "xaxis": f"x{suffix}", "yaxis": f"y{suffix}", "hoverinfo": "name"})
    return {"data": data, "layout": _layout(
        "latency CDFs (dashed: the SLO)", shapes=shapes,
        xaxis={"title": {"text": "TTFT (s)"}, "type": "log", "domain": [0, 0.46]},
        yaxis={"title": {"text": "fraction of requests"}, "range": [0, 1.02]},
        xaxis2={"title": {"text": "TPOT (s)"}, "type": "log", "domain": [0.54, 1.0]},
        yaxis2={"anchor": "x2", "range": [0, 1.02]})}


def attainment_figure(ended: Sequence[tuple[float, Request]], slo: SLO,
                      bin_s: float) -> Figure:
    """SLO attainment and TTFT/TPOT p90 of the requests that ended in each `bin_s` window,
    by when they ended."""
    bins: dict[int, list[Request]] = {}
    for end_s, request in ended:
        bins.setdefault(int(end_s // bin_s), []).append(request)
    keys = sorted(bins)
    times = [(k + 1) * bin_s for k in keys]
    attained = [100 * sum(meets_slo(r, slo) for r in bins[k]) / len(bins[k]) for k in keys]

    def p90(measure: Any, k: int) -> float | None:
        values = sorted(measure(r) for r in bins[k] if r.finished)
        if not values:
            return None
        at = 0.9 * (len(values) - 1)  # numpy's default (linear) percentile, without numpy's
        low = int(at)  # per-call cost: this runs for every bin of every dashboard refresh
        high = min(low + 1, len(values) - 1)
        return _num(values[low] + (values[high] - values[low]) * (at - low))

    data = [{"type": "scatter", "mode": "lines+markers", "name": "SLO attainment %",
             "x": times, "y": attained, "line": {"color": "#2ca02c"}},
            {"type": "scatter", "mode": "lines", "name": "TTFT p90 / SLO", "x": times,
             "y": [_ratio(p90(ttft_s, k), slo.ttft_s) for k in keys], "yaxis": "y2",
             "line": {"color": "#1f77b4", "dash": "dot"}},
            {"type": "scatter", "mode": "lines", "name": "TPOT p90 / SLO", "x": times,
             "y": [_ratio(p90(tpot_s, k), slo.tpot_s) for k in keys], "yaxis": "y2",
             "line": {"color": "#ff7f0e", "dash": "dot"}}]
    return {"data": data, "layout": _layout(
        f"SLO attainment per {bin_s:g} s (by when requests ended)",
        xaxis={"title": {"text": "time (s)"}},
        yaxis={"title": {"text": "attainment %"}, "range": [0, 102]},
        yaxis2={"title": {"text": "p90 / SLO"}, "overlaying": "y", "side": "right",
                "rangemode": "tozero"},
        shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y2", "y0": 1,
                 "y1": 1, "line": {"color": "#d62728", "dash": "dash", "width": 1}}])}


def _ratio(value: float | None, target: float) -> float | None:
    return None if value is None else round(value / target, 4)


def attainment_vs_rate_figure(goodput: GoodputResult, label: str) -> Figure:
    """The goodput search: SLO attainment against the request rate, the target line."""
    points = sorted(goodput.points, key=lambda p: p.rate_rps)
    return {"data": [{"type": "scatter", "mode": "lines+markers",
                      "name": f"{label} (goodput {goodput.rate_text})",
                      "x": [p.rate_rps for p in points],
                      "y": [100 * p.summary.slo_attainment for p in points]}],
            "layout": _layout("SLO attainment against request rate (the goodput search)",
                              xaxis={"title": {"text": "request rate (req/s)"}},
                              yaxis={"title": {"text": "SLO attainment %"}, "range": [0, 102]},
                              shapes=[{"type": "line", "xref": "paper", "x0": 0, "x1": 1,
                                       "y0": 100 * goodput.target_attainment,
                                       "y1": 100 * goodput.target_attainment,
                                       "line": {"color": "#7f7f7f", "dash": "dash"}}])}


def pareto_figure(title: str, labels: Sequence[str], xs: Sequence[float],
                  ys: Sequence[float], x_title: str, y_title: str,
                  color: Sequence[float] = (), color_title: str = "") -> Figure:
    """Candidates as points of two costs (lower is better on both), the Pareto front (the
    points no other beats on both) joined and labelled; `color`: a third measure."""
    front = pareto_front(xs, ys)
    marker: dict[str, Any] = {"size": 9, "line": {"width": 1, "color": "#ffffff"}}
    if color:
        marker.update(color=list(color), colorscale="Viridis", showscale=True,
                      colorbar={"title": {"text": color_title}})
    ordered = sorted(front, key=lambda i: xs[i])
    return {"data": [
        {"type": "scatter", "mode": "markers", "name": "candidates", "x": list(xs),
         "y": list(ys), "text": list(labels), "hoverinfo": "text+x+y", "marker": marker},
        {"type": "scatter", "mode": "lines+markers+text", "name": "Pareto front",
         "x": [xs[i] for i in ordered], "y": [ys[i] for i in ordered],
         "text": [labels[i] for i in ordered], "textposition": "top right",
         "line": {"color": "#d62728", "dash": "dot"}, "marker": {"color": "#d62728",
                                                                  "size": 11,
                                                                  "symbol": "circle-open"}}],
        "layout": _layout(title, xaxis={"title": {"text": x_title}},
                          yaxis={"title": {"text": y_title}}, height=480)}


def goodput_latency_figure(title: str, groups: Sequence[str], labels: Sequence[str],
                           latency_s: Sequence[float], goodput: Sequence[float],
                           latency_title: str, slo_s: float) -> Figure:
    """Candidates as points of a latency (x, lower is better) and a goodput (y, higher is
    better), a trace per group (a planner's policy), the SLO a dashed line, and the front
    (the points no other has both faster and higher) joined."""
    front = pareto_front(latency_s, [-g for g in goodput])
    data: list[dict[str, Any]] = []
    for group in sorted(set(groups)):
        mine = [i for i, g in enumerate(groups) if g == group]
        data.append({"type": "scatter", "mode": "markers", "name": group,
                     "x": [latency_s[i] for i in mine], "y": [goodput[i] for i in mine],
                     "text": [labels[i] for i in mine], "hoverinfo": "text+x+y",
                     "marker": {"size": 8}})
    ordered = sorted(front, key=lambda i: latency_s[i])
    data.append({"type": "scatter", "mode": "lines", "name": "Pareto front",
                 "x": [latency_s[i] for i in ordered], "y": [goodput[i] for i in ordered],
                 "line": {"color": "#000000", "shape": "hv", "width": 1}})
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": slo_s, "x1": slo_s,
               "y0": 0, "y1": 1, "line": {"color": "#888888", "dash": "dash"}}]
    return {"data": data, "layout": _layout(title, xaxis={"title": {"text": latency_title}},
                                            yaxis={"title": {"text": "goodput per GPU "
                                                             "(req/s)"}},
                                            shapes=shapes, height=460)}


def pareto_front(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats on both (lower) costs; NaN never is."""
    points = [(x, y, i) for i, (x, y) in enumerate(zip(xs, ys, strict=True))
              if not (math.isnan(x) or math.isnan(y))]
    return [i for x, y, i in points
            if not any(a <= x and b <= y and (a < x or b < y) for a, b, _ in points)]


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """A table the page shows as it is (numbers as numbers, NaN as a dash)."""
    return {"title": title, "columns": list(columns),
            "rows": [[_num(v) if isinstance(v, float) else v for v in row] for row in rows]}


# ---- the page ----
def instance_rows(sample: LoadSample | None) -> list[dict[str, Any]]:
    """Each instance as the latest sample has it."""
    if sample is None:
        return []
    return [{"instance": i, "role": role.value, "state": state.value,
             "waiting": sample.waiting[i], "running": sample.running[i],
             "kv_percent": round(100 * sample.memory_fraction[i], 1)}
            for i, (role, state) in enumerate(zip(sample.roles, sample.states, strict=True))]


def page_state(title: str, subtitle: str, samples: Sequence[LoadSample],
               decisions: Sequence[Decision], decisions_total: int,
               latency: dict[str, Any] | None,
               figures: Sequence[tuple[str, Figure]] = (),
               cards: Sequence[tuple[str, str]] = (),
               tables: Sequence[dict[str, Any]] = (),
               max_log_rows: int = MAX_LOG_ROWS) -> dict[str, Any]:
    """What the page script renders: the cluster views of `samples` and `decisions` (none
    when a run has no cluster, as a bench against any server), the latency summary (None:
    not a run, as a plan; the page then shows no run sections), and any further figures,
    headline cards and tables."""
    shown: list[tuple[str, Figure]] = []
    if samples:
        shown += [("roles", roles_figure(samples, decisions)), ("pools", pools_figure(samples)),
                  ("load", load_figure(samples))]
    shown += list(figures)
    return {"title": title, "subtitle": subtitle,
            "cards": [{"label": label, "value": value} for label, value in cards],
            "instances": instance_rows(samples[-1] if samples else None),
            "latency": latency, "figures": [{"id": key, "figure": figure}
                                            for key, figure in shown],
            "decisions": decision_rows(decisions, max_log_rows),
            "decisions_total": decisions_total,
            "decision_kinds": [kind.value for kind in DecisionKind], "tables": list(tables)}
