"""Traces (shipped and raw formats), rate scaling, windows and synthetic workloads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pdserve.workload.synthetic import sample_lengths, synthetic_workload
from pdserve.workload.traces import SHIPPED_TRACES, load_length_table, load_trace


def test_shipped_traces_load_with_their_sizes():
    sizes = {name: len(load_trace(name)) for name in SHIPPED_TRACES}
    assert sizes["azure-conv"] == 19366
    assert sizes["azure-code"] == 8819
    assert sizes["mooncake-conv"] == sizes["mooncake-sessions"] == 12031
    conv = load_trace("mooncake-conv")
    assert conv.hash_ids is not None and conv.hash_ids[0][:3] == (0, 1, 2)
    sessions = load_trace("mooncake-sessions")
    assert sessions.session_id is not None and sessions.round_index is not None


def test_length_table_is_not_a_trace_but_feeds_synthetic_lengths():
    with pytest.raises(ValueError, match="length table without arrival times"):
        load_trace("arxiv-lengths")
    inputs, outputs = load_length_table("arxiv-lengths")
    assert len(inputs) == len(outputs) == 28257


def test_rate_scale_divides_timestamps_and_window_clips_and_rebases():
    trace = load_trace("azure-conv")
    doubled = trace.scaled(2.0)
    assert doubled.arrival_s[-1] == pytest.approx(trace.arrival_s[-1] / 2)
    assert doubled.mean_rate_rps == pytest.approx(2 * trace.mean_rate_rps)
    window = trace.window(start_s=600, duration_s=60)
    expected = np.sum((trace.arrival_s >= 600) & (trace.arrival_s < 660))
    assert len(window) == expected > 0
    assert window.arrival_s[0] >= 0 and window.arrival_s[-1] < 60
    assert window.requests()[0].input_tokens == int(trace.input_tokens[trace.arrival_s >= 600][0])


def test_unknown_trace_is_a_clear_error():
    with pytest.raises(ValueError, match="neither a shipped trace"):
        load_trace("no-such-trace")


def test_azure_raw_csv(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                    "2023-11-16 18:15:46.6805900,374,44\n"
                    "2023-11-16 18:15:50.9951690,396,109\n"
                    "2023-11-16 18:15:51.2224670,0,5\n")  # empty prompt: dropped
    trace = load_trace(str(path))
    assert list(trace.input_tokens) == [374, 396]
    assert trace.arrival_s[1] == pytest.approx(4.314579, abs=1e-6)


def test_burstgpt_raw_csv_skips_failed_requests(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "45,ChatGPT,1087,0,1087,Conversation log\n"
                    "118,GPT-4,417,276,693,Conversation log\n")
    trace = load_trace(str(path))
    assert list(trace.arrival_s) == [0.0, 113.0]
    assert list(trace.output_tokens) == [18, 276]


def test_mooncake_jsonl(tmp_path):
    path = tmp_path / "mooncake.jsonl"
    rows = [{"timestamp": 1000, "input_length": 50, "output_length": 7, "hash_ids": [4, 5]},
            {"timestamp": 0, "input_length": 30, "output_length": 2, "hash_ids": [1]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    trace = load_trace(str(path))
    assert list(trace.arrival_s) == [0.0, 1.0]
    assert trace.hash_ids == ((1,), (4, 5))
    path.write_text('{"timestamp": 0}\n')
    with pytest.raises(ValueError, match="mooncake.jsonl:1: not a Mooncake trace record"):
        load_trace(str(path))


def test_poisson_and_gamma_arrivals_have_the_asked_rate_and_burstiness():
    poisson = synthetic_workload(20_000, rate_rps=8.0, lengths="fixed:512:128", seed=1)
    assert poisson.mean_rate_rps == pytest.approx(8.0, rel=0.03)
    gaps = np.diff(poisson.arrival_s)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, rel=0.05)
    bursty = synthetic_workload(20_000, 8.0, "fixed:512:128", arrival="gamma", cv=3.0, seed=1)
    gaps = np.diff(bursty.arrival_s)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(3.0, rel=0.1)
    again = synthetic_workload(20_000, 8.0, "fixed:512:128", arrival="gamma", cv=3.0, seed=1)
    assert np.array_equal(again.arrival_s, bursty.arrival_s)


def test_length_specs():
    rng = np.random.default_rng(0)
    inputs, outputs = sample_lengths("fixed:512:128", 3, rng)
    assert list(inputs) == [512] * 3 and list(outputs) == [128] * 3
    inputs, outputs = sample_lengths("uniform:10-20:1-2", 1000, rng)
    assert inputs.min() >= 10 and inputs.max() <= 20 and set(outputs) == {1, 2}
    inputs, _ = sample_lengths("lognormal:1000:100:0.5", 20_000, rng)
    assert inputs.mean() == pytest.approx(1000, rel=0.05)
    table_in, _ = load_length_table("arxiv-lengths")
    inputs, _ = sample_lengths("table:arxiv-lengths", 500, rng)
    assert set(inputs) <= set(table_in)
    with pytest.raises(ValueError, match="bad length spec 'fixed:5'"):
        sample_lengths("fixed:5", 1, rng)
