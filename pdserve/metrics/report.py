"""Reports of a run: a text table, a JSON summary and a per-request CSV.

Used for simulated runs (`pdserve simulate`) and live ones alike, from `Request` records.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pdserve.metrics.goodput import GoodputResult
from pdserve.metrics.summary import (
    Summary,
    e2e_s,
    interference_intensity,
    meets_slo,
    tpot_from_decode_s,
    tpot_s,
    ttft_s,
    ttft_with_decode_queue_s,
)
from pdserve.types import SLO, Request

METRIC_DEFINITIONS: dict[str, str] = {
    "ttft_s": "first token time - arrival, all queueing included (DistServe, Arrow)",
    "tpot_s": "(last token - first token) / (n - 1) (DistServe, Arrow, TaiChi)",
    "e2e_s": "last token time - arrival (FlowKV)",
    "slo_attainment": "share of all requests meeting both the TTFT and the TPOT target (TaiChi's "
                      "TTFT and TPOT with slo.counts_decode_queue)",
    "ttft_with_decode_queue_s": "the decode instance's first token time - arrival: KV "
                                "transfer and the wait for a decode slot included (TaiChi)",
    "tpot_from_decode_s": "mean gap between the decode instance's tokens (TaiChi)",
    "slo_attainment_with_decode_queue": "share of all requests meeting both targets with "
                                        "TaiChi's TTFT and TPOT",
    "itl_mean_s": "mean inter-token gap over every gap of every completed request (AMPD)",
    "itl_max_s": "percentiles over requests of each one's widest inter-token gap on its "
                 "decode instance (AMPD)",
    "goodput_rps": "SLO-meeting requests per second at the run's rate (ARES)",
    "throughput_rps": "completed requests per second, first arrival to last finish (ARES, "
                      "FlowKV)",
    "output_tokens_per_s": "output tokens of completed requests per second (FlowKV)",
    "total_tokens_per_s": "input + output tokens of completed requests per second (FlowKV)",
    "interference_intensity": "prefill tokens co-batched with a request's decode steps / its "
                              "output tokens, over completed requests (TaiChi)",
}


def format_summary(summary: Summary, slo: SLO, title: str = "") -> str:
    lines = [title] if title else []
    lines.append(f"requests {summary.requests}  completed {summary.completed}  "
                 f"rejected {summary.rejected}  preemptions {summary.preemptions}")
    lines.append(f"{'metric':<30}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name, stats in (("TTFT s", summary.ttft_s), ("TPOT s", summary.tpot_s),
                        ("E2E s (FlowKV)", summary.e2e_s),
                        ("TTFT+decode queue s (TaiChi)", summary.ttft_with_decode_queue_s),
                        ("TPOT on decode s (TaiChi)", summary.tpot_from_decode_s),
                        ("max ITL s (AMPD)", summary.itl_max_s),
                        ("interference (TaiChi)", summary.interference_intensity)):
        lines.append(f"{name:<30}{stats.mean:>10.4f}{stats.p50:>10.4f}{stats.p90:>10.4f}"
                     f"{stats.p99:>10.4f}")
    lines.append(f"mean ITL over all token gaps (AMPD): {summary.itl_mean_s:.4f} s")
    on = " on TaiChi's TTFT and TPOT" if slo.counts_decode_queue else ""
    lines.append(f"SLO attainment{on} {summary.slo_attainment:.1%} (TTFT <= {slo.ttft_s:g}s: "
                 f"{summary.ttft_attainment:.1%}, TPOT <= {slo.tpot_s:g}s: "
                 f"{summary.tpot_attainment:.1%}); with TaiChi's TTFT and TPOT "
                 f"{summary.slo_attainment_with_decode_queue:.1%}")
    lines.append(f"goodput (ARES) {summary.goodput_rps:.2f} SLO-meeting req/s at this rate")
    lines.append(f"throughput (ARES, FlowKV) {summary.throughput_rps:.2f} req/s, "
                 f"{summary.output_tokens_per_s:.0f} output tok/s, "
                 f"{summary.total_tokens_per_s:.0f} input+output tok/s over "
                 f"{summary.duration_s:.1f}s")
    return "\n".join(lines)


def format_goodput(goodput: GoodputResult) -> str:
    lines = [f"{'rate scale':>10}{'rate req/s':>12}{'attainment':>12}"]
    for point in goodput.points:
        lines.append(f"{point.rate_scale:>10.3f}{point.rate_rps:>12.2f}"
                     f"{point.summary.slo_attainment:>12.1%}"
                     + ("  (stopped once decided: a bound)" if point.decided_early else ""))
    target = f"{goodput.target_attainment:.0%} SLO attainment"
    if goodput.ceiling_reached:
        lines.append(f"goodput: at least rate scale {goodput.rate_scale:.3f} = "
                     f"{goodput.rate_rps:.2f} req/s: every rate tried, up to the search's "
                     f"ceiling, met {target}; the SLOs do not bound this workload's rate here")
    elif goodput.rate_scale == 0 and goodput.points:
        lowest = goodput.points[0]
        lines.append(f"goodput: below rate scale {lowest.rate_scale:.3f} = "
                     f"{lowest.rate_rps:.2f} req/s: even the lowest rate tried missed {target}")
    else:
        lines.append(f"goodput: rate scale {goodput.rate_scale:.3f} = {goodput.rate_rps:.2f} "
                     f"req/s at >= {target} (DistServe, Arrow, TaiChi)")
    return "\n".join(lines)


def _clean(value: Any) -> Any:
    """JSON has no NaN: write null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_summary_json(path: Path, summary: Summary, config: dict[str, Any],
                       goodput: GoodputResult | None, extra: dict[str, Any]) -> None:
    document: dict[str, Any] = {"config": config, "summary": asdict(summary),
                                "metric_definitions": METRIC_DEFINITIONS, **extra}
    if goodput is not None:
        document["goodput"] = {
            "definition": "the highest rate scale with SLO attainment >= target_attainment "
                          "(DistServe, Arrow, TaiChi)",
            "target_attainment": goodput.target_attainment,
            "rate_scale": goodput.rate_scale, "rate_rps": goodput.rate_rps,
            "ceiling_reached": goodput.ceiling_reached,
            "points": [{"rate_scale": p.rate_scale, "rate_rps": p.rate_rps,
                        "slo_attainment": p.summary.slo_attainment,
                        "ttft_p90_s": p.summary.ttft_s.p90, "tpot_p90_s": p.summary.tpot_s.p90,
                        "stopped_when_decided": p.decided_early}
                       for p in goodput.points]}
    path.write_text(json.dumps(_clean(document), indent=2) + "\n")


def write_requests_csv(path: Path, requests: Sequence[Request], slo: SLO) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["request_id", "arrival_s", "input_tokens", "output_tokens",
                         "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "slo_met",
                         "prefill_instance", "decode_instance", "transfer_s", "preemptions",
                         "rejected_reason", "ttft_with_decode_queue_s", "tpot_from_decode_s",
                         "max_itl_s", "interference_intensity"])
        for r in requests:
            done = r.finished
            writer.writerow([
                r.request_id, f"{r.arrival_s:.6f}", r.input_tokens, r.output_tokens,
                f"{r.first_token_s:.6f}" if done else "", f"{r.finish_s:.6f}" if done else "",
                f"{ttft_s(r):.6f}" if done else "", f"{tpot_s(r):.6f}" if done else "",
                f"{e2e_s(r):.6f}" if done else "",
                int(meets_slo(r, slo)),
                r.prefill_instance, r.decode_instance, f"{r.transfer_s:.6f}", r.preemptions,
                r.rejected_reason,
                f"{ttft_with_decode_queue_s(r):.6f}" if done else "",
                f"{tpot_from_decode_s(r):.6f}" if done else "",
                f"{r.max_itl_s:.6f}" if done else "",
                f"{interference_intensity(r):.4f}" if done else ""])
