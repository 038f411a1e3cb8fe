"""In-situ profiles: step logs written by workers and the joint fit over them."""

from __future__ import annotations

import numpy as np
import pytest

from pdserve.perf.fit import fit_steps
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs
from pdserve.perf.step_log import (
    ROLES_FILE,
    StepLog,
    fit_step_log,
    fit_step_log_by_role,
    read_role_log,
    read_step_logs,
    role_at,
)
from pdserve.types import Role, attn_units

TRUE = PerfModel("truth", PrefillCoeffs(0.004, 2e-5, 3e-9), DecodeCoeffs(0.004, 3e-4, 2e-7),
                 TransferCoeffs(1e-4, 1e9), kv_bytes_per_token=1024, kv_capacity_tokens=32768)
BASE = PerfModel("base", PrefillCoeffs(1.0, 1.0, 1.0), DecodeCoeffs(1.0, 1.0, 1.0),
                 TransferCoeffs(2e-4, 5e8), kv_bytes_per_token=2048, kv_capacity_tokens=4096)


def steps() -> list[tuple[int, int, int, int, float]]:
    """Prefill-only, decode-only and mixed batches priced by TRUE."""
    rows = []
    for decodes in (0, 1, 4, 16):
        for context in (0, 300, 1200):
            for tokens, prior in ((0, 0), (64, 0), (512, 0), (256, 512)):
                if decodes == 0 and tokens == 0:
                    continue
                ctx = decodes * context
                units = attn_units(tokens, prior) if tokens else 0
                rows.append((decodes, ctx, tokens, units,
                             TRUE.batch_time_s(decodes, ctx, tokens, units)))
    return rows


def test_the_joint_fit_recovers_the_model_that_priced_the_batches():
    prefill, decode = fit_steps(steps())
    assert prefill.intercept_s == decode.intercept_s == pytest.approx(0.004, rel=1e-6)
    assert prefill.per_token_s == pytest.approx(2e-5, rel=1e-6)
    assert prefill.per_attn_unit_s == pytest.approx(3e-9, rel=1e-6)
    assert decode.per_seq_s == pytest.approx(3e-4, rel=1e-6)
    assert decode.per_context_token_s == pytest.approx(2e-7, rel=1e-6)
    assert prefill.r2 == pytest.approx(1.0)


def test_worker_step_logs_round_trip_and_fit_into_a_model(tmp_path, monkeypatch):
    monkeypatch.setenv("PDSERVE_STEP_LOG", str(tmp_path / "logs"))
    logs = [StepLog.from_env(0), StepLog.from_env(1)]
    rows = steps()
    for index, row in enumerate(rows):
        logs[index % 2].record(*row)  # type: ignore[union-attr]
    for log in logs:
        log.close()  # type: ignore[union-attr]
    read = read_step_logs(sorted((tmp_path / "logs").glob("steps-*.csv")))
    assert len(read) == len(rows)
    fitted = fit_step_log(tmp_path / "logs", BASE)
    assert fitted.transfer == BASE.transfer and fitted.kv_capacity_tokens == 4096
    for decodes, ctx, tokens, units, seconds in rows:
        assert fitted.batch_time_s(decodes, ctx, tokens, units) == pytest.approx(seconds,
                                                                                  rel=1e-3)


def test_no_step_logs_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no steps-"):
        fit_step_log(tmp_path, BASE)
    with pytest.raises(ValueError, match="at least 6 steps"):
        fit_steps(steps()[:3])


def test_a_logged_batch_lasts_until_the_next_batch_starts_unless_the_worker_idled(tmp_path):
    log = StepLog(tmp_path, 0)
    log.batch_started(10.0)
    log.batch_ran(4, 400, 0, 0, 10.0)
    log.batch_started(10.5)  # busy since: the first batch's period is 0.5 s
    log.batch_ran(2, 200, 64, 4096, 10.5)
    log.idle()  # the gap after the second batch is waiting: not logged
    log.batch_started(20.0)
    log.batch_ran(1, 100, 0, 0, 20.0)
    log.close()
    assert read_step_logs([tmp_path / "steps-0.csv"]) == [(4.0, 400.0, 0.0, 0.0, 0.5)]


def test_per_role_fit_takes_prefill_from_the_prefill_worker_and_decode_from_the_other(
        tmp_path, monkeypatch):
    """A 1P1D run: the prefill worker's batches are slower per token than TRUE says (it
    also exports KV), the decode worker's steps carry an import overhead; each side of the
    fitted model follows its own worker."""
    monkeypatch.setenv("PDSERVE_STEP_LOG", str(tmp_path / "pd"))
    prefill_log, decode_log = StepLog.from_env(0), StepLog.from_env(1)
    assert prefill_log is not None and decode_log is not None
    for tokens in (32, 64, 128, 256, 384, 512):
        for prior in (0, 256):
            units = attn_units(tokens, prior)
            prefill_log.record(0, 0, tokens, units, 1.5 * TRUE.prefill.time_s(tokens, units))
    for decodes in (1, 2, 4, 8, 16, 32):
        for context in (100, 400, 900):
            ctx = decodes * context
            decode_log.record(decodes, ctx, 0, 0, TRUE.decode.step_s(decodes, ctx) + 0.002)
    prefill_log.close()
    decode_log.close()
    fitted = fit_step_log_by_role(tmp_path / "pd", BASE, prefill_instance=0,
                                  decode_instance=1)
    assert fitted.prefill.time_s(256, attn_units(256, 0)) == pytest.approx(
        1.5 * TRUE.prefill.time_s(256, attn_units(256, 0)), rel=1e-3)
    assert fitted.decode.step_s(8, 8 * 400) == pytest.approx(
        TRUE.decode.step_s(8, 8 * 400) + 0.002, rel=1e-3)
    assert fitted.kv_capacity_tokens == BASE.kv_capacity_tokens
    with pytest.raises(ValueError, match="steps-7.csv"):
        fit_step_log_by_role(tmp_path / "pd", BASE, 0, 7)


def test_in_situ_fit_prices_the_mean_period_under_interference():
    """Periods in a deployment = the batch's time x interference (>= 1, right-skewed). The
    in-situ fit must price the mean period, which sets utilisation and TPOT; a
    relative-error fit would sit near the fastest periods."""
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(4):
        for decodes in (1, 2, 4, 8, 16, 32, 48, 64):
            for per_seq in (100, 400, 900):
                ctx = decodes * per_seq
                slow = 1.0 + rng.lognormal(mean=-1.0, sigma=1.0)  # mean about 1.6
                rows.append((decodes, ctx, 0, 0, TRUE.decode.step_s(decodes, ctx) * slow))
    _, decode = fit_steps(rows)
    measured = np.array([row[4] for row in rows])
    predicted = np.array([decode.step_s(d, c) for d, c, *_ in rows])
    assert predicted.mean() == pytest.approx(measured.mean(), rel=0.05)


def test_a_run_that_flips_roles_is_fitted_by_the_role_each_batch_ran_in(tmp_path):
    """Arrow-like: instance 0 prefills until t=100 and decodes after, instance 1 the other
    way round, each draining its old role's work after the flip. In a decode role a step
    costs TRUE + 2 ms (KV imports between steps); in a prefill role prefills cost 1.5x TRUE
    (exports) and draining decode steps TRUE. The per-role fit follows the role log; the
    per-instance split mixes each instance's decode steps from both roles."""
    directory = tmp_path / "arrow"
    logs = [StepLog(directory, 0), StepLog(directory, 1)]
    (directory / ROLES_FILE).write_text("at_s,instance,role\n50.0,0,prefill\n50.0,1,decode\n"
                                        "100.0,0,prefill->decode\n100.0,1,decode->prefill\n")
    prefills = [(0, 0, tokens, attn_units(tokens, prior)) for tokens in (32, 64, 128, 256)
                for prior in (0, 256)]
    decodes = [(batch, batch * context, 0, 0) for batch in (1, 4, 16) for context in (100, 900)]
    for phase, (prefilling, decoding) in enumerate(((0, 1), (1, 0))):
        start_s = 60.0 + 50.0 * phase  # before the flip, then after it
        for row in prefills:
            logs[prefilling].record(*row, 1.5 * TRUE.batch_time_s(*row), start_s)
        for row in decodes:
            logs[prefilling].record(*row, TRUE.batch_time_s(*row), start_s)  # draining
            logs[decoding].record(*row, TRUE.batch_time_s(*row) + 0.002, start_s)
    for log in logs:
        log.close()
    assert role_at(read_role_log(directory)[1], 120.0) is Role.D_TO_P
    assert role_at(read_role_log(directory)[1], 10.0) is Role.DECODE  # before any entry
    fitted = fit_step_log_by_role(directory, BASE)
    assert fitted.prefill.time_s(256, attn_units(256, 0)) == pytest.approx(
        1.5 * TRUE.prefill.time_s(256, attn_units(256, 0)), rel=1e-3)
    assert fitted.decode.step_s(8, 8 * 400) == pytest.approx(
        TRUE.decode.step_s(8, 8 * 400) + 0.002, rel=1e-3)
    (directory / ROLES_FILE).unlink()  # without the role log: by instance, roles mixed
    mixed = fit_step_log_by_role(directory, BASE, prefill_instance=0, decode_instance=1)
    assert mixed.decode.step_s(8, 8 * 400) < 0.9 * fitted.decode.step_s(8, 8 * 400)


def test_logged_batch_sizes_are_priced_at_their_measured_mean():
    """A decode worker whose period jumps between batch sizes (a ramp's log on shared CPU
    cores: 10.7 ms at B 5-8, 35.9 ms at B 9-15) is not a parabola; the residual table
    prices every logged size at its mean, linear between sizes seen too rarely, and holds
    its last entry beyond the largest."""
    rng = np.random.default_rng(0)
    rows, means = [], {}
    for b in range(1, 21):
        period = 0.002 + 0.001 * b + (0.02 if b >= 9 else 0.0)
        count = 2 if b == 12 else 12  # B = 12: too few rows to trust
        noisy = period + rng.normal(0, 0.0005, count)
        means[b] = float(noisy.mean())
        rows += [(b, b * 500, 0, 0, float(s)) for s in noisy]
    rows += [(2, 1000, 256, attn_units(256, 0), 0.02)] * 8  # mixed batches: not in the table
    _, decode = fit_steps(rows)
    assert len(decode.size_table_s) == 20
    for b in (1, 5, 8, 9, 15, 20):
        assert decode.step_s(b, b * 500) == pytest.approx(means[b], rel=1e-9)
    between = (decode.step_s(11, 11 * 500) + decode.step_s(13, 13 * 500)) / 2
    assert decode.step_s(12, 12 * 500) == pytest.approx(between, rel=0.02)  # interpolated
    without = DecodeCoeffs(decode.intercept_s, decode.per_seq_s, decode.per_context_token_s,
                           decode.batch1_extra_s, per_seq_squared_s=decode.per_seq_squared_s,
                           squared_until_batch=decode.squared_until_batch)
    assert abs(without.step_s(8, 4000) / means[8] - 1) > 0.1  # what the closed form missed
    assert decode.step_s(30, 15000) - without.step_s(30, 15000) == pytest.approx(
        decode.size_table_s[-1])  # beyond B = 20: the last residual holds
    one_size = [(4, 2000, 0, 0, 0.01)] * 10 + [(0, 0, 128, attn_units(128, 0), 0.01)] * 6
    assert fit_steps(one_size)[1].size_table_s == ()
