"""ARES's model-free remaining-length predictors and the instance-side tracker."""

from __future__ import annotations

import numpy as np
import pytest

from pdserve.instance.decode_forecast import DecodeLoadTracker, ForecastSettings
from pdserve.instance.length_predictor import DecodeProgress, make_predictor
from pdserve.types import Request


def progress(i: int, generated: int, true_remaining: int | None, prompt: int = 100,
             cap: int = 10**7) -> DecodeProgress:
    return DecodeProgress(i, prompt, generated, cap, true_remaining)


def test_oracle_is_the_true_remaining_length_within_the_cap() -> None:
    oracle = make_predictor("oracle")
    assert oracle.predict([progress(1, 10, 500), progress(2, 10, 500, cap=200)]) == [500, 190]
    with pytest.raises(ValueError, match="only the simulator knows"):
        oracle.predict([progress(3, 10, None)])


@pytest.mark.parametrize("generated, expected_mae", [(0, 300.0), (2000, 150.0),
                                                      (6000, 75.0)])
def test_noisy_mae_is_its_parameter_and_shrinks_with_generation(generated: int,
                                                                expected_mae: float) -> None:
    noisy = make_predictor("noisy:mae=300", seed=4)
    truth = 50_000
    predicted = np.array(noisy.predict([progress(i, generated, truth)
                                        for i in range(20_000)]))
    mae = float(np.mean(np.abs(predicted - truth)))
    assert mae == pytest.approx(expected_mae, rel=0.04)
    assert abs(float(np.mean(predicted - truth))) < 0.05 * expected_mae  # unbiased


def test_noisy_is_seeded_and_order_independent() -> None:
    decodes = [progress(i, 40, 1000) for i in range(50)]
    a = make_predictor("noisy:mae=100", seed=1).predict(decodes)
    b = make_predictor("noisy:mae=100", seed=1).predict(decodes[::-1])[::-1]
    c = make_predictor("noisy:mae=100", seed=2).predict(decodes)
    assert a == b and a != c
    with pytest.raises(ValueError, match="noisy:mae"):
        make_predictor("noisy")


def test_history_learns_a_known_conditional_distribution() -> None:
    rng = np.random.default_rng(0)
    history = make_predictor("history:window=20000")
    for _ in range(6000):  # short prompts: uniform 100..300; long prompts: exponential(1000)
        history.observe_finished(20, int(rng.integers(100, 301)))
        history.observe_finished(2000, 1 + int(rng.exponential(1000.0)))
    short0, long0, long1000, short250 = history.predict([
        progress(1, 0, None, prompt=20), progress(2, 0, None, prompt=2000),
        progress(3, 1000, None, prompt=2000), progress(4, 250, None, prompt=20)])
    assert short0 == pytest.approx(200, abs=8)  # median of U(100, 300)
    assert long0 == pytest.approx(1000 * np.log(2), rel=0.06)  # median of Exp(1000)
    # memoryless: after 1000 tokens the median remaining is the same again
    assert long1000 == pytest.approx(1000 * np.log(2), rel=0.1)
    assert short250 == pytest.approx(25, abs=5)  # median of U(250, 300) minus 250


def test_history_falls_back_when_it_has_not_seen_enough() -> None:
    history = make_predictor("history")
    assert history.predict([progress(1, 300, None, cap=1000)]) == [300.0]  # nothing seen
    for length in range(100, 200):
        history.observe_finished(20, length)
    # no sample above 500 generated tokens: as many more tokens as so far, within the cap
    assert history.predict([progress(2, 500, None, cap=800)]) == [300.0]
    # a prompt bucket with no data of its own uses every bucket
    assert history.predict([progress(3, 0, None, prompt=3000)])[0] == pytest.approx(150, abs=2)


def test_unknown_predictor_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="history"):
        make_predictor("psychic")


def test_tracker_refreshes_every_k_tokens_and_counts_down_between() -> None:
    settings = ForecastSettings(predictor="noisy:mae=500", refresh_every_tokens=20,
                                horizon_steps=100, points=2)
    tracker = DecodeLoadTracker(settings)
    request = Request(7, 0.0, 100, 5000)
    first = tracker.forecast(0, [request], ())
    assert tracker.predictions_total == 1
    request.generated_tokens = 19
    second = tracker.forecast(0, [request], ())
    assert tracker.predictions_total == 1  # not yet k tokens: counted down
    assert second.requests[0].remaining_tokens == pytest.approx(
        first.requests[0].remaining_tokens - 19)
    request.generated_tokens = 20
    tracker.forecast(0, [request], ())
    assert tracker.predictions_total == 2


def test_forecast_loads_follow_the_predicted_ends() -> None:
    settings = ForecastSettings(predictor="oracle", horizon_steps=1000, points=4, decay=0.5)
    tracker = DecodeLoadTracker(settings)
    short, long = Request(1, 0.0, 100, 300), Request(2, 0.0, 200, 5000)
    arriving = Request(3, 0.0, 50, 10_000)
    forecast = tracker.forecast(4, [short, long], [arriving])
    assert settings.step_offsets() == (0, 250, 500, 750, 1000)
    # t=0: 100 + 200 + 50; short ends at step 300; the others grow one token per step
    assert forecast.load_tokens == (350, 100 + 250 + 200 + 250 + 50 + 250, 200 + 500 + 550,
                                    200 + 750 + 800, 200 + 1000 + 1050)
    weights = settings.weights()
    assert sum(weights) == pytest.approx(1.0)
    assert weights[0] / weights[1] == pytest.approx(2.0)
    assert forecast.weighted_load == pytest.approx(
        sum(w * n for w, n in zip(weights, forecast.load_tokens, strict=True)))
    assert [r.running for r in forecast.requests] == [True, True, False]


def test_simulated_predictors_do_not_see_the_true_length_as_their_cap() -> None:
    tracker = DecodeLoadTracker(ForecastSettings(predictor="history"))
    request = Request(1, 0.0, 100, 50)
    request.generated_tokens = 40
    # with nothing learned, history predicts as many more as generated: 40, not capped at
    # the trace's true remaining 10 (that would leak the truth to a model-free predictor)
    assert tracker.forecast(0, [request], ()).requests[0].remaining_tokens == 40
