"""Attainment on TaiChi's definitions (`slo.counts_decode_queue`): TTFT until the decode
instance's first token, so the wait for a decode slot counts, and TPOT over that instance's
gaps; the default counts from the prefill's first token."""

from __future__ import annotations

import json
import math

from pdserve.config import Config
from pdserve.metrics.attainment_watch import AttainmentWatch
from pdserve.metrics.summary import meets_slo, summarize
from pdserve.sim.runner import Experiment
from pdserve.types import SLO, Request

PREFILL_SIDE, TAICHI = SLO(2.0, 0.1), SLO(2.0, 0.1, counts_decode_queue=True)


def _handed_off(decode_first_s: float) -> Request:
    """Arrived at 0, prefilled (first token) at 1.0 s, 11 tokens, the last at 3.0 s + the
    decode side's first token delay."""
    request = Request(0, 0.0, 500, 11)
    request.first_token_s = 1.0
    request.record_decode_tokens(decode_first_s, decode_first_s + 0.5)
    request.generated_tokens = 11
    request.finish_s = decode_first_s + 0.5
    return request


def test_a_wait_for_a_decode_slot_counts_only_on_taichis_definition() -> None:
    waited = _handed_off(decode_first_s=2.5)  # 1.5 s in the decode queue, then 0.5 s
    # prefill side: TTFT 1.0 s, TPOT (3.0 - 1.0) / 10 = 0.2 s; TaiChi's: TTFT 2.5 s, TPOT
    # (3.0 - 2.5) / 9 = 0.056 s (the prefill's token is not the decode side's)
    assert meets_slo(waited, SLO(2.0, 0.25))
    assert not meets_slo(waited, SLO(2.0, 0.25, counts_decode_queue=True))
    assert not meets_slo(waited, SLO(3.0, 0.1))
    assert meets_slo(waited, SLO(3.0, 0.1, counts_decode_queue=True))
    quick = _handed_off(decode_first_s=1.05)
    assert meets_slo(quick, TAICHI) and meets_slo(quick, PREFILL_SIDE)  # no wait: both meet


def test_the_watch_judges_a_missing_decode_token_late_on_taichis_definition() -> None:
    requests = [Request(i, float(i), 500, 11) for i in range(4)]
    watch = AttainmentWatch(requests, TAICHI, 0.75, [0.0] * 4)
    for request in requests:
        watch.arrived(request)
    requests[0].first_token_s = 0.5  # prefilled in time, still waiting for a decode slot
    watch.tick(2.5)
    assert watch.missed == 1 and watch.decided is False  # 3 open: 75 % still reachable
    prefill_side = AttainmentWatch(requests, PREFILL_SIDE, 0.75, [0.0] * 4)
    for request in requests:
        prefill_side.arrived(request)
    prefill_side.tick(2.5)
    assert prefill_side.missed == 0  # its first token came in time


def _decode_bound() -> Config:
    """1P1D whose decode instance holds 4 sequences: handed-off requests queue for a slot."""
    return Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_lengths": "fixed:256:128",
        "workload.synthetic_requests": 120, "workload.synthetic_rate_rps": 8.0,
        "policy.name": "static-pd", "cluster.prefill": 1, "cluster.decode": 1,
        "instance.max_batch_size": 4, "perf.model": "llama-3.1-8b", "perf.gpu": "h800",
        "slo.ttft_s": 1.0, "slo.tpot_s": 0.1, "goodput.tolerance": 0.05})


def test_the_decode_queue_lowers_attainment_and_goodput_and_the_early_stop_agrees() -> None:
    base = _decode_bound()
    taichi = base.with_values({"slo.counts_decode_queue": True})
    experiment = Experiment.from_config(base)
    result = experiment.simulate(1.0)
    on_prefill = summarize(result.requests, base.slo.targets())
    on_decode = summarize(result.requests, taichi.slo.targets())
    waits = [r.decode_first_token_s - r.first_token_s for r in result.requests]
    assert max(waits) > 1.0  # requests did wait for a slot
    assert on_decode.slo_attainment < on_prefill.slo_attainment - 0.2
    full = Experiment.from_config(taichi).goodput(stop_when_decided=False)
    stopped = Experiment.from_config(taichi).goodput()
    assert stopped.rate_rps == full.rate_rps
    assert [p.rate_scale for p in stopped.points] == [p.rate_scale for p in full.points]
    assert full.rate_rps < experiment.goodput().rate_rps
    assert not math.isnan(full.rate_rps)


def test_simulate_takes_the_definition_from_its_flag(tmp_path, capsys) -> None:
    import yaml

    from pdserve.cli import main

    args = ["simulate", "--trace", "synthetic", "--synthetic-lengths", "fixed:256:128",
            "--synthetic-requests", "120", "--synthetic-rate", "8", "--policy", "static-pd",
            "--prefill", "1", "--decode", "1", "--max-batch-size", "4", "--ttft-slo", "1",
            "--tpot-slo", "0.1", "--no-progress"]
    attainment = {}
    for name, extra in (("prefill", []), ("taichi", ["--slo-counts-decode-queue"])):
        assert main([*args, *extra, "--out", str(tmp_path / name)]) == 0
        capsys.readouterr()
        written = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        assert written["slo"]["counts_decode_queue"] is (name == "taichi")
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        attainment[name] = summary["summary"]["slo_attainment"]
    assert attainment["taichi"] < attainment["prefill"] - 0.2
