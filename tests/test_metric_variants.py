"""The papers' metric variants from the same request records, on hand-computed cases."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from pdserve.metrics.report import format_summary, write_requests_csv, write_summary_json
from pdserve.metrics.summary import (
    summarize,
    tpot_from_decode_s,
    tpot_s,
    ttft_s,
    ttft_with_decode_queue_s,
)
from pdserve.types import SLO, Request


def handed_off() -> Request:
    """Prefilled by 0.5 s (token 1), KV moved and queued, its decode instance emits tokens 2,
    3, 4 at 0.8, 0.9 and 1.2."""
    request = Request(0, 0.0, 100, 4, first_token_s=0.5)
    for time_s in (0.8, 0.9, 1.2):
        request.record_decode_tokens(time_s, time_s)
    request.finish_s, request.generated_tokens = 1.2, 4
    return request


def in_place() -> Request:
    """Prefilled at 1.2 s where it then decodes: tokens 2 and 3 at 1.3 and 1.5."""
    request = Request(1, 1.0, 100, 3, first_token_s=1.2)
    request.decode_in_place()
    request.record_decode_tokens(1.3, 1.3)
    request.record_decode_tokens(1.5, 1.5)
    request.finish_s, request.generated_tokens = 1.5, 3
    return request


def one_token() -> Request:
    request = Request(2, 2.0, 100, 1, first_token_s=2.1, finish_s=2.1)
    request.generated_tokens = 1
    return request


def test_token_records():
    a, b = handed_off(), in_place()
    assert (a.decode_first_token_s, a.last_token_s) == (0.8, 1.2)
    assert a.max_itl_s == pytest.approx(0.3)  # 0.9 -> 1.2; the hand-off 0.5 -> 0.8 is not ITL
    assert (b.decode_first_token_s, b.max_itl_s) == (1.2, pytest.approx(0.2))
    # a span of steps: first token at 3.0, last at 4.0, its widest inner gap 0.4
    c = Request(3, 0.0, 10, 10, first_token_s=1.0)
    c.record_decode_tokens(2.5, 2.5)
    c.record_decode_tokens(3.0, 4.0, 0.4)
    assert (c.max_itl_s, c.last_token_s) == (pytest.approx(0.5), 4.0)
    c.record_decode_tokens(4.1, 4.3, 0.7)
    assert c.max_itl_s == pytest.approx(0.7)


def test_per_request_variants():
    a, b, c = handed_off(), in_place(), one_token()
    assert ttft_s(a) == 0.5 and ttft_with_decode_queue_s(a) == 0.8
    assert tpot_s(a) == pytest.approx(0.7 / 3)
    assert tpot_from_decode_s(a) == pytest.approx(0.4 / 2)  # tokens 2..4: two gaps
    assert ttft_with_decode_queue_s(b) == ttft_s(b) == pytest.approx(0.2)
    assert tpot_from_decode_s(b) == tpot_s(b) == pytest.approx(0.15)
    assert ttft_with_decode_queue_s(c) == pytest.approx(0.1)  # never decoded: its TTFT
    assert tpot_from_decode_s(c) == 0.0


def test_summary_of_the_variants():
    requests = [handed_off(), in_place(), one_token(),
                Request(3, 1.5, 100, 10, rejected_reason="too long")]
    summary = summarize(requests, SLO(ttft_s=1.0, tpot_s=0.2))
    # standard: a misses TPOT (0.233); b and c meet both; the rejected one misses
    assert summary.slo_attainment == pytest.approx(2 / 4)
    # TaiChi: a's TTFT 0.8 <= 1 and TPOT 0.2 <= 0.2 -> met
    assert summary.slo_attainment_with_decode_queue == pytest.approx(3 / 4)
    assert summary.ttft_with_decode_queue_s.mean == pytest.approx((0.8 + 0.2 + 0.1) / 3)
    assert summary.tpot_from_decode_s.p50 == pytest.approx(0.15)
    # ITL over all gaps: (0.7 + 0.3 + 0) / (3 + 2 + 0)
    assert summary.itl_mean_s == pytest.approx(0.2)
    assert summary.itl_max_s.mean == pytest.approx((0.3 + 0.2 + 0.0) / 3)
    assert summary.itl_max_s.p50 == pytest.approx(0.2)
    # window: first arrival 0 to last finish 2.1
    assert summary.duration_s == pytest.approx(2.1)
    assert summary.goodput_rps == pytest.approx(2 / 2.1)  # ARES: SLO-meeting req/s
    assert summary.throughput_rps == pytest.approx(3 / 2.1)
    assert summary.output_tokens_per_s == pytest.approx(8 / 2.1)
    assert summary.total_tokens_per_s == pytest.approx((300 + 8) / 2.1)
    assert summary.e2e_s.p50 == pytest.approx(0.5)  # e2e 1.2, 0.5, 0.1


def test_no_gaps_is_nan_not_an_error():
    summary = summarize([one_token()], SLO(1, 1))
    assert math.isnan(summary.itl_mean_s) and summary.itl_max_s.p50 == 0.0
    assert summary.goodput_rps == pytest.approx(1 / 0.1)  # one met in a 0.1 s window


def test_report_names_each_variant_and_json_defines_them(tmp_path: Path):
    slo = SLO(1.0, 0.2)
    summary = summarize([handed_off(), in_place(), one_token()], slo)
    text = format_summary(summary, slo)
    for name in ("TTFT+decode queue s (TaiChi)", "max ITL s (AMPD)", "goodput (ARES)",
                 "E2E s (FlowKV)", "mean ITL over all token gaps (AMPD): 0.2000 s"):
        assert name in text
    write_summary_json(tmp_path / "summary.json", summary, {}, None, {})
    document = json.loads((tmp_path / "summary.json").read_text())
    assert document["summary"]["goodput_rps"] == pytest.approx(2 / 2.1)  # a misses TPOT
    assert set(document["metric_definitions"]) <= set(document["summary"])
    assert "ARES" in document["metric_definitions"]["goodput_rps"]
    write_requests_csv(tmp_path / "requests.csv", [handed_off()], slo)
    row = list(csv.DictReader((tmp_path / "requests.csv").open()))[0]
    assert (row["ttft_with_decode_queue_s"], row["tpot_from_decode_s"], row["max_itl_s"]) == \
        ("0.800000", "0.200000", "0.300000")
