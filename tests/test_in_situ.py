"""`pdserve profile --from-step-log DIR`: a live run's logs -> a performance-model file, with
the super-linear decode term and the control plane's latency; clear errors for bad logs;
the simulator pricing what it fitted."""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import make_perf

from pdserve.cli import main
from pdserve.config import Config
from pdserve.metrics.summary import summarize
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs
from pdserve.perf.in_situ import calibrate, control_latency
from pdserve.perf.step_log import (
    PERF_MODEL_FILE,
    REQUEST_COLUMNS,
    REQUESTS_FILE,
    RESPONSE_COLUMNS,
    RESPONSES_FILE,
    ROLE_COLUMNS,
    ROLES_FILE,
    StepLog,
)
from pdserve.sim.runner import Experiment
from pdserve.sim.runner import control_latency as sim_control_latency
from pdserve.types import Role, attn_units

# what priced the logged batches: live CPU workers' decode steps grow with the square of
# the batch (20 us x B^2: B 11 -> 11 ms, B 53 -> 0.17 s, beside 3 ms + 0.8 ms/sequence)
TRUE = PerfModel("truth", PrefillCoeffs(0.006, 1e-4, 3e-8),
                 DecodeCoeffs(0.003, 8e-4, 5e-7, per_seq_squared_s=2e-5),
                 TransferCoeffs(1e-4, 1e9), kv_bytes_per_token=1024, kv_capacity_tokens=32768)
DEPLOYED = PerfModel("deployed", PrefillCoeffs(0.01, 1e-4, 1e-8), DecodeCoeffs(0.005, 1e-3, 1e-7),
                     TransferCoeffs(3e-6, 2e10), kv_bytes_per_token=4096,
                     kv_capacity_tokens=65536)
# per request: (received, admitted, batch end, first text sent) offsets, seconds
IN_S = (0.002, 0.003, 0.004, 0.003, 0.010)
OUT_S = (0.001, 0.002, 0.001, 0.005, 0.002)


def prefill_rows(truth: PerfModel) -> list[tuple[int, int, int, int, float]]:
    rows = []
    for decodes in (0, 2):
        for tokens, prior in ((16, 0), (64, 0), (256, 0), (512, 0), (256, 512), (128, 256)):
            units = attn_units(tokens, prior)
            rows.append((decodes, decodes * 400, tokens, units,
                         truth.batch_time_s(decodes, decodes * 400, tokens, units)))
    return rows


def decode_rows(truth: PerfModel) -> list[tuple[int, int, int, int, float]]:
    return [(b, b * per_seq, 0, 0, truth.batch_time_s(b, b * per_seq, 0, 0))
            for b in (1, 2, 4, 8, 11, 16, 23, 32, 40, 53) for per_seq in (100, 600)]


def write_run(directory: Path, monkeypatch, disaggregated: bool = True,
              truth: PerfModel = TRUE) -> None:
    """What a deployment served with PDSERVE_STEP_LOG=directory leaves there: 2 workers'
    batches priced by `truth`, the roles, the requests' timeline and the model it ran on."""
    monkeypatch.setenv("PDSERVE_STEP_LOG", str(directory))
    logs = [StepLog.from_env(0), StepLog.from_env(1)]
    rows = [(0, r) for r in prefill_rows(truth)] + [(1, r) for r in decode_rows(truth)]
    for index, (instance, row) in enumerate(rows):
        log = logs[instance if disaggregated else index % 2]
        assert log is not None
        log.record(*row, start_s=100.0 + index)
    for log in logs:
        log.close()  # type: ignore[union-attr]
    roles = (Role.PREFILL, Role.DECODE) if disaggregated else (Role.MIXED, Role.MIXED)
    write_csv(directory / ROLES_FILE, ROLE_COLUMNS,
              [(50.0, i, role.value) for i, role in enumerate(roles)])
    requests, responses = [], []
    for i, (in_s, out_s) in enumerate(zip(IN_S, OUT_S, strict=True)):
        received = 200.0 + i
        requests.append((i + 1, received + in_s, received + 0.05, received + 0.0505))
        responses.append((i + 1, received, received + 0.05 + out_s))
    requests.append((99, 300.0, 300.1, 300.1))  # a request the server did not stream
    write_csv(directory / REQUESTS_FILE, REQUEST_COLUMNS, requests)
    write_csv(directory / RESPONSES_FILE, RESPONSE_COLUMNS, responses)
    DEPLOYED.save(directory / PERF_MODEL_FILE)


def write_csv(path: Path, columns: tuple[str, ...], rows: list[tuple]) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows(rows)


def profile(directory: Path, out: Path, *extra: str) -> int:
    return main(["profile", "--from-step-log", str(directory), "--out", str(out), *extra])


def test_the_command_recovers_the_coefficients_the_super_linear_term_and_the_latency(
        tmp_path, monkeypatch, capsys):
    write_run(tmp_path / "logs", monkeypatch)
    assert profile(tmp_path / "logs", tmp_path / "perf.json") == 0
    model = PerfModel.load(tmp_path / "perf.json")
    p, d = model.prefill, model.decode
    assert (p.intercept_s, p.per_token_s, p.per_attn_unit_s) == pytest.approx(
        (0.006, 1e-4, 3e-8), rel=1e-3)
    assert (d.intercept_s, d.per_seq_s, d.per_context_token_s, d.per_seq_squared_s) == \
        pytest.approx((0.003, 8e-4, 5e-7, 2e-5), rel=1e-3)
    assert d.squared_until_batch == 53  # the largest logged batch
    assert d.step_s(53, 53 * 600) == pytest.approx(TRUE.decode.step_s(53, 53 * 600))
    # the tangent beyond the logged batches: linear there, continuing the slope at 53
    assert d.step_s(64, 0) - d.step_s(63, 0) == pytest.approx(
        8e-4 + 2e-5 * 2 * 53, rel=1e-3)
    # KV and transfer figures: the deployment's own model's
    assert (model.kv_capacity_tokens, model.kv_bytes_per_token, model.transfer) == \
        (DEPLOYED.kv_capacity_tokens, DEPLOYED.kv_bytes_per_token, DEPLOYED.transfer)
    control = np.add(IN_S, OUT_S)
    assert model.control_latency_s == pytest.approx(float(np.percentile(control, 50)))
    assert model.control_latency_p90_s == pytest.approx(float(np.percentile(control, 90)))
    printed = capsys.readouterr().out
    assert "12 batches on the prefill side, 20 on the decode side" in printed
    assert "R2 1.000" in printed and "us/seq^2" in printed
    assert "control latency: median 5.00 ms" in printed
    assert "warning" not in printed  # batches up to 53, prefills of 16-512 tokens


def test_a_colocated_run_is_one_fit_over_both_workers(tmp_path, monkeypatch):
    write_run(tmp_path / "logs", monkeypatch, disaggregated=False)
    result = calibrate(tmp_path / "logs")
    assert not result.per_role and result.prefill_rows == result.decode_rows == 32
    assert result.model.decode.per_seq_squared_s == pytest.approx(2e-5, rel=1e-3)
    assert result.model.prefill.per_token_s == pytest.approx(1e-4, rel=1e-3)
    # and the check table shows the fit following the logged periods at every size
    assert all(c.model_mean_s == pytest.approx(c.logged_mean_s, rel=1e-3)
               for c in result.decode_check)
    assert result.decode_check[-1].max_batch == 53


def test_a_linear_log_fits_no_super_linear_term(tmp_path, monkeypatch):
    linear = replace(TRUE, decode=replace(TRUE.decode, per_seq_squared_s=0.0))
    write_run(tmp_path / "logs", monkeypatch, truth=linear)
    decode = calibrate(tmp_path / "logs").model.decode
    assert decode.per_seq_squared_s == pytest.approx(0.0, abs=1e-12)
    assert decode.per_seq_s == pytest.approx(8e-4, rel=1e-3)


def test_a_log_of_small_batches_warns_what_it_cannot_support(tmp_path, monkeypatch, capsys):
    """A light-load log: decode batches of 1-3 sequences whose periods do not grow with the
    batch (as a lightly loaded live run's did), prefill chunks all of one size. The fit puts
    0 on the per-sequence and per-token costs, and the command says so."""
    from pdserve.perf.in_situ import fit_warnings
    write_run(tmp_path / "logs", monkeypatch)
    assert calibrate(tmp_path / "logs").warnings == ()  # batches up to 53: nothing to say
    flat = [(b, b * 300, 0, 0, 0.0046) for b in (1, 2, 3) for _ in range(20)]
    flat += [(1, 300, n, attn_units(n, 0), 0.012) for n in (250, 256, 260)]
    from pdserve.perf.fit import fit_steps
    prefill, decode = fit_steps(flat)
    assert decode.per_seq_s == 0
    model = replace(TRUE, prefill=prefill, decode=decode)
    warnings = fit_warnings(model, flat, flat)
    assert len(warnings) == 4
    assert "prefill batches of 250-260 tokens were logged" in warnings[0]
    assert "per sequence was fitted as 0 (decode batches of up to 3 logged)" in warnings[1]
    assert "at most 3 sequences" in warnings[2] and "calibrate at a load" in warnings[3]


def test_the_simulator_adds_the_models_control_latency_unless_the_config_sets_one():
    perf = replace(make_perf(), control_latency_s=0.005, control_latency_p90_s=0.012)
    assert sim_control_latency(Config(), perf) == (0.005, 0.012)
    assert sim_control_latency(Config().with_values({"sim.control_latency_s": 0.0}),
                               perf) == (0.0, 0.0)
    assert sim_control_latency(Config().with_values({"sim.control_latency_s": 0.02}),
                               perf) == (0.02, 0.0)
    assert sim_control_latency(Config(), make_perf()) == (0.0, 0.0)  # presets: none
    config = Config().with_values({"workload.trace": "synthetic",
                                   "workload.synthetic_requests": 40,
                                   "workload.synthetic_rate_rps": 2.0})
    plain = Experiment(config, Experiment.from_config(config).workload, make_perf())
    late = replace(plain, perf=replace(make_perf(), control_latency_s=0.05))
    ttft = [summarize(e.simulate().requests, e.slo).ttft_s.p50 for e in (plain, late)]
    assert ttft[1] == pytest.approx(ttft[0] + 0.05)


def test_the_simulator_prices_a_large_decode_batch_super_linearly():
    """With such a model the decode queue collapses near capacity where the linear fit of
    the same small batches holds: the time per token grows with the batch."""
    fitted = replace(TRUE, decode=replace(TRUE.decode, squared_until_batch=64))
    linear = replace(TRUE, decode=replace(TRUE.decode, per_seq_squared_s=0.0))
    per_token = [fitted.decode.step_s(b, b * 500) / b for b in (8, 32, 64)]
    assert per_token[0] < per_token[1] < per_token[2]
    assert fitted.decode.step_s(64, 64 * 500) > 2 * linear.decode.step_s(64, 64 * 500)
    config = Config().with_values({"workload.trace": "synthetic",
                                   "workload.synthetic_requests": 300,
                                   "workload.synthetic_rate_rps": 6.0,
                                   "workload.synthetic_lengths": "uniform:100-300:150-250",
                                   "policy.name": "static-pd", "cluster.prefill": 1,
                                   "cluster.decode": 1, "instance.max_batch_size": 64})
    workload = Experiment.from_config(config).workload
    tpot = {name: summarize(Experiment(config, workload, model).simulate().requests,
                            config.slo.targets()).tpot_s.p50
            for name, model in (("linear", linear), ("super-linear", fitted))}
    # the linear model keeps up (a step of its batch at ~20 ms); the squared term does not
    assert tpot["linear"] < 0.05
    assert tpot["super-linear"] > 2 * tpot["linear"]


@pytest.mark.parametrize("damage, message", [
    ("missing", "no such directory"),
    ("empty", "no steps-<instance>.csv step logs"),
    ("text", "is not a step log row"),
    ("column", "not a step log (no seconds column"),
    ("negative", "the time must be positive"),
    ("few", "only 3 batches on the prefill side"),
    ("no-model", "give --base FILE"),
    ("roles", "is not a role log row"),
    ("timeline", "is not a timeline row"),
    # NaN passed the sign checks: LAPACK's noise and "SVD did not converge", or a NaN latency
    ("nan-count", "all finite"),
    ("inf-start", "all finite"),
    ("inf-timeline", "is not a timeline row"),
    ("bytes", "not a step log ('utf-8' codec"),
    ("name", "steps-abc.csv is not a worker's step log"),
])
def test_bad_logs_are_refused_clearly(tmp_path, monkeypatch, capsys, damage, message):
    logs = tmp_path / "logs"
    if damage != "missing":
        logs.mkdir()
    if damage not in ("missing", "empty"):
        write_run(logs, monkeypatch)
    steps = logs / "steps-0.csv"
    if damage == "text":
        steps.write_text(steps.read_text() + "4,abc,0,0,0.01,1.0\n")
    elif damage == "column":
        steps.write_text("decodes,decode_context_tokens,prefill_tokens,prefill_attn_units\n"
                         "1,2,3,4\n")
    elif damage == "negative":
        steps.write_text(steps.read_text() + "4,100,0,0,-0.01,1.0\n")
    elif damage == "few":
        lines = steps.read_text().splitlines()
        steps.write_text("\n".join(lines[:4]) + "\n")
    elif damage == "no-model":
        (logs / PERF_MODEL_FILE).unlink()
    elif damage == "roles":
        (logs / ROLES_FILE).write_text("at_s,instance,role\n1.0,0,sideways\n")
    elif damage == "timeline":
        (logs / RESPONSES_FILE).write_text("request_id,received_s,first_sent_s\n1,x,2\n")
    elif damage == "nan-count":
        steps.write_text(steps.read_text() + "4,nan,0,0,0.01,1.0\n")
    elif damage == "inf-start":
        steps.write_text(steps.read_text() + "4,100,0,0,0.01,inf\n")
    elif damage == "inf-timeline":
        (logs / RESPONSES_FILE).write_text("request_id,received_s,first_sent_s\n1,0,inf\n")
    elif damage == "bytes":
        steps.write_bytes(steps.read_bytes() + b"4,\xff,0,0,0.01,1.0\n")
    elif damage == "name":
        steps.rename(logs / "steps-abc.csv")
    assert profile(logs, tmp_path / "perf.json") == 2
    err = capsys.readouterr().err
    assert err.startswith("pdserve: error: ") and message in err
    assert "Traceback" not in err
    assert not (tmp_path / "perf.json").exists()


def test_an_old_log_takes_its_base_model_from_the_command(tmp_path, monkeypatch):
    write_run(tmp_path / "logs", monkeypatch)
    (tmp_path / "logs" / PERF_MODEL_FILE).unlink()
    (tmp_path / "logs" / RESPONSES_FILE).unlink()
    base = replace(DEPLOYED, kv_capacity_tokens=4096)
    base.save(tmp_path / "base.json")
    assert profile(tmp_path / "logs", tmp_path / "perf.json", "--base",
                   str(tmp_path / "base.json")) == 0
    model = PerfModel.load(tmp_path / "perf.json")
    assert model.kv_capacity_tokens == 4096 and model.control_latency_s == 0.0
    assert control_latency(tmp_path / "logs") is None


def test_measuring_flags_do_not_go_with_a_step_log(tmp_path, monkeypatch, capsys):
    write_run(tmp_path / "logs", monkeypatch)
    assert profile(tmp_path / "logs", tmp_path / "perf.json", "--contention", "1") == 2
    assert "--contention measure an engine" in capsys.readouterr().err
    assert main(["profile", "--base", "x.json"]) == 2
    assert "--base goes with --from-step-log" in capsys.readouterr().err
