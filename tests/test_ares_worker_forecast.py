"""A live worker's side of ARES without processes: the forecast it reports with its stats,
the hidden states it passes to a predictor, and what it learns from finished requests."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from conftest import local_scheduler

from pdserve.instance.decode_forecast import ForecastSettings
from pdserve.instance.length_predictor import PREDICTOR_FACTORIES, DecodeProgress
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.stats import InstanceStats
from pdserve.types import Request
from pdserve.worker.forecast import WorkerForecast


class HiddenProbe:
    """A predictor that answers with the first component of the hidden state it is given."""

    name = "hidden-probe"

    def __init__(self) -> None:
        self.seen: list[DecodeProgress] = []

    def predict(self, decodes: Sequence[DecodeProgress]) -> list[float]:
        self.seen += decodes
        return [float(d.hidden_state[0]) if d.hidden_state is not None else -1.0
                for d in decodes]

    def observe_finished(self, prompt_tokens: int, output_tokens: int) -> None:
        return None


class FakeEngine:
    def __init__(self) -> None:
        self.pending: dict[int, np.ndarray] = {}

    def take_hidden_states(self) -> dict[int, np.ndarray]:
        taken, self.pending = self.pending, {}
        return taken


def running(local: LocalScheduler, request: Request) -> None:
    local.running[request.request_id] = request
    local.running_tokens += request.sequence_tokens


def test_worker_reports_its_forecast_with_hidden_states_from_the_engine() -> None:
    probe = HiddenProbe()
    PREDICTOR_FACTORIES["hidden-probe"] = lambda options, seed: probe
    try:
        local, engine = local_scheduler(0, 100, 64), FakeEngine()
        forecast = WorkerForecast.build(ForecastSettings(predictor="hidden-probe",
                                                         horizon_steps=100, points=2),
                                        engine, local)  # type: ignore[arg-type]
        assert forecast is not None
        request = Request(9, 0.0, 30, 200)  # a live request: output_tokens is max_tokens
        request.generated_tokens = 25
        running(local, request)
        engine.pending = {9: np.array([123.0, 0.5])}
        stats = InstanceStats.of(local, forecast.report())
        assert stats.decode_forecast is not None
        (entry,) = stats.decode_forecast.requests
        assert (entry.request_id, entry.tokens, entry.remaining_tokens) == (9, 55, 123.0)
        seen = probe.seen[-1]
        assert seen.true_remaining_tokens is None and seen.max_output_tokens == 200
        assert stats == InstanceStats.of(local, forecast.report())  # unchanged: equal
    finally:
        del PREDICTOR_FACTORIES["hidden-probe"]


def test_history_on_a_worker_learns_from_its_finished_requests() -> None:
    local = local_scheduler(0, 100, 64)
    forecast = WorkerForecast.build(ForecastSettings(predictor="history:min=1"),
                                    FakeEngine(), local)  # type: ignore[arg-type]
    assert forecast is not None
    done = Request(1, 0.0, 10, 500)
    done.generated_tokens = 80  # stopped early (EOS) at 80 of max_tokens 500
    forecast.after_step([done])
    request = Request(2, 0.0, 10, 500)
    request.generated_tokens = 20
    running(local, request)
    (entry,) = forecast.report().requests
    assert entry.remaining_tokens == 60.0
    del local.running[2]  # moved away: its prediction is forgotten at the next report
    local.running_tokens = 0
    assert forecast.report().requests == () and forecast.tracker.tracked == 0


def test_stats_without_ares_carry_no_forecast() -> None:
    assert InstanceStats.of(local_scheduler(0, 100, 64)).decode_forecast is None
