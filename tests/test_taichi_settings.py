"""TaiChi's sliders at the ends of the design space are the existing presets, exactly:
S_P == S_D is `colocated`, S_D == 0 is `static-pd` (TaiChi sec. 3.1), on a fixed seed."""

from __future__ import annotations

import pytest

from pdserve.config import Config
from pdserve.policies.presets import build_policy
from pdserve.policies.taichi.flowing_decode import FlowingDecode
from pdserve.sim.runner import Experiment, build_topology, sim_settings
from pdserve.sim.simulator import SimResult, Simulator
from pdserve.types import SLO


def outcomes(config: Config) -> list[tuple]:
    result = Experiment.from_config(config).simulate()
    return [(r.request_id, r.first_token_s, r.finish_s, r.prefill_instance, r.decode_instance,
             r.preemptions, r.transfer_s) for r in result.requests]


BASE = Config().with_values({"workload.trace": "synthetic", "workload.synthetic_requests": 300,
                             "workload.synthetic_rate_rps": 12.0,
                             "workload.synthetic_lengths": "lognormal:900:200:1.0", "seed": 7,
                             "perf.model": "qwen2.5-14b", "perf.gpu": "a100", "slo.ttft_s": 3.0,
                             "slo.tpot_s": 0.11, "monitor.interval_s": 0.2})


def test_aggregation_setting_is_colocated():
    colocated = outcomes(BASE.with_values({"policy.name": "colocated", "cluster.instances": 4,
                                           "instance.chunk_size_tokens": 512}))
    taichi = outcomes(BASE.with_values({"policy.name": "taichi", "cluster.prefill": 2,
                                        "cluster.decode": 2, "instance.chunk_size_tokens": 2048,
                                        "policy.taichi.chunk_p_tokens": 512,
                                        "policy.taichi.chunk_d_tokens": 512}))
    assert taichi == colocated
    assert len({r[3] for r in taichi}) == 4  # every instance prefilled


def test_disaggregation_setting_is_static_pd():
    static = outcomes(BASE.with_values({"policy.name": "static-pd", "cluster.prefill": 2,
                                        "cluster.decode": 2, "instance.chunk_size_tokens": 8192}))
    taichi = outcomes(BASE.with_values({"policy.name": "taichi", "cluster.prefill": 2,
                                        "cluster.decode": 2, "instance.chunk_size_tokens": 8192,
                                        "policy.taichi.chunk_p_tokens": 8192,
                                        "policy.taichi.chunk_d_tokens": 0}))
    assert taichi == static
    assert {r[4] for r in taichi} == {2, 3} and all(r[6] > 0 for r in taichi)


def test_hybrid_setting_cobatches_and_keeps_decodes_in_place_without_pressure():
    result = Experiment.from_config(BASE.with_values({
        "policy.name": "taichi", "cluster.prefill": 2, "cluster.decode": 2,
        "policy.taichi.chunk_p_tokens": 1024, "policy.taichi.chunk_d_tokens": 256})).simulate()
    decode_on = {r.decode_instance for r in result.requests}
    assert decode_on <= {2, 3}  # no pressure: every decode stays on a D-heavy instance
    assert result.migrations == 0
    # in place: a decode prefilled on a D-heavy instance continues there, with no transfer;
    # one prefilled on a P-heavy instance moves to a D-heavy one once (Alg. 1's start)
    on_d = [r for r in result.requests if r.prefill_instance in (2, 3)]
    on_p = [r for r in result.requests if r.prefill_instance in (0, 1)]
    assert on_d and on_p
    assert all(r.decode_instance == r.prefill_instance and r.transfer_s == 0 for r in on_d)
    assert all(r.decode_instance in (2, 3) and r.transfer_s > 0 for r in on_p)
    assert {r.prefill_instance for r in result.requests} == {0, 1, 2, 3}
    assert any(r.cobatched_prefill_tokens > 0 for r in result.requests)


def flowing_run(flowing_decode: bool) -> tuple[SimResult, FlowingDecode | None]:
    """TaiChi hybrid under pressure: long prompts in 8K chunks on the P-heavy instances,
    a 32-sequence batch cap and an 80 ms TPOT SLO."""
    config = BASE.with_values({
        "policy.name": "taichi", "cluster.prefill": 2, "cluster.decode": 2,
        "policy.taichi.chunk_p_tokens": 8192, "policy.taichi.chunk_d_tokens": 256,
        "policy.taichi.flowing_decode": flowing_decode, "workload.synthetic_rate_rps": 6.0,
        "workload.synthetic_lengths": "lognormal:6000:300:0.5", "instance.max_batch_size": 32,
        "slo.tpot_s": 0.08})
    experiment = Experiment.from_config(config)
    policy, count = build_policy(experiment.policy_setup())
    result = Simulator(policy, count, experiment.perf, sim_settings(config),
                       build_topology(config, experiment.perf, count)).run(
        experiment.workload.requests())
    rebalancer = policy.rebalancer
    return result, rebalancer if isinstance(rebalancer, FlowingDecode) else None


def test_flowing_decode_degrades_and_backflows_end_to_end():
    """Alg. 1 stages 2-3 in a whole run: full D-heavy batches degrade their longest decodes
    to the P-heavy instances, whose 8K chunks then push those decodes' TPOT past alpha x SLO
    and back. Measured 2026-11-24: 244 degradations, 213 backflows, 300 requests. Off, the
    same run migrates nothing and every decode stays where its prefill ran (Fig. 18's
    baseline)."""
    result, flowing = flowing_run(flowing_decode=True)
    assert flowing is not None
    assert flowing.degradations >= 50 and flowing.backflows >= 50
    decided = flowing.degradations + flowing.backflows  # a few end before they can leave
    assert 0.95 * decided <= result.migrations <= decided
    assert any(r.decode_instance in (0, 1) for r in result.requests)  # ended degraded
    still, _ = flowing_run(flowing_decode=False)
    assert still.migrations == 0
    assert all(r.decode_instance == r.prefill_instance for r in still.requests)  # in place


def test_interference_intensity_separates_aggregation_from_disaggregation(tmp_path):
    from pdserve.metrics.report import write_requests_csv

    def run(config: Config):
        experiment = Experiment.from_config(config)
        result = experiment.simulate()
        return result, experiment.summarize(result)

    _, static = run(BASE.with_values({"policy.name": "static-pd", "cluster.prefill": 2,
                                      "cluster.decode": 2}))
    _, colocated = run(BASE.with_values({"policy.name": "colocated", "cluster.instances": 4,
                                         "instance.chunk_size_tokens": 512}))
    hybrid_result, hybrid = run(BASE.with_values({"policy.name": "taichi", "cluster.prefill": 2,
                                                  "cluster.decode": 2,
                                                  "policy.taichi.chunk_p_tokens": 1024,
                                                  "policy.taichi.chunk_d_tokens": 256}))
    assert static.interference_intensity.mean == 0  # decode instances run no prefill
    assert colocated.interference_intensity.mean > hybrid.interference_intensity.mean > 0
    write_requests_csv(tmp_path / "r.csv", hybrid_result.requests, SLO(3.0, 0.11))
    header, first = (tmp_path / "r.csv").read_text().splitlines()[:2]
    column = header.split(",").index("interference_intensity")
    request = hybrid_result.requests[0]
    assert float(first.split(",")[column]) == pytest.approx(
        request.cobatched_prefill_tokens / request.generated_tokens, abs=1e-4)


def test_simulate_command_takes_the_sliders(capsys, tmp_path):
    from pdserve.cli import main

    code = main(["simulate", "--policy", "taichi", "--prefill", "1", "--decode", "3",
                 "--taichi-chunk-p", "1024", "--taichi-chunk-d", "128",
                 "--taichi-no-feasible", "reject", "--trace", "synthetic",
                 "--synthetic-requests", "100", "--synthetic-lengths", "table:sharegpt",
                 "--model", "qwen2.5-14b", "--gpu", "a100", "--no-progress",
                 "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and "policy taichi" in out and "interference (TaiChi)" in out
    taichi = Config.from_yaml(tmp_path / "config.yaml").policy.taichi
    assert taichi.chunk_d_tokens == 128 and taichi.no_feasible == "reject"
    assert main(["simulate", "--policy", "taichi", "--taichi-chunk-p", "128",
                 "--taichi-chunk-d", "512", "--trace", "synthetic"]) == 2
    assert "chunk_d_tokens (S_D=512) must not exceed" in capsys.readouterr().err
