"""The config tree (validation, dotted paths, YAML), its command-line flags, and the
`pdserve simulate` command."""

from __future__ import annotations

import argparse
import csv
import json
import re

import pytest

from pdserve.cli import build_parser, main
from pdserve.config import SERVE_DEFAULTS, Config, default_of, leaf_paths, serve_defaults
from pdserve.config_flags import describe
from pdserve.perf.fitted import PerfModel
from pdserve.policies.flowkv.settings import ScoreWeights
from pdserve.policies.presets import build_policy
from pdserve.server.serve_cli import serve_config
from pdserve.sim.runner import Experiment


def test_unknown_field_is_named_with_a_suggestion():
    with pytest.raises(ValueError, match="unknown config field 'ttft_slo' \\(did you mean "
                                         "'slo.ttft_s'"):
        Config().with_values({"ttft_slo": 2})
    with pytest.raises(ValueError, match="unknown config field 'cluster.prefil' \\(did you "
                                         "mean 'cluster.prefill'"):
        Config().with_values({"cluster.prefil": 2})


def test_unknown_nested_yaml_key_is_named_by_its_full_path(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("policy:\n  name: flowkv\n  flowkv:\n    scales:\n      sendng: 3\n")
    with pytest.raises(ValueError, match=f"{path}: unknown config field "
                       "'policy.flowkv.scales.sendng' \\(did you mean "
                       "'policy.flowkv.scales.sending'"):
        Config.from_yaml(path)
    path.write_text("cluster:\n  prefill:\n    count: 2\n")
    with pytest.raises(ValueError, match="'cluster.prefill' is a value, not a section"):
        Config.from_yaml(path)
    path.write_text("policy: static-pd\n")  # the flat form of old: policy is a section now
    with pytest.raises(ValueError, match="config section 'policy' must be a mapping"):
        Config.from_yaml(path)


def test_wrong_type_and_bad_value_name_the_field():
    with pytest.raises(ValueError, match="field 'cluster.prefill' must be int, got 'four'"):
        Config().with_values({"cluster.prefill": "four"})
    with pytest.raises(ValueError, match="'slo.tpot_s' must be positive"):
        Config().with_values({"slo.tpot_s": 0})
    with pytest.raises(ValueError, match="'sim.instance_startup_s' must not be negative"):
        Config().with_values({"sim.instance_startup_s": float("nan")})  # passed before
    with pytest.raises(ValueError, match="field 'goodput.search' must be bool"):
        Config().with_values({"goodput.search": 1})
    with pytest.raises(ValueError, match="config section 'policy.taichi': taichi watermark"):
        Config().with_values({"policy.taichi.watermark": 2})
    with pytest.raises(ValueError, match="'policy.taichi.seed' follows 'seed'"):
        Config().with_values({"policy.taichi.seed": 3})
    assert Config().with_values({"slo.ttft_s": 3}).slo.ttft_s == 3.0  # int is a fine float


def test_values_set_by_path_by_section_and_by_object():
    config = Config().with_values({"cluster.prefill": 2, "policy.ares": {"theta": 0.3},
                                   "server.ray": {"address": "head:6379"}})
    assert config.cluster.prefill == 2 and config.cluster.decode == 4
    assert config.policy.ares.theta == 0.3 and config.policy.ares.interval_s == 1.0
    assert config.server.ray is not None and config.server.ray.address == "head:6379"
    assert config.with_values({"server.ray": None}).server.ray is None
    again = Config().with_values({"policy": config.policy})
    assert again.policy == config.policy
    assert Config() == Config().with_values({})


def test_yaml_config_composes_a_preset_with_another_router(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("policy:\n  name: static-pd\n  prefill_router: round-robin\n"
                    "cluster:\n  prefill: 2\n  decode: 6\n")
    config = Config.from_yaml(path)
    assert (config.policy.name, config.policy.prefill_router, config.cluster.prefill,
            config.cluster.decode) == ("static-pd", "round-robin", 2, 6)
    path.write_text("- a list\n")
    with pytest.raises(ValueError, match="must be a mapping"):
        Config.from_yaml(path)


def test_a_flowkv_weight_and_scale_from_yaml_reach_the_built_policy(tmp_path):
    path = tmp_path / "flowkv.yaml"
    path.write_text(
        "workload: {trace: synthetic, synthetic_requests: 5}\n"
        "policy:\n  name: flowkv\n  flowkv:\n"
        "    prefill_weights: {running: 0.2, waiting: 0.2, sending: 0.1, token_budget: 0.2,\n"
        "                      kv: 0.05, compute: 0.2, bandwidth: 0.05}\n"
        "    scales: {sending: 3}\n    low_prefill: 0.3\n"
        "cluster: {prefill: 1, decode: 1}\n")
    config = Config.from_yaml(path)
    experiment = Experiment.from_config(config)
    policy, count = build_policy(experiment.policy_setup())
    settings = policy.prefill_router.context.settings  # type: ignore[attr-defined]
    assert count == 2
    assert settings.prefill_weights == ScoreWeights(0.2, 0.2, 0.0, 0.1, 0.2, 0.05, 0.2, 0.05)
    assert settings.scales.sending == 3.0 and settings.low_prefill == 0.3
    assert settings.decode_weights == Config().policy.flowkv.decode_weights
    assert settings.prefix_block_tokens == 512  # the instances' (flowkv's: -1 -> 512)
    assert experiment.simulate().requests


def parser_of(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


NOT_CONFIG = {"help", "config", "out", "no_progress", "policy", "top", "jobs", "instances",
              "chunk_sizes", "d_chunk_sizes", "time_limit", "gpus", "verify", "shortlist",
              "seeds", "json"}


@pytest.mark.parametrize("command", ["simulate", "serve", "plan"])
def test_every_flag_sets_a_real_config_field_and_shows_the_trees_default(command):
    paths = set(leaf_paths())
    defaults = serve_defaults() if command == "serve" else Config()
    checked = 0
    for action in parser_of(command)._actions:
        if action.dest in paths:
            checked += 1
            default = default_of(defaults, action.dest)
            if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
                assert action.const is not default  # a switch sets the other value
                continue
            if action.nargs == "?":  # --ray [ADDRESS]
                continue
            shown = re.search(r"\[([^\[\]]*)\]$", action.help or "")
            assert shown, f"{action.option_strings} shows no default"
            text = shown.group(1).replace("%%", "%")
            if command == "plan" and text.startswith("taichi: "):
                text = text.removeprefix("taichi: ").split(", ampd: ")[0]
            if text != describe(default) and not text.startswith(f"{describe(default)} ("):
                # a sentinel's meaning, stated by the flag
                assert default in ("", 0, -1, None), \
                    f"{action.option_strings}: shows [{text}], the tree has {default!r}"
        else:
            assert action.dest in NOT_CONFIG, f"{action.option_strings} sets {action.dest!r}"
    assert checked >= {"simulate": 50, "serve": 45, "plan": 11}[command]


def test_old_flag_names_set_the_same_values():
    args = parser_of("simulate").parse_args([
        "--ttft-slo", "3", "--prefill", "2", "--taichi-chunk-p", "1024", "--ares-theta", "0.2",
        "--chunk-size", "512", "--perf-model", "p.json", "--no-prefix-aware-routing",
        "--goodput", "--instances", "2xl20:prefill,2xh20:decode", "--duration", "30"])
    from pdserve.config_flags import config_from_args

    config = config_from_args(args)
    assert (config.slo.ttft_s, config.cluster.prefill, config.policy.taichi.chunk_p_tokens,
            config.policy.ares.theta, config.instance.chunk_size_tokens, config.perf.profile,
            config.policy.flowkv.prefix_aware_routing, config.goodput.search,
            config.cluster.instances, config.workload.duration_s) == (
        3.0, 2, 1024, 0.2, 512, "p.json", False, True, "2xl20:prefill,2xh20:decode", 30.0)
    assert config_from_args(parser_of("simulate").parse_args([])) == Config()


def test_serve_arguments_apply_the_serve_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("PDSERVE_API_KEY", raising=False)
    serve = parser_of("serve")
    config = serve_config(serve.parse_args([]))
    assert config == serve_defaults() == Config().with_values(SERVE_DEFAULTS)
    assert (config.instance.chunk_size_tokens, config.instance.max_batch_size,
            config.slo.tpot_s, config.monitor.interval_s, config.policy.name,
            config.cluster.instances, config.instance.prefix_block_tokens) == (
        512, 64, 0.2, 0.5, "colocated", 4, 16)
    assert config.slo.ttft_s == Config().slo.ttft_s  # where the worlds agree: the tree's
    six = serve_config(serve.parse_args(["--instances", "6", "--model", "tiny"]))
    assert (six.cluster.prefill, six.cluster.decode, six.engine.weights) == (3, 3, "tiny")
    assert six.perf.model == Config().perf.model  # the served weights are not the spec
    one = serve_config(serve.parse_args(["--instances", "4", "--prefill", "1"]))
    assert (one.cluster.prefill, one.cluster.decode) == (1, 3)
    assert serve_config(serve.parse_args(["--ray-cpus-per-worker", "2"])).server.ray is None
    ray = serve_config(serve.parse_args(["--ray", "--ray-cpus-per-worker", "2"])).server.ray
    assert ray is not None and (ray.address, ray.cpus_per_worker) == ("", 2.0)
    path = tmp_path / "serve.yaml"
    path.write_text("cluster: {instances: 2}\nslo: {tpot_s: 0.3}\nengine: {kv_blocks: 64}\n")
    filed = serve_config(serve.parse_args(["--config", str(path), "--tpot-slo", "0.25"]))
    assert (filed.cluster.prefill, filed.cluster.decode, filed.slo.tpot_s,
            filed.engine.kv_blocks, filed.instance.chunk_size_tokens) == (1, 1, 0.25, 64, 512)


def test_plan_starts_each_planner_from_its_own_config():
    from pdserve.config_flags import config_from_args
    from pdserve.planning.ampd import plan_defaults, plan_inputs

    args = parser_of("plan").parse_args(["--policy", "ampd", "--gpus", "8", "--ttft-slo", "1"])
    inputs = plan_inputs(config_from_args(args, plan_defaults()), args.gpus)
    assert (inputs.model, inputs.gpu, inputs.workload, inputs.slo.ttft_s, inputs.slo.tpot_s,
            inputs.sessions) == ("qwen3-32b", "h20", "agent:toolbench", 1.0, 0.04, 150)


def test_simulate_writes_report_json_csv_and_plots(tmp_path, capsys):
    out = tmp_path / "results"
    code = main(["simulate", "--trace", "azure-code", "--duration", "120", "--policy",
                 "static-pd", "--prefill", "2", "--decode", "2", "--ttft-slo", "3",
                 "--tpot-slo", "0.1", "--goodput", "--no-progress", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    # 63 requests: even compressed 4,096-fold (the search's ceiling) they meet the SLOs
    assert "SLO attainment" in printed and "goodput: at least rate scale 4096" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["slo"]["ttft_s"] == 3.0
    assert summary["goodput"]["rate_scale"] == 4096 and summary["goodput"]["ceiling_reached"]
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == summary["summary"]["requests"] > 50
    for name in ("latency_cdf.png", "instance_load.png", "attainment_vs_rate.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"


def test_the_written_config_yaml_reproduces_the_run(tmp_path, capsys):
    first, second = tmp_path / "first", tmp_path / "second"
    assert main(["simulate", "--trace", "synthetic", "--synthetic-requests", "60",
                 "--synthetic-lengths", "lognormal:800:100:1.0", "--seed", "5", "--policy",
                 "arrow", "--prefill", "1", "--decode", "2", "--rebalancer", "ares",
                 "--ares-predictor", "oracle", "--chunk-size", "1024", "--tpot-slo", "0.05",
                 "--no-progress", "--out", str(first)]) == 0
    written = Config.from_yaml(first / "config.yaml")
    assert (written.policy.name, written.policy.rebalancer, written.seed,
            written.instance.chunk_size_tokens) == ("arrow", "ares", 5, 1024)
    assert written.to_dict() == json.loads((first / "summary.json").read_text())["config"]
    assert main(["simulate", "--config", str(first / "config.yaml"), "--no-progress",
                 "--out", str(second)]) == 0
    assert (second / "config.yaml").read_text() == (first / "config.yaml").read_text()
    assert (second / "requests.csv").read_bytes() == (first / "requests.csv").read_bytes()
    one, two = (json.loads((d / "summary.json").read_text()) for d in (first, second))
    assert one == two


def test_simulate_with_a_config_file_and_flag_override(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("workload:\n  trace: synthetic\n  synthetic_requests: 50\n"
                    "policy:\n  name: colocated\ncluster:\n  instances: 2\n")
    assert main(["simulate", "--config", str(path), "--instances", "3", "--no-progress"]) == 0
    assert "requests 50  completed 50" in capsys.readouterr().out


def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys):
    assert main(["simulate", "--trace", "nope", "--no-progress"]) == 2
    assert "pdserve: error: trace 'nope' is neither" in capsys.readouterr().err
    assert main(["simulate", "--model", "gpt-9", "--no-progress"]) == 2
    assert "unknown model 'gpt-9'" in capsys.readouterr().err
    assert main(["simulate", "--trace", "azure-conv", "--start", "99999", "--no-progress"]) == 2
    assert "no requests in the chosen window" in capsys.readouterr().err
    path = tmp_path / "bad.yaml"
    path.write_text("sim:\n  control_latency: 0.02\n")
    assert main(["simulate", "--config", str(path), "--no-progress"]) == 2
    assert ("unknown config field 'sim.control_latency' (did you mean "
            "'sim.control_latency_s'?)") in capsys.readouterr().err


def test_hostile_yaml_config_files_fail_fast_naming_the_file(tmp_path):
    def fails(text: str, message: str) -> None:
        path = tmp_path / "c.yaml"
        path.write_bytes(text.encode("latin-1"))
        with pytest.raises(ValueError, match=message) as error:
            Config.from_yaml(path)
        assert str(path) in str(error.value) and len(str(error.value)) < 1000

    fails("slo: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply")  # PyYAML recursion
    fails("slo: &a {x: *a}\n", "nested deeper than 32 levels")  # a mapping inside itself
    # billion laughs: 10^8 values from a few lines of aliases
    bomb = ["l0: &l0 {" + ", ".join(f"{c}: 1" for c in "abcdefghij") + "}"]
    bomb += [f"l{i}: &l{i} {{" + ", ".join(f"{c}: *l{i - 1}" for c in "abcdefghij") + "}"
             for i in range(1, 8)]
    fails("\n".join(bomb) + "\nslo: *l7\n", "more than 10000 values")
    # the same as a list in a value: the error shows it bounded
    laughs = ["&l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + [
        f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    fails("slo: {ttft_s: [" + ", ".join(laughs) + "]}\n", "'slo.ttft_s' must be float")
    fails("slo: {ttft_s: 1" + "0" * 400 + "}\n", "'slo.ttft_s' is too large for a float")
    fails("slo: {ttft_s: \xff}\n", "cannot read config")  # not UTF-8


def test_unusable_out_and_perf_model_paths_are_one_line_errors(tmp_path, capsys):
    run = ["simulate", "--trace", "synthetic", "--synthetic-requests", "5", "--prefill", "1",
           "--decode", "1", "--no-progress"]
    taken = tmp_path / "a-file"
    taken.write_text("")
    assert main([*run, "--out", str(taken / "sub")]) == 2  # before the run, not after it
    captured = capsys.readouterr()
    assert "pdserve: error: " in captured.err and "Not a directory" in captured.err
    assert "workload" not in captured.out
    assert main([*run, "--perf-model", str(tmp_path / "missing.json")]) == 2
    assert "cannot read performance model" in capsys.readouterr().err
    good = tmp_path / "perf.json"
    Experiment.from_config(Config()).perf.save(good)
    for change, message in ((("decode", "intercept_s", float("nan")), "must be finite"),
                            (("prefill", "intercept_s", -1.0), "must not be negative")):
        side, name, value = change
        record = json.loads(good.read_text())
        record[side][name] = value
        bad = tmp_path / f"{name}.json"
        bad.write_text(json.dumps(record))
        assert main([*run, "--perf-model", str(bad)]) == 2
        assert f"{side}.{name} {message}" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--instances", "4xh100:bogus"], "unknown role 'bogus'"),
    (["simulate", "--instances", "-3"], "cannot read '-3'"),
    (["predictor", "record", "--out", "r.npz", "--progress-every", "0"],
     "--progress-every: must be at least 1"),  # was a ZeroDivisionError mid-recording
    # counts a few digits too long: each exhausted the memory before any check
    (["plan", "--gpus", "99999999"], "--gpus: must be at most 4,096, got 99999999"),
    (["plan", "--jobs", "5000"], "--jobs/--processes: must be at most 1,024, got 5000"),
])
def test_flag_errors_say_what_is_wrong(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "instances_arg" not in err


def test_a_goodput_search_needs_a_rate_and_says_when_no_slo_bounds_it(capsys):
    """A burst (--synthetic-rate inf: every request at t=0) has no arrival rate to scale:
    refused before any run. With SLOs that never bind, the search's answer is a bound."""
    run = ["simulate", "--trace", "synthetic", "--synthetic-requests", "20", "--prefill", "1",
           "--decode", "1", "--no-progress", "--goodput"]
    assert main([*run, "--synthetic-rate", "inf"]) == 2
    out = capsys.readouterr()
    assert "20 requests all at once" in out.out and "simulated" not in out.out
    assert "has none to scale (20 requests arriving at one instant)" in out.err
    assert main([*run, "--ttft-slo", "inf", "--tpot-slo", "inf"]) == 0
    assert "goodput: at least rate scale 4096.000" in capsys.readouterr().out


def test_a_goodput_found_on_a_burst_says_it_is_likely_too_high(capsys):
    """The default synthetic workload (1,000 requests) found 2,543 req/s on 4P4D, its
    arrivals lasting 0.4 s at that rate, where 100,000 requests find 386: the search now says
    so, and how many requests a sustained rate needs. The whole azure-conv trace at its
    goodput lasts 180 s: no warning (the README's run)."""
    assert main(["simulate", "--trace", "synthetic", "--no-progress", "--goodput"]) == 0
    printed = capsys.readouterr().out
    assert "warning: at the goodput rate the workload's arrivals last" in printed
    assert "less than the 80s a run needs" in printed and "--synthetic-requests" in printed
    from pdserve.planning.run_length import burst_goodput_note

    config = Config().with_values({"workload.trace": "azure-conv"})
    workload = Experiment.from_config(config).workload
    rate = workload.mean_rate_rps
    assert burst_goodput_note(workload, config, 19.5 * rate) is None
    assert "last 58.4s" in burst_goodput_note(workload, config, 60 * rate)  # 3,502 s / 60
    # TaiChi's slider search runs the workload it is given too, and says the same
    assert main(["plan", "--policy", "taichi", "--trace", "synthetic", "--synthetic-requests",
                 "200", "--instances", "2", "--chunk-sizes", "1024", "--d-chunk-sizes", "512",
                 "--jobs", "1", "--no-progress"]) == 0
    assert "warning: at the goodput rate the workload's arrivals last" in \
        capsys.readouterr().out


@pytest.mark.parametrize("flags, message", [
    (["--prefill", "3000000"], "'cluster.prefill' must be at most 4,096, got 3000000"),
    (["--policy", "colocated", "--instances", "9000"],
     "'cluster.instances' must be at most 4,096 instances, got 9000"),
    (["--instances", "5000xh100:prefill,8xh100:decode"],
     "'cluster.instances' must be at most 4,096 instances, got 5008"),
    (["--trace", "synthetic", "--synthetic-requests", "100000000"],
     "'workload.synthetic_requests' must be at most 10,000,000, got 100000000"),
    (["--repeat", "1000"], "1000 copies of 19366 requests exceed the 10,000,000 requests"),
    (["--trace", "synthetic", "--seed", "-5"],  # was numpy's bare "expected non-negative"
     "config field 'seed' must be a whole number from 0 to 2^63 - 1, got -5"),
])
def test_counts_past_what_a_machine_holds_are_refused_before_building_anything(
        flags, message, capsys):
    assert main(["simulate", *flags, "--no-progress"]) == 2  # (3,000,000 instances: OOM)
    assert message in capsys.readouterr().err


def test_a_run_whose_arrivals_span_too_many_ticks_stops_saying_so(monkeypatch, capsys):
    from pdserve.sim import simulator

    monkeypatch.setattr(simulator, "MAX_TICKS", 200)  # 10^6 in earnest: seconds, not hours
    run = ["simulate", "--trace", "synthetic", "--synthetic-requests", "5", "--prefill", "1",
           "--decode", "1", "--no-progress"]
    assert main([*run, "--rate-scale", "1e-300"]) == 2  # arrivals 10^300 s apart
    assert "passed 200 monitor ticks of 1 s" in capsys.readouterr().err
    assert main(run) == 0


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


@pytest.mark.parametrize("flags, message", [
    (["--max-in-flight", "0"], "argument --max-in-flight: must be at least 1, got 0"),
    (["--timeout", "-1"], "argument --timeout: must be a number of seconds above 0"),
    (["--max-output-tokens", "0"], "argument --max-output-tokens: must be at least 1"),
    (["--url", "notaurl"], "argument --url: must be an http:// or https:// URL with a host"),
    (["--url", "http://[::1"], "argument --url: not a URL"),
    (["--url", "http://127.0.0.1:port"], "argument --url: not a URL"),
])
def test_bench_refuses_limits_that_would_stall_or_end_the_replay(flags, message, capsys):
    """`pdserve bench --max-in-flight 0` would admit no request and `--timeout -1` end the
    replay before it starts: usage errors, before any connection (the URL is refused)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--url", "http://127.0.0.1:9", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
