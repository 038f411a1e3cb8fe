"""Where a live request's TTFT goes: the driver's timeline joined with the client's, and the
simulator's control-plane latency that accounts for the part outside the workers."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
from server_helpers import running_server

from pdserve.config import Config
from pdserve.live.replay_client import ClientTimeline, replay
from pdserve.live.timeline import read_timeline, split_ttft
from pdserve.perf.fitted import PerfModel
from pdserve.perf.in_situ import control_latency
from pdserve.perf.step_log import PERF_MODEL_FILE, read_role_log, read_timed_steps
from pdserve.sim.runner import Experiment
from pdserve.types import Request, Role, add_control_latency
from pdserve.workload.workload import Workload


def test_split_joins_by_response_id_and_parts_add_up_to_the_client_ttft():
    client = {0: ("cmpl-5", 10.00, 10.30), 1: ("cmpl-6", 11.00, 11.50),
              2: ("cmpl-99", 12.0, 12.1), 3: ("", 13.0, 13.2)}  # 99 unknown, 3 no id
    driver = {5: (10.02, 10.25, 10.27), 6: (11.01, 11.40, 11.45)}
    split = split_ttft(client, driver)
    assert split["in"] == pytest.approx([0.02, 0.01])
    assert split["worker"] == pytest.approx([0.23, 0.39])
    assert split["out"] == pytest.approx([0.05, 0.10])
    for i, (_, sent, first) in enumerate(list(client.values())[:2]):
        assert split["in"][i] + split["worker"][i] + split["out"][i] == pytest.approx(
            first - sent)


def test_control_latency_moves_output_times_not_tpot():
    request = Request(0, 1.0, 10, 5)
    request.first_token_s, request.finish_s = 1.5, 2.5
    request.decode_first_token_s, request.last_token_s = 1.7, 2.5
    add_control_latency([request], 0.25)
    assert (request.first_token_s, request.finish_s) == (1.75, 2.75)
    assert (request.decode_first_token_s, request.last_token_s) == (1.95, 2.75)
    assert request.arrival_s == 1.0


def test_simulated_ttft_grows_by_exactly_the_control_latency():
    config = Config().with_values({"workload.trace": "synthetic",
                                   "workload.synthetic_requests": 40,
                                   "workload.synthetic_rate_rps": 4.0, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 1, "perf.gpu": "a100"})
    plain = Experiment.from_config(config).simulate()
    later = Experiment.from_config(config.with_values({"sim.control_latency_s": 0.05})).simulate()
    for a, b in zip(plain.requests, later.requests, strict=True):
        assert b.first_token_s - b.arrival_s == pytest.approx(a.first_token_s - a.arrival_s
                                                              + 0.05)
        assert b.finish_s - b.first_token_s == pytest.approx(a.finish_s - a.first_token_s)


def test_a_live_server_logs_each_requests_timeline_on_one_clock(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    monkeypatch.setenv("PDSERVE_STEP_LOG", str(logs))
    workload = Workload("four", np.arange(4) * 0.05, np.full(4, 24), np.full(4, 6))
    began_s = time.monotonic()
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 1}) as (base, _):
        client: ClientTimeline = {}
        requests = asyncio.run(replay(base, workload, "tiny", 60, timeline=client))
    ended_s = time.monotonic()
    assert all(r.finished for r in requests)
    driver = read_timeline(logs)
    assert len(driver) == 4 and len(client) == 4
    for admitted, batch_end, received in driver.values():
        assert admitted <= batch_end <= received
    split = split_ttft(client, driver)
    assert len(split["worker"]) == 4
    assert all(part >= 0 for values in split.values() for part in values)
    for request in requests:
        assert not math.isnan(request.first_token_s)
    # the roles it started with, on the same clock, and every batch's start on it too
    roles = read_role_log(logs)
    assert [changes[0][1] for _, changes in sorted(roles.items())] == [Role.PREFILL,
                                                                        Role.DECODE]
    assert all(began_s <= changes[0][0] <= ended_s for changes in roles.values())
    starts = [start for path in logs.glob("steps-*.csv") for _, start in read_timed_steps(path)]
    assert starts and all(began_s <= start <= ended_s for start in starts)
    # the server's side, without the client's clock: each request's control plane's latency
    # (receipt -> admission + batch end -> first text sent) is within what the client saw
    # outside the worker part, and the model the driver ran on is there for a fit
    control = control_latency(logs)
    assert control is not None and control.requests == 4
    outside = [a + b for a, b in zip(split["in"], split["out"], strict=True)]
    assert 0 < control.median_s <= max(outside)
    assert PerfModel.load(logs / PERF_MODEL_FILE).kv_capacity_tokens > 0
