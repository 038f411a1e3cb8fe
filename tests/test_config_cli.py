"""Config validation and the `pdserve simulate` command."""

from __future__ import annotations

import csv
import json

import pytest

from pdserve.cli import main
from pdserve.config import SimConfig
from pdserve.perf.fitted import PerfModel


def test_unknown_field_is_named_with_a_suggestion():
    with pytest.raises(ValueError, match="unknown field 'ttft_slo' \\(did you mean 'ttft_slo_s'"):
        SimConfig.from_dict({"ttft_slo": 2})


def test_wrong_type_and_bad_value_name_the_field():
    with pytest.raises(ValueError, match="field 'prefill' must be int, got 'four'"):
        SimConfig.from_dict({"prefill": "four"})
    with pytest.raises(ValueError, match="'tpot_slo_s' must be positive"):
        SimConfig.from_dict({"tpot_slo_s": 0})
    with pytest.raises(ValueError, match="field 'goodput' must be bool"):
        SimConfig.from_dict({"goodput": 1})
    assert SimConfig.from_dict({"ttft_slo_s": 3}).ttft_slo_s == 3.0  # int is a fine float


def test_yaml_config_composes_a_preset_with_another_router(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("policy: static-pd\nprefill_router: round-robin\nprefill: 2\ndecode: 6\n")
    config = SimConfig.from_yaml(path)
    assert (config.policy, config.prefill_router, config.prefill, config.decode) == \
        ("static-pd", "round-robin", 2, 6)
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        SimConfig.from_yaml(path)


def test_simulate_writes_report_json_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["simulate", "--trace", "azure-code", "--duration", "120", "--policy",
                 "static-pd", "--prefill", "2", "--decode", "2", "--ttft-slo", "3",
                 "--tpot-slo", "0.1", "--goodput", "--no-progress", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "SLO attainment" in printed and "goodput: rate scale" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["ttft_slo_s"] == 3.0
    assert summary["goodput"]["rate_scale"] > 0
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == summary["summary"]["requests"] > 50
    for name in ("latency_cdf.png", "instance_load.png", "attainment_vs_rate.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_simulate_with_a_config_file_and_flag_override(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("trace: synthetic\nsynthetic_requests: 50\npolicy: colocated\n"
                    "instances: 2\n")
    assert main(["simulate", "--config", str(path), "--instances", "3", "--no-progress"]) == 0
    assert "requests 50  completed 50" in capsys.readouterr().out


def test_bad_input_exits_2_with_a_clear_message(capsys):
    assert main(["simulate", "--trace", "nope", "--no-progress"]) == 2
    assert "pdserve: error: trace 'nope' is neither" in capsys.readouterr().err
    assert main(["simulate", "--model", "gpt-9", "--no-progress"]) == 2
    assert "unknown model 'gpt-9'" in capsys.readouterr().err
    assert main(["simulate", "--trace", "azure-conv", "--start", "99999", "--no-progress"]) == 2
    assert "no requests in the chosen window" in capsys.readouterr().err


def test_profile_writes_a_model_the_simulator_loads(tmp_path, capsys):
    out = tmp_path / "tiny.json"
    assert main(["profile", "--model", "tiny", "--quick", "--kv-blocks", "16",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "R2" in printed and f"wrote {out}" in printed
    model = PerfModel.load(out)
    assert model.kv_capacity_tokens == 16 * 16  # reported; the grid measured on its own pool
    assert model.prefill.per_token_s > 0 and model.decode.intercept_s > 0
    assert model.prefill.time_s(2048, 2048 * 2048) > model.prefill.time_s(16, 256) > 0
    assert main(["simulate", "--trace", "synthetic", "--synthetic-requests", "30",
                 "--synthetic-rate", "0.5", "--synthetic-lengths", "fixed:64:8",
                 "--perf-model", str(out), "--policy", "colocated", "--instances", "2",
                 "--no-progress"]) == 0
    assert "requests 30  completed 30" in capsys.readouterr().out


def test_profile_under_contention_labels_the_model_and_cleans_up():
    import multiprocessing

    import pytest

    from pdserve.engine.profile import QUICK_GRID, profile_engine

    shared = profile_engine("tiny", 64, QUICK_GRID, contention=2)
    assert "2 other workers decoding" in shared.name
    assert shared.prefill.per_token_s > 0 and shared.kv_capacity_tokens == 64 * 16
    assert multiprocessing.active_children() == []  # the decoding helpers are gone
    with pytest.raises(ValueError, match="contention must not be negative"):
        profile_engine("tiny", 64, QUICK_GRID, contention=-1)
