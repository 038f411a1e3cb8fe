"""Metric definitions on hand-computed cases, and the goodput search."""

from __future__ import annotations

import math

import pytest

from pdserve.metrics.goodput import search_goodput
from pdserve.metrics.report import format_goodput
from pdserve.metrics.summary import Summary, summarize, tpot_s, ttft_s
from pdserve.types import SLO, Request


def done(request_id, arrival, first, finish, n_out) -> Request:
    request = Request(request_id, arrival, 100, n_out, first_token_s=first, finish_s=finish)
    request.generated_tokens = n_out
    return request


def test_ttft_and_tpot_definitions():
    request = done(0, 1.0, 1.5, 3.5, 5)
    assert ttft_s(request) == pytest.approx(0.5)
    assert tpot_s(request) == pytest.approx((3.5 - 1.5) / 4)
    assert tpot_s(done(1, 0.0, 0.2, 0.2, 1)) == 0.0  # one token: no inter-token time


def test_summary_on_a_hand_computed_case():
    slo = SLO(ttft_s=1.0, tpot_s=0.1)
    requests = [
        done(0, 0.0, 0.5, 1.3, 9),   # ttft 0.5, tpot 0.1   -> meets both
        done(1, 1.0, 2.5, 2.9, 5),   # ttft 1.5, tpot 0.1   -> misses TTFT
        done(2, 2.0, 2.2, 4.2, 11),  # ttft 0.2, tpot 0.2   -> misses TPOT
        done(3, 3.0, 3.1, 3.1, 1),   # ttft 0.1, tpot 0     -> meets both
        Request(4, 4.0, 100, 10, rejected_reason="too long"),
    ]
    summary = summarize(requests, slo)
    assert (summary.requests, summary.completed, summary.rejected) == (5, 4, 1)
    assert summary.slo_attainment == pytest.approx(2 / 5)
    assert summary.ttft_attainment == pytest.approx(3 / 5)
    assert summary.tpot_attainment == pytest.approx(3 / 5)
    assert summary.ttft_s.p50 == pytest.approx(0.35)
    assert summary.ttft_s.mean == pytest.approx((0.5 + 1.5 + 0.2 + 0.1) / 4)
    assert summary.e2e_s.p50 == pytest.approx((1.3 + 1.9) / 2)
    # four completions, first arrival 0 to last finish 4.2
    assert summary.throughput_rps == pytest.approx(4 / 4.2)
    assert summary.output_tokens_per_s == pytest.approx((9 + 5 + 11 + 1) / 4.2)


def test_summary_of_nothing_completed_is_nan_not_an_error():
    summary = summarize([Request(0, 0.0, 10, 10)], SLO(1, 1))
    assert summary.completed == 0 and summary.slo_attainment == 0
    assert math.isnan(summary.ttft_s.p99)


def fake_summary(attainment: float) -> Summary:
    real = summarize([done(0, 0.0, 0.1, 0.2, 2)], SLO(1, 1))
    return Summary(**{**real.__dict__, "slo_attainment": attainment})


def test_goodput_bisects_to_the_threshold():
    calls = []

    def run(scale: float) -> Summary:
        calls.append(scale)
        return fake_summary(1.0 if scale <= 3.3 else 0.5)

    result = search_goodput(run, base_rate_rps=2.0, target_attainment=0.9, rel_tol=0.01)
    assert 3.3 / 1.01 <= result.rate_scale <= 3.3
    assert result.rate_rps == pytest.approx(2.0 * result.rate_scale)
    assert len(calls) == len(set(calls)) < 20
    assert [p.rate_scale for p in result.points] == sorted(calls)


def test_goodput_below_one_and_zero():
    low = search_goodput(lambda s: fake_summary(1.0 if s <= 0.3 else 0.0), 1.0, 0.9, 0.01)
    assert 0.3 / 1.01 <= low.rate_scale <= 0.3
    never = search_goodput(lambda s: fake_summary(0.0), 1.0, 0.9, 0.02, max_doublings=3)
    assert never.rate_scale == 0.0
    assert not low.ceiling_reached and not never.ceiling_reached
    assert "below rate scale 0.125 = 0.12 req/s" in format_goodput(never)
    assert never.rate_text == "< 0.12 req/s" and low.rate_text == f"{low.rate_rps:.2f} req/s"


def test_goodput_search_goes_no_lower_than_its_floor():
    """`Experiment.goodput` sets the floor where a run would pass the simulator's tick
    limit: an unreachable SLO ended in that limit's error instead of "below"."""
    tried = []

    def run(scale: float) -> Summary:
        tried.append(scale)
        return fake_summary(0.0)

    result = search_goodput(run, 1.0, 0.9, 0.01, min_scale=0.1)
    assert tried == [1.0, 0.5, 0.25, 0.125] and result.rate_scale == 0.0
    assert "goodput: below rate scale 0.125" in format_goodput(result)


def test_goodput_that_reaches_the_search_ceiling_is_reported_as_a_lower_bound():
    """SLOs that never bind (infinite, or a workload far below capacity): every scale up to
    the ceiling passes, and the report says "at least", not a goodput."""
    always = search_goodput(lambda s: fake_summary(1.0), 2.0, 0.9, 0.01, max_doublings=4)
    assert always.ceiling_reached and always.rate_scale == 16.0 and always.rate_rps == 32.0
    assert "goodput: at least rate scale 16.000 = 32.00 req/s" in format_goodput(always)
    assert always.rate_text == ">= 32.00 req/s"
    bracketed = search_goodput(lambda s: fake_summary(1.0 if s <= 9 else 0.0), 2.0, 0.9, 0.01,
                               max_doublings=4)
    assert not bracketed.ceiling_reached and 9 / 1.01 <= bracketed.rate_scale <= 9
    assert "at least" not in format_goodput(bracketed)
