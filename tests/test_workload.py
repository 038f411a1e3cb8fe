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


def test_a_ramp_raises_the_rate_linearly_over_the_replay():
    from pdserve.workload.workload import Workload

    n = 1000
    even = Workload("even", np.arange(n, dtype=float), np.full(n, 100), np.full(n, 10))
    ramp = even.ramped(1.0, 3.0, 100.0)  # 1 -> 3 requests per second over 100 s
    assert len(ramp) == 200  # (1 + 3) / 2 x 100 s of the trace
    assert ramp.arrival_s[0] == 0 and ramp.arrival_s[-1] < 100
    assert np.all(np.diff(ramp.arrival_s) > 0)
    # trace time at t = 50: 50 + 2 x 50^2 / 200 = 75 arrivals in the first half
    assert np.sum(ramp.arrival_s < 50) == 75
    first, last = np.diff(ramp.arrival_s)[[0, -1]]  # gaps at rates ~1.01 and ~2.99 per s
    assert first == pytest.approx(1 / 1.01, rel=0.01) and last == pytest.approx(1 / 2.99, rel=0.01)
    assert np.allclose(even.ramped(2.0, 2.0, 100.0).arrival_s,
                       even.scaled(2.0).window(0.0, 100.0).arrival_s)
    down = even.ramped(3.0, 1.0, 100.0)  # a ramp down takes in the same span
    assert len(down) == 200 and down.arrival_s[-1] < 100
    with pytest.raises(ValueError, match="positive"):
        even.ramped(1.0, -2.0, 100.0)


def test_bench_replays_a_ramp_when_asked():
    from argparse import Namespace

    from pdserve.cli import bench_workload

    args = Namespace(trace="azure-conv", start=600.0, rate_scale=0.4, ramp_to=2.0,
                     duration=90.0, max_input_tokens=768, max_output_tokens=64)
    ramp = bench_workload(args)
    trace = load_trace("azure-conv").window(600.0).window(0.0, (0.4 + 2.0) / 2 * 90.0)
    assert len(ramp) == len(trace) and ramp.input_tokens.max() <= 768
    assert np.sum(ramp.arrival_s >= 45) > 2 * np.sum(ramp.arrival_s < 45)  # the load rises
    flat = bench_workload(Namespace(**{**vars(args), "ramp_to": 0.0}))
    assert len(flat) == len(load_trace("azure-conv").window(600.0).scaled(0.4)
                            .window(0.0, 90.0))


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


@pytest.mark.parametrize("name, content, message", [
    ("header.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", "a header but no requests"),
    ("columns.csv", "arrival_s,input_tokens\n0,5\n", "no output_tokens column"),
    ("rounds.csv", "arrival_s,input_tokens,output_tokens,session_id\n0,5,5,1\n",
     "no round column"),
    ("nan.csv", "arrival_s,input_tokens,output_tokens\n0,5,5\nnan,5,5\n",
     "arrival times must be finite"),  # NaN compares as not decreasing: the run never ended
    ("inf.csv", "arrival_s,input_tokens,output_tokens\n0,5,5\ninf,5,5\n",
     "arrival times must be finite"),
    ("huge.csv", "arrival_s,input_tokens,output_tokens\n0,1" + "0" * 30 + ",5\n",
     "malformed row"),
    ("bytes.csv", "arrival_s,input_tokens,output_tokens\n0,5,5\n\udcff,5,5\n",
     "cannot read trace"),
    ("nan.jsonl", '{"timestamp": NaN, "input_length": 5, "output_length": 5}\n',
     "arrival times must be finite"),
    ("float.jsonl", '{"timestamp": 0, "input_length": 10.7, "output_length": 5}\n',
     "input_length must be a whole number, got 10.7"),  # was silently 10
    ("bool.jsonl", '{"timestamp": 0, "input_length": true, "output_length": 5}\n',
     "input_length must be a whole number"),
    ("huge.jsonl", '{"timestamp": 0, "input_length": 1e400, "output_length": 5}\n',
     "input_length must be a whole number"),
    ("hashes.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 5, '
     '"hash_ids": "abc"}\n', "hash_ids must be a list"),  # was hashes 'a', 'b', 'c'
    ("list.jsonl", "[1, 2]\n", "a record is a JSON object"),
    ("burst.csv", "Timestamp,Request tokens,Response tokens\n0,5,0\n1,5,0\n",
     "no row has both prompt and response tokens"),  # was an IndexError's text
    ("azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,0,5\n",
     "no row has both prompt and response tokens"),
])
def test_a_malformed_trace_file_is_a_clear_error_naming_it(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(ValueError, match=message) as error:
        load_trace(str(path))
    assert name in str(error.value)


def test_a_trace_file_with_a_byte_order_mark_reads_as_without_one(tmp_path):
    text = "arrival_s,input_tokens,output_tokens\n0,5,6\n1.5,7,8\n"
    plain, marked = tmp_path / "plain.csv", tmp_path / "marked.csv"
    plain.write_text(text)
    marked.write_bytes(b"\xef\xbb\xbf" + text.encode())  # as spreadsheets save CSV
    a, b = load_trace(str(plain)), load_trace(str(marked))
    assert list(b.arrival_s) == list(a.arrival_s) == [0.0, 1.5]
    assert list(b.input_tokens) == [5, 7] and list(b.output_tokens) == [6, 8]


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


def test_a_repeated_trace_keeps_its_rate_and_its_copies_share_no_session_or_prefix():
    from pdserve.workload.workload import Workload
    trace = Workload("t", np.array([10.0, 11.0, 13.0]), np.array([5, 6, 7]),
                     np.array([1, 2, 3]), session_id=np.array([0, -1, 0]),
                     round_index=np.array([0, 0, 1]), hash_ids=((1, 2), (), (1, 2, 4)))
    tripled = trace.repeated(3)
    assert len(tripled) == 9
    # copies follow each other one mean gap (1.5 s) after the last arrival
    assert tripled.arrival_s.tolist() == [10, 11, 13, 14.5, 15.5, 17.5, 19, 20, 22]
    assert tripled.mean_rate_rps == pytest.approx(trace.mean_rate_rps)
    assert tripled.input_tokens.tolist() == [5, 6, 7] * 3
    assert tripled.session_id.tolist() == [0, -1, 0, 1, -1, 1, 2, -1, 2]
    assert tripled.round_index.tolist() == [0, 0, 1] * 3
    assert tripled.hash_ids[3:6] == ((6, 7), (), (6, 7, 9))
    assert trace.repeated(1) is trace
    with pytest.raises(ValueError, match="positive integer"):
        trace.repeated(0)


def test_the_repeat_setting_replays_the_trace_before_the_window():
    from pdserve.config import Config
    from pdserve.sim.runner import load_workload
    once = load_workload(Config().with_values({"workload.trace": "azure-code"}))
    twice = load_workload(Config().with_values({"workload.trace": "azure-code",
                                                "workload.repeat": 2,
                                                "workload.start_s": once.span_s / 2}))
    assert len(twice) == len(once) + int(np.sum(once.arrival_s - once.arrival_s[0]
                                                >= once.span_s / 2))
    with pytest.raises(ValueError, match="workload.repeat"):
        Config().with_values({"workload.repeat": 0})


def test_a_trace_file_with_sessions_is_read_as_multi_round_sessions(tmp_path):
    """A pdserve CSV with session ids and rounds was chained with no history and no delay:
    round 1, at 100 s in the file, was sent the moment round 0 finished (0.12 s). It is now
    read as the shipped mooncake-sessions is: each round sent the file's gap after the
    previous one finished, its history that round's prompt and output."""
    from pdserve.config import Config
    from pdserve.sim.runner import Experiment

    path = tmp_path / "sessions.csv"
    path.write_text("arrival_s,input_tokens,output_tokens,session_id,round\n"
                    "0,100,20,1,0\n50,30,5,-1,0\n100,150,20,1,1\n200,90,20,3,0\n"
                    "230,60,20,1,2\n")
    trace = load_trace(str(path))
    assert trace.history_tokens.tolist() == [0, 0, 120, 0, 59]  # capped below its prompt
    assert trace.tool_delay_s.tolist() == [0, 0, 100, 0, 130]
    experiment = Experiment.from_config(Config().with_values({"workload.trace": str(path)}))
    done = {r.request_id: r for r in experiment.simulate().requests}
    assert done[2].arrival_s == pytest.approx(done[0].finish_s + 100)
    assert done[4].arrival_s == pytest.approx(done[2].finish_s + 130)
    assert done[1].arrival_s == 50 and done[3].arrival_s == 200  # first rounds, singles


def test_bench_says_a_session_trace_is_replayed_as_single_requests():
    """`pdserve bench` sends every row at its arrival time; `simulate` chains a session's
    rounds: a replay of a session trace warns that it does not."""
    from pdserve.cli import session_replay_note
    from pdserve.workload.workload import Workload

    sessions = Workload("s", np.array([0.0, 1.0, 2.0, 3.0]), np.array([5, 6, 7, 8]),
                        np.array([1, 2, 3, 4]), session_id=np.array([0, 0, -1, 1]),
                        round_index=np.array([0, 1, 0, 0]))
    assert session_replay_note(sessions).startswith("the trace holds 1 later round of 2 sessions;")
    assert session_replay_note(load_trace("azure-conv")) is None
    singles = Workload("t", np.array([0.0, 1.0]), np.array([5, 6]), np.array([1, 2]),
                       session_id=np.array([0, 1]), round_index=np.array([0, 0]))
    assert session_replay_note(singles) is None  # first rounds only: nothing to chain
