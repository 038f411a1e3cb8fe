"""The decision log both worlds keep (`cluster/history.py`), the views of a run
(`metrics/views.py`) and the report page (`metrics/report_page.py`)."""

from __future__ import annotations

import json
import logging
import re

import pytest
from test_actions import ONE_OF_EACH, Recorder

from pdserve.cluster.actions import apply_actions
from pdserve.cluster.history import ClusterHistory, DecisionKind, InstanceState
from pdserve.config import Config
from pdserve.metrics import report_page
from pdserve.metrics.report_page import run_state, write_report
from pdserve.metrics.views import roles_figure
from pdserve.sim.runner import Experiment
from pdserve.types import Role

ARROW_FLIPS = {"workload.trace": "synthetic", "workload.synthetic_arrival": "gamma",
               "workload.synthetic_cv": 4, "workload.synthetic_lengths": "lognormal:2500:300:1.2",
               "workload.synthetic_requests": 400, "workload.synthetic_rate_rps": 40,
               "policy.name": "arrow", "cluster.prefill": 2, "cluster.decode": 2,
               "perf.model": "llama-3.1-8b", "perf.gpu": "h800"}


def test_apply_actions_logs_each_decision_that_changes_the_cluster_with_its_reason() -> None:
    history = ClusterHistory(origin_s=100.0)
    apply_actions(ONE_OF_EACH, Recorder(), [Role.PREFILL, Role.DECODE],  # type: ignore[arg-type]
                  history, 102.5)
    kinds = [d.kind for d in history.decisions]
    assert kinds == [DecisionKind.REJECT, DecisionKind.FLIP, DecisionKind.PRIORITY,
                     DecisionKind.MIGRATE, DecisionKind.START, DecisionKind.STOP]
    assert all(d.time_s == 2.5 for d in history.decisions)  # since the world's origin
    flip = history.decisions[1]
    assert (flip.instance_id, flip.role, flip.reason) == (0, Role.DECODE, "r")
    migrate = history.decisions[3]
    assert (migrate.instance_id, migrate.target_id, migrate.request_id) == (0, 1, 4)
    assert history.decisions[0].reason == "x" and history.decisions[0].request_id == 3
    assert history.decisions_total == 6
    bounded = ClusterHistory(max_decisions=2)
    apply_actions(ONE_OF_EACH, Recorder(), [Role.PREFILL, Role.DECODE],  # type: ignore[arg-type]
                  bounded, 1.0)
    assert [d.kind for d in bounded.decisions] == [DecisionKind.START, DecisionKind.STOP]
    assert bounded.decisions_total == 6


@pytest.fixture(scope="module")
def arrow_run():
    experiment = Experiment.from_config(Config().with_values(ARROW_FLIPS))
    result = experiment.simulate()
    return experiment, result


def test_the_simulator_logs_arrows_flips_and_samples_every_instance(arrow_run) -> None:
    _, result = arrow_run
    assert result.flips >= 2
    flips = result.role_changes
    assert flips and all(d.kind is DecisionKind.FLIP and d.reason for d in flips)
    assert all(d.reason.split(":")[0] in ("alg1", "alg2", "monitor", "settle")
               for d in flips), {d.reason for d in flips}
    assert result.samples and all(len(s.roles) == len(s.states) == len(s.waiting) == 4
                                  for s in result.samples)
    assert all(state is InstanceState.UP for s in result.samples for state in s.states)
    # the samples follow the log: after each flip's tick, the instance has its new role
    for flip in flips:
        later = [s for s in result.samples if s.time_s >= flip.time_s]
        if later and not any(f.instance_id == flip.instance_id and flip.time_s < f.time_s
                             <= later[0].time_s for f in flips):
            assert later[0].roles[flip.instance_id] is flip.role


def test_the_roles_view_draws_every_instance_and_marks_every_flip(arrow_run) -> None:
    _, result = arrow_run
    figure = roles_figure(result.samples, result.decisions)
    bars = [trace for trace in figure["data"] if trace["type"] == "bar"]
    drawn = {y for trace in bars for y in trace["y"]}
    assert drawn == {"#0", "#1", "#2", "#3"}
    # each instance's bars cover the run without gaps or overlaps
    for instance in drawn:
        spans = sorted((b, b + w) for trace in bars
                       for y, b, w in zip(trace["y"], trace["base"], trace["x"], strict=True)
                       if y == instance)
        assert spans[0][0] == result.samples[0].time_s
        assert all(a[1] == pytest.approx(b[0]) for a, b in zip(spans, spans[1:], strict=False))
    [marks] = [trace for trace in figure["data"] if trace.get("name") == "flip"]
    assert len(marks["x"]) == len(result.role_changes)
    assert all(d.reason in text for d, text in zip(result.role_changes, marks["text"],
                                                   strict=True))


def test_the_report_is_one_self_contained_page_of_valid_plotly_figures(arrow_run,
                                                                       tmp_path) -> None:
    graph_objects = pytest.importorskip("plotly.graph_objects")
    experiment, result = arrow_run
    state = run_state("arrow", "test", result.requests, experiment.slo, result.samples,
                      result.decisions)
    for item in state["figures"]:
        graph_objects.Figure(item["figure"])  # plotly's own validation of every view
    assert {item["id"] for item in state["figures"]} == {"roles", "pools", "load", "cdf",
                                                         "attainment"}
    logged = [row for row in state["decisions"] if row["kind"] == "flip"]
    assert len(logged) == len(result.role_changes)
    assert {row["reason"] for row in logged} == {d.reason for d in result.role_changes}
    assert state["latency"]["requests"] == len(result.requests)
    path = tmp_path / "report.html"
    assert write_report(path, state)
    page = path.read_text()
    assert not re.search(r"""src=["']https?:""", page)  # nothing fetched from the network
    assert "Plotly" in page and "PDSERVE_LIVE = null" in page
    embedded = re.search(r'<script id="state" type="application/json">(.*?)</script>', page,
                         re.S)
    assert embedded and json.loads(embedded.group(1))["title"] == "arrow"


def test_without_plotly_a_run_skips_its_report_and_says_how_to_get_it(tmp_path, monkeypatch,
                                                                      caplog) -> None:
    def missing() -> str:
        raise report_page.ReportUnavailable(f"the report needs plotly: "
                                            f"{report_page.INSTALL_HINT}")

    monkeypatch.setattr(report_page, "plotly_js", missing)
    with caplog.at_level(logging.WARNING, "pdserve.report"):
        assert not write_report(tmp_path / "report.html", {"title": "x"})
    assert not (tmp_path / "report.html").exists()
    [line] = caplog.messages
    assert "report.html" in line and "pip install 'pdserve[report]'" in line


def test_the_pareto_front_keeps_exactly_the_points_nothing_beats_on_both_costs() -> None:
    from pdserve.metrics.views import pareto_front

    xs = [1.0, 2.0, 3.0, 2.0, 1.0, float("nan")]
    ys = [3.0, 2.0, 1.0, 3.0, 3.0, 0.0]
    # (2, 3) is beaten by (2, 2); the two (1, 3) tie and both stay; NaN never is
    assert pareto_front(xs, ys) == [0, 1, 2, 4]


def test_plan_writes_its_candidates_and_their_pareto_plot(tmp_path, capsys) -> None:
    pytest.importorskip("plotly")
    from pdserve.cli import main

    out = tmp_path / "plan"
    assert main(["plan", "--policy", "ampd", "--gpus", "3", "--synthetic-requests", "5",
                 "--synthetic-rate", "0.5", "--model", "llama-3.1-8b", "--gpu", "h800",
                 "--processes", "1", "--top", "4", "--out", str(out)]) == 0
    assert "report.html" in capsys.readouterr().out
    document = json.loads((out / "summary.json").read_text())
    deployments = document["deployments"]
    assert len(deployments) == 4 and all(d["gpus_used"] <= 3 for d in deployments)
    page = (out / "report.html").read_text()
    state = json.loads(re.search(r'<script id="state" type="application/json">(.*?)</script>',
                                 page, re.S).group(1))
    assert state["latency"] is None  # a plan, not a run: no run sections
    [figure] = state["figures"]
    candidates, front = figure["figure"]["data"]
    assert candidates["x"] == [d["tau_prefill"] for d in deployments]
    assert front["x"] and set(front["text"]) <= {d["describe"] for d in deployments}
    [listed] = state["tables"]
    assert [row[1] for row in listed["rows"]] == [d["describe"] for d in deployments]
