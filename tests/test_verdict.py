"""The verdict harness (`pdserve.planning.verdict`): the interval maths, win / tie / loss, the
stationarity retry, and a tiny comparison whose winner is known by construction."""

from __future__ import annotations

import json
import math

import pytest

from pdserve.config import Config
from pdserve.planning.multi_fidelity import SearchBudget
from pdserve.planning.outcome import Interval
from pdserve.planning.run_length import Fidelity
from pdserve.planning.verdict import (
    LOSS,
    TIE,
    WIN,
    Comparison,
    Contender,
    Measurement,
    VerdictRun,
    format_verdict,
    outcome_of,
    stationary_goodput,
    verdict_json,
)

T_975_2DOF = 4.302652729911275  # Student t, 97.5 % quantile, 2 degrees of freedom
T_975_4DOF = 2.7764451051977987


def test_interval_is_the_student_t_95_percent_interval() -> None:
    interval = Interval.of([3.0, 4.0, 5.0])
    half = T_975_2DOF * 1.0 / math.sqrt(3)  # sample standard deviation 1
    assert interval.mean == pytest.approx(4.0)
    assert (interval.low, interval.high) == pytest.approx((4.0 - half, 4.0 + half))
    assert interval.samples == 3
    values = [10.0, 12.0, 11.0, 13.0, 9.0]  # mean 11, sd sqrt(2.5)
    interval = Interval.of(values)
    half = T_975_4DOF * math.sqrt(2.5) / math.sqrt(5)
    assert (interval.low, interval.high) == pytest.approx((11 - half, 11 + half))


def test_interval_top_widens_by_the_search_resolution() -> None:
    """Three seeds on the same step of a 1 % search: the true goodput lies up to 1 % above."""
    interval = Interval.of([5.0, 5.0, 5.0], resolution=0.01)
    assert (interval.low, interval.mean, interval.high) == pytest.approx((5.0, 5.0, 5.05))


def test_outcome_is_a_win_or_a_loss_only_when_the_intervals_separate() -> None:
    high, low = Interval(10.0, 9.5, 10.5, 3), Interval(8.0, 7.5, 8.5, 3)
    assert outcome_of(high, low) == WIN
    assert outcome_of(low, high) == LOSS
    overlapping = Interval(9.0, 8.4, 9.6, 3)
    assert outcome_of(high, overlapping) == TIE and outcome_of(overlapping, high) == TIE
    touching = Interval(9.0, 8.5, 9.5, 3)
    assert outcome_of(high, touching) == TIE  # 9.5 is in both
    wide = Interval(9.0, 2.0, 16.0, 3)  # a large mean gap, but noisy: a tie
    assert outcome_of(Interval(12.0, 11.9, 12.1, 3), wide) == TIE


def test_stationarity_doubles_until_a_doubling_moves_goodput_less_than_the_tolerance() -> None:
    by_factor = {1: 10.0, 2: 12.0, 4: 12.2, 8: 12.2}  # a 20 % move, then 1.7 %
    asked: list[tuple[int, float]] = []

    def goodput_at(factor: int, guess: float) -> float:
        asked.append((factor, guess))
        return by_factor[factor]

    found = stationary_goodput(goodput_at, 0.03, 3)
    assert found.stationary and found.factor == 4 and found.goodput_rps == 12.2
    assert found.history == (10.0, 12.0, 12.2)
    assert asked == [(1, 0.0), (2, 10.0), (4, 12.0)]  # each run starts at the shorter one's


def test_stationarity_gives_up_at_the_cap_and_says_so() -> None:
    found = stationary_goodput(lambda factor, guess: 10.0 * (1 + 1 / factor), 0.03, 3)
    assert not found.stationary and found.factor == 8
    assert found.history == pytest.approx((20.0, 15.0, 12.5, 11.25))
    settled = stationary_goodput(lambda factor, guess: 7.0, 0.03, 3)
    assert settled.stationary and settled.factor == 2 and len(settled.history) == 2
    nothing = stationary_goodput(lambda factor, guess: 0.0, 0.03, 3)
    assert nothing.stationary and nothing.goodput_rps == 0.0


def test_measurement_refuses_fewer_than_3_seeds_or_a_coarse_search() -> None:
    with pytest.raises(ValueError, match="3 seeds"):
        Measurement(seeds=2)
    with pytest.raises(ValueError, match="1 %"):
        Measurement(rel_tol=0.04)
    assert Measurement().fidelity(4).min_requests == 4 * Measurement().min_requests


# 16-token prompts, 128 output tokens, a 20 ms TPOT SLO on 2 H800s: the prefill work is
# nothing, so a GPU given to prefill alone idles and static-pd's 1P1D halves the decode
# capacity that colocated's two instances have (the planner's known optimum, test_plan.py)
DECODE_HEAVY = Config().with_values({
    "workload.trace": "synthetic", "workload.synthetic_lengths": "fixed:16:128",
    "workload.synthetic_requests": 100_000, "workload.synthetic_rate_rps": 10.0,
    "perf.model": "llama-3.1-8b", "perf.gpu": "h800", "perf.tp": 1,
    "slo.ttft_s": 2.0, "slo.tpot_s": 0.02})
TINY = SearchBudget(30.0, 1, 1, 1, 1, Fidelity("short", 2.0, 50, 0.1, 1.2),
                    Fidelity("long", 2.0, 50, 0.1, 1.2))


def test_a_comparison_tunes_each_contender_and_calls_the_known_winner() -> None:
    comparison = Comparison(
        "decode-heavy", DECODE_HEAVY, 2,
        (Contender("colocated", "colocated"), Contender("static-pd", "static-pd")), TINY,
        Measurement(seeds=3, duration_s=1.0, min_requests=50, lifetimes=0.0,
                    max_doublings=1))
    result = VerdictRun(comparison).run()
    colocated, static = result.contenders
    assert colocated.deployment.startswith("2xM TP1")  # the search's best: both instances mixed
    assert static.deployment.startswith("1xP TP1") and "1xD TP1" in static.deployment
    for contender in result.contenders:
        assert [s.seed for s in contender.seeds] == [0, 1, 2]
        assert all(s.goodput_rps > 0 and len(s.history) == 2 for s in contender.seeds)
        assert contender.goodput.low <= contender.goodput.mean < contender.goodput.high
    assert colocated.goodput.mean > 1.6 * static.goodput.mean  # about twice
    # 100,000 synthetic requests: no run ran out of them, although the shorter run's higher
    # goodput replayed more requests than the doubled one
    assert not any(s.capped for c in result.contenders for s in c.seeds)
    (outcome,) = result.outcomes
    assert outcome.against == "static-pd" and outcome.result == WIN
    text = format_verdict(result)
    assert "colocated vs static-pd" in text and "WIN" in text and "+-" in text
    record = json.loads(json.dumps(verdict_json(result)))
    assert record["outcomes"][0]["result"] == WIN
    assert len(record["contenders"][0]["seeds"]) == 3


def test_a_run_longer_than_its_trace_replays_the_trace_and_the_seeds_see_other_windows() -> None:
    from pdserve.planning.fidelity import WorkloadSamples
    base = Config().with_values({"workload.trace": "azure-code"})
    samples = WorkloadSamples(base, 3)
    long = Fidelity("long", 60.0, 50, 0.01)
    within = samples.values(long, 0, 4000)  # shorter than the trace: a window of it
    assert "workload.repeat" not in within and within["workload.max_requests"] == 4000
    count = 12_000  # longer than the trace's 8,819 requests: replayed 3 times (>= 2 x 12,000)
    windows = [samples.workload(long, seed, count) for seed in range(3)]
    assert [samples.values(long, seed, count)["workload.repeat"] for seed in range(3)] == [3] * 3
    assert all(len(w) == count for w in windows)
    firsts = [samples.values(long, seed, count)["workload.start_s"] for seed in range(3)]
    assert firsts[0] < firsts[1] < firsts[2]  # three windows, not the whole trace three times
    assert all(w.mean_rate_rps == pytest.approx(samples.full.mean_rate_rps, rel=0.25)
               for w in windows)
    # a base that fixes its own window replays that window whole, as before
    fixed = WorkloadSamples(base.with_values({"workload.max_requests": 1000}), 3)
    assert fixed.values(long, 0, 12_000) == {}


def test_a_run_its_workload_cannot_fill_is_flagged() -> None:
    capped = DECODE_HEAVY.with_values({"workload.synthetic_requests": 60,
                                       "policy.name": "colocated", "cluster.instances": 2})
    comparison = Comparison(
        "capped", capped, 2, (Contender("colocated", "colocated", (("policy.name", "colocated"),)),
                              Contender("static-pd", "static-pd", (("policy.name", "static-pd"),
                                                                   ("cluster.prefill", 1),
                                                                   ("cluster.decode", 1)))),
        TINY, Measurement(seeds=3, duration_s=1.0, min_requests=50, lifetimes=0.0,
                          max_doublings=1), tune=False)
    result = VerdictRun(comparison).run()
    for contender in result.contenders:  # each run asks for >= 100 requests, 60 exist
        assert all(s.capped and s.requests == 60 for s in contender.seeds)
    assert "workload ran out" in format_verdict(result)
