"""What seeing a run costs: writing `report.html` after a simulation, one refresh of the live
dashboard's state with a full history, one `/metrics` scrape.

    python bench/dashboard_cost.py

Prints best-of-N wall times. The dashboard state is built every
`POLL_MS` per open page: a snapshot on the server's event loop (time the loop does not
stream tokens), then the page in a worker thread; the history is
the most the driver keeps (`HISTORY_S` of samples at serve's monitor interval, `MAX_DECISIONS`
decisions, `MAX_ENDED` ended requests), on 4 instances.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from types import SimpleNamespace

from pdserve.cluster.history import ClusterHistory, DecisionKind, InstanceState
from pdserve.config import Config, serve_defaults
from pdserve.instance.stats import InstanceStats
from pdserve.live.driver import HISTORY_S, MAX_DECISIONS, MAX_ENDED
from pdserve.live.server_metrics import ClusterGauges, ServerMetrics
from pdserve.metrics.report_page import run_state, write_report
from pdserve.server import dashboard
from pdserve.sim.runner import Experiment
from pdserve.types import SLO, Request, Role

RUNS = {
    "arrow-flips golden case (800 requests, 4 instances)": {
        "workload.trace": "synthetic", "workload.synthetic_arrival": "gamma",
        "workload.synthetic_cv": 4, "workload.synthetic_lengths": "lognormal:2500:300:1.2",
        "workload.synthetic_requests": 800, "workload.synthetic_rate_rps": 40,
        "policy.name": "arrow", "cluster.prefill": 2, "cluster.decode": 2},
    "azure-conv, whole trace, arrow 4P4D": {
        "workload.trace": "azure-conv", "policy.name": "arrow", "cluster.prefill": 4,
        "cluster.decode": 4},
}


def best_s(job, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        job()
        times.append(time.perf_counter() - started)
    return min(times)


def reports() -> None:
    with TemporaryDirectory() as tmp:
        path = Path(tmp) / "report.html"
        for name, values in RUNS.items():
            experiment = Experiment.from_config(Config().with_values(
                {**values, "perf.model": "llama-3.1-8b", "perf.gpu": "h800"}))
            started = time.perf_counter()
            result = experiment.simulate()
            simulated_s = time.perf_counter() - started
            def report(run=result, slo=experiment.slo, title=name) -> None:
                write_report(path, run_state(title, "", run.requests, slo, run.samples,
                                             run.decisions))

            report_s = best_s(report, 3)
            print(f"report.html of {name}: {report_s:.2f} s (the simulation: "
                  f"{simulated_s:.2f} s), {path.stat().st_size / 1e6:.1f} MB; "
                  f"{len(result.requests)} requests, {len(result.samples)} samples, "
                  f"{len(result.decisions)} decisions")


def live_state() -> None:
    instances, rng = 4, random.Random(0)
    interval_s = serve_defaults().monitor.interval_s
    history = ClusterHistory(0.0, MAX_DECISIONS, int(HISTORY_S / interval_s))
    roles = [Role.PREFILL, Role.PREFILL, Role.DECODE, Role.DECODE]
    loads: list[InstanceStats] = []
    for k in range(int(HISTORY_S / interval_s)):
        loads = [InstanceStats(i, rng.randint(0, 9), 1000, 0, rng.randint(0, 3), 0,
                               rng.randint(0, 20), 5000, rng.randint(0, 500), 512, 0, 0, 0.0)
                 for i in range(instances)]
        history.sample(k * interval_s, loads, roles, [InstanceState.UP] * instances)
    for k in range(MAX_DECISIONS):
        flip = k % 10 == 0
        history.record(k * HISTORY_S / MAX_DECISIONS, DecisionKind.FLIP if flip else
                       DecisionKind.REJECT, k % instances, "monitor: decode busy and this "
                       "prefill-side instance idle", role=Role.DECODE if flip else None)
    ended = []
    for k in range(MAX_ENDED):
        request = Request(k, k * HISTORY_S / MAX_ENDED, 500, 64)
        request.first_token_s, request.finish_s = request.arrival_s + 0.3, request.arrival_s + 3
        request.generated_tokens = 64
        ended.append((request.finish_s, request))
    metrics = ServerMetrics("m", lambda: ClusterGauges(roles, [InstanceState.UP] * instances,
                                                        loads, 3))
    driver = SimpleNamespace(
        cluster_history=history, started_s=0.0, streams=SimpleNamespace(ended=ended),
        metrics=metrics, workers=SimpleNamespace(count=instances),
        health=lambda: {"status": "ok", "requests_in_flight": 3, "perf_model": "profiled"},
        scheduler=SimpleNamespace(policy=SimpleNamespace(name="arrow")))
    view = dashboard.DashboardView(driver, "m", SLO(2.0, 0.15))  # type: ignore[arg-type]
    body = json.dumps(view.state(view.snapshot()))
    snapshot_s = best_s(view.snapshot, 20)
    state_s = best_s(lambda: json.dumps(view.state(view.snapshot())), 5)
    print(f"dashboard refresh, full history ({len(history.samples)} samples x {instances} "
          f"instances, {MAX_DECISIONS} decisions, {MAX_ENDED} ended requests): snapshot on "
          f"the event loop {snapshot_s * 1e3:.1f} ms, the page state with its JSON (a worker "
          f"thread) {state_s * 1e3:.0f} ms, {len(body) / 1e3:.0f} kB")
    text = metrics.text()
    print(f"/metrics, {instances} instances: {best_s(metrics.text, 20) * 1e3:.1f} ms, "
          f"{len(text) / 1e3:.0f} kB, {len(text.splitlines())} lines")


if __name__ == "__main__":
    reports()
    live_state()
