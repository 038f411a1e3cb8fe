"""The measured spread of a deployment in the simulator: prefill batches drawn around the
model's mean (`sim/step_noise.py`) and the control plane's latency per request."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import make_perf

from pdserve.config import Config
from pdserve.perf.fit import fit_steps
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs
from pdserve.perf.step_log import prefill_step_cv
from pdserve.sim.runner import Experiment
from pdserve.types import Request, add_control_latency, attn_units
from pdserve.workload.workload import Workload


def sparse_prefills(count: int = 400) -> Workload:
    """512-token prompts 1 s apart, one output token: TTFT = one prefill batch, no queue."""
    return Workload("sparse", np.arange(count) * 1.0, np.full(count, 512), np.full(count, 1))


def ttfts(perf: PerfModel, workload: Workload, seed: int = 0, instances: int = 1) -> np.ndarray:
    config = Config().with_values({"policy.name": "colocated", "cluster.instances": instances,
                                   "cluster.prefill": instances, "cluster.decode": instances,
                                   "seed": seed})
    result = Experiment(config, workload, perf).simulate(1.0)
    return np.array([r.first_token_s - r.arrival_s for r in result.requests])


def test_prefill_batches_keep_their_mean_and_take_the_models_spread():
    perf = make_perf()
    exact = ttfts(perf, sparse_prefills())
    assert np.ptp(exact) < 1e-9  # no spread: every batch at its mean
    noisy = ttfts(replace(perf, prefill_step_cv=0.2), sparse_prefills())
    assert noisy.mean() == pytest.approx(exact[0], rel=0.03)
    assert noisy.std() / noisy.mean() == pytest.approx(0.2, rel=0.15)
    assert np.array_equal(noisy, ttfts(replace(perf, prefill_step_cv=0.2), sparse_prefills()))
    assert not np.array_equal(noisy, ttfts(replace(perf, prefill_step_cv=0.2),
                                           sparse_prefills(), seed=1))


def test_spread_lengthens_the_ttft_tail_under_load():
    """Queueing turns slow batches into waits for the requests behind them: P90 grows."""
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(0.12, 500))
    workload = Workload("load", arrivals, np.full(500, 512), np.full(500, 8))
    perf = make_perf()
    exact = ttfts(perf, workload, instances=2)
    noisy = ttfts(replace(perf, prefill_step_cv=0.25), workload, instances=2)
    assert np.percentile(noisy, 90) > 1.05 * np.percentile(exact, 90)


def test_the_step_fit_prices_the_prefill_paths_own_overhead_and_measures_the_spread():
    truth = PerfModel("truth", PrefillCoeffs(0.007, 1e-4, 8e-8),
                      DecodeCoeffs(0.005, 9e-4, 7e-7), make_perf().transfer, 4096, 32768)
    rows, factors = [], (0.8, 1.2)
    for decodes in (0, 1, 2, 4):
        for tokens in (0, 3, 64, 256, 512):
            if decodes == tokens == 0:
                continue
            for factor in factors:
                units = attn_units(tokens, 0) if tokens else 0
                seconds = truth.batch_time_s(decodes, decodes * 300, tokens, units)
                rows.append((decodes, decodes * 300, tokens, units,
                             seconds * (factor if tokens else 1.0)))
    prefill, decode = fit_steps(rows)
    assert decode.intercept_s == pytest.approx(0.005, rel=0.02)
    assert prefill.intercept_s == pytest.approx(0.007, rel=0.1)  # 2 ms above a decode step
    fitted = replace(truth, prefill=prefill, decode=decode)
    assert prefill_step_cv(rows, fitted) == pytest.approx(0.2, rel=0.1)
    assert prefill_step_cv(rows[:5], fitted) == 0.0  # too few batches to tell


def test_control_latency_draws_each_requests_own_with_the_asked_median_and_p90():
    requests = [Request(i, 0.0, 10, 2) for i in range(4000)]
    for request in requests:
        request.first_token_s = request.finish_s = 0.0
    add_control_latency(requests, 0.008, p90_s=0.016, seed=5)
    shifts = np.array([r.first_token_s for r in requests])
    assert np.median(shifts) == pytest.approx(0.008, rel=0.05)
    assert np.percentile(shifts, 90) == pytest.approx(0.016, rel=0.05)
    assert all(r.finish_s == r.first_token_s for r in requests)  # TPOT unchanged
    with pytest.raises(ValueError, match="control_latency_p90_s"):
        Config().with_values({"sim.control_latency_s": 0.01, "sim.control_latency_p90_s": 0.005})
    with pytest.raises(ValueError, match="control_latency_p90_s"):
        Config().with_values({"sim.control_latency_p90_s": 0.02})  # a spread with no median
