"""`pdserve plan --policy all`: the search spaces, the screen, the multi-fidelity search (time
limit, known optimum), the JSON record and the winner's config."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest
import yaml

from pdserve.cli import main
from pdserve.config import Config
from pdserve.metrics.goodput import search_goodput
from pdserve.metrics.summary import summarize
from pdserve.perf.presets import perf_model
from pdserve.planning import planner
from pdserve.planning.candidates import (
    Deployment,
    InstanceGroup,
    enumerate_candidates,
    feasible_degrees,
)
from pdserve.planning.fidelity import Trial, WorkloadSamples, run_trial
from pdserve.planning.multi_fidelity import SearchBudget
from pdserve.planning.outcome import Interval, policy_rows, verdict
from pdserve.planning.run_length import (
    LIFETIME_TPOT_CAP_S,
    LONG,
    SHORT,
    TTFT_RUN_CAP_S,
    Fidelity,
    RunScale,
    request_lifetime_s,
)
from pdserve.planning.screen import Screen, WorkloadShape
from pdserve.planning.splits import split_counts
from pdserve.policies.search_spaces import CANNOT_COMPOSE, SEARCH_SPACES, spaces_for
from pdserve.sim.runner import Experiment, load_workload
from pdserve.types import SLO

# prompts of 4,096 tokens, 64 output tokens, TPOT SLO 12 ms on H800: a decode step of a few
# sequences takes about 10 ms, one that also carries a prefill chunk of 256 tokens or more
# about 15 ms, so only instances that never mix the phases serve this at a useful rate
PREFILL_HEAVY = Config().with_values({
    "workload.trace": "synthetic", "workload.synthetic_lengths": "fixed:4096:64",
    "workload.synthetic_requests": 600, "workload.synthetic_rate_rps": 5.0,
    "perf.model": "llama-3.1-8b", "perf.gpu": "h800", "perf.tp": 1,
    "slo.ttft_s": 2.0, "slo.tpot_s": 0.012})
# prompts of 16 tokens, 1,024 output tokens: the prefill work is nothing, so a GPU given to
# prefill alone idles and disaggregation halves the decode capacity of 2 GPUs
DECODE_HEAVY = PREFILL_HEAVY.with_values({
    "workload.synthetic_lengths": "fixed:16:1024", "workload.synthetic_requests": 2000,
    "workload.synthetic_rate_rps": 10.0, "slo.tpot_s": 0.02})
EMPTY = summarize([], SLO(1.0, 1.0))


def H800_8B(tp: int, max_batch_size: int = 256):  # noqa: N802 (a model, named as one)
    return perf_model("llama-3.1-8b", "h800", tp, max_batch_size=max_batch_size)


FAST_SHORT = Fidelity("short", duration_s=20.0, min_requests=200, rel_tol=0.1, step=1.2)
FAST_LONG = Fidelity("long", duration_s=40.0, min_requests=400, rel_tol=0.05, step=1.15)


def budget(limit_s: float, seeds: int = 2, verify: int = 2, shortlist: int = 2) -> SearchBudget:
    return SearchBudget(limit_s, 2, shortlist, verify, seeds, FAST_SHORT, FAST_LONG)


def test_every_space_builds_and_each_pair_that_cannot_compose_fails_for_its_reason():
    base = PREFILL_HEAVY.with_values({"workload.synthetic_requests": 20})
    for space in SEARCH_SPACES.values():
        candidates = enumerate_candidates(space, 4, [1])
        assert candidates, space.name
        for candidate in (candidates[0], candidates[-1]):
            result = Experiment.from_config(candidate.config(base)).simulate()
            assert all(r.finished for r in result.requests), candidate.describe()
    stated = [pair for pair in CANNOT_COMPOSE if pair.config]
    assert len(stated) >= 4
    for pair in stated:
        with pytest.raises(ValueError):
            Experiment.from_config(base.with_values(pair.config)).simulate()
    assert {s.name for s in spaces_for("all", sessions=False)} == set(SEARCH_SPACES) - {
        "continuum"}
    assert [s.name for s in spaces_for("vllm,colocated", False)] == ["static-pd", "colocated"]
    with pytest.raises(ValueError, match="no search space"):
        spaces_for("nonsense", False)


def test_candidates_use_every_gpu_at_each_degree_the_model_fits():
    def h800(model: str):
        return lambda tp: perf_model(model, "h800", tp)

    assert feasible_degrees("llama-3.1-8b", 8, h800("llama-3.1-8b")) == [1, 2, 4, 8]
    # TP 2: 70 GB of weights on 2 x 80 GiB leave 21K tokens of KV once vLLM's 0.92
    # utilisation, activations and CUDA graphs are reserved (the measured default's memory
    # model; AIConfigurator deploys it too); TP 1 leaves none
    assert feasible_degrees("llama-3.1-70b", 8, h800("llama-3.1-70b")) == [2, 4, 8]
    assert 15_000 < perf_model("llama-3.1-70b", "h800", 2).kv_capacity_tokens < 30_000
    assert feasible_degrees("llama-3.1-70b", 8, lambda tp: perf_model(
        "llama-3.1-70b", "h800", tp, "vidur")) == [2, 4, 8]
    for space in SEARCH_SPACES.values():
        for candidate in enumerate_candidates(space, 8, [1, 2, 4, 8]):
            reserve = candidate.settings.get("cluster.reserve", 0)
            assert candidate.deployment.gpus + reserve * candidate.settings["perf.tp"] == 8
            assert candidate.gpus == 8  # goodput per GPU counts FlowKV's reserve too
    static = enumerate_candidates(SEARCH_SPACES["static-pd"], 8, [1, 2])
    # 7 + 3 splits, 2 chunk sizes
    assert len(static) == 20


def test_taichis_aggregation_points_share_the_colocated_runs():
    colocated = {c.values for c in enumerate_candidates(SEARCH_SPACES["colocated"], 4, [1, 2])}
    taichi = enumerate_candidates(SEARCH_SPACES["taichi"], 4, [1, 2])
    twins = [c for c in taichi if c.simulates_as]
    assert twins and all(c.simulates_as in colocated for c in twins)
    assert all(c.deployment.groups[0].prefill and c.deployment.groups[0].decode
               and len(c.deployment.groups) == 1 for c in twins)
    [twin] = [c for c in twins if c.settings["perf.tp"] == 1
              and c.settings["policy.taichi.chunk_p_tokens"] == 1024]
    base = PREFILL_HEAVY.with_values({"workload.synthetic_requests": 60})
    ours = summarize(Experiment.from_config(twin.config(base)).simulate().requests,
                     SLO(2.0, 0.012))
    theirs = summarize(Experiment.from_config(base.with_values(dict(twin.simulates_as)))
                       .simulate().requests, SLO(2.0, 0.012))
    assert ours == theirs


def test_the_screen_prices_a_prefill_bound_deployment_as_the_model_does():
    config = PREFILL_HEAVY.with_values({"workload.synthetic_lengths": "fixed:2048:1"})
    shape = WorkloadShape.of(load_workload(config))
    screen = Screen(H800_8B, shape, SLO(100.0, 1.0), 0.9, 256)
    one_prefill = Deployment((InstanceGroup(1, 1, 2048, True, False),
                              InstanceGroup(3, 1, 2048, False, True)))
    perf = perf_model("llama-3.1-8b", "h800", 1)
    by_hand = 1 / perf.batch_time_s(0, 0, 2048, 2048 * 2048)  # one full chunk per prompt
    estimate = screen.estimate(one_prefill)
    assert estimate.capacity_rps == pytest.approx(by_hand, rel=0.01)
    two = Deployment((InstanceGroup(2, 1, 2048, True, False),
                      InstanceGroup(2, 1, 2048, False, True)))
    assert screen.estimate(two).capacity_rps == pytest.approx(2 * by_hand, rel=0.01)


def test_slos_that_do_not_bind_neither_crash_the_screen_nor_size_endless_runs(capsys):
    """An infinite TPOT SLO let the screen's fixed point run to an infinite step (an
    OverflowError); a TPOT SLO of 1e6 s sized each run at 10^8 s of arrivals (every trial
    failed: "no candidate meets the SLOs"). The plan refuses infinite SLOs outright."""
    shape = WorkloadShape.of(load_workload(DECODE_HEAVY))
    deployment = Deployment((InstanceGroup(2, 1, 2048, True, False),
                             InstanceGroup(6, 1, 2048, False, True)))
    bounded = Screen(H800_8B, shape, SLO(2.0, 0.1), 0.9, 256).estimate(deployment)
    unbounded = Screen(H800_8B, shape, SLO(2.0, math.inf), 0.9, 256).estimate(deployment)
    assert 0 < bounded.capacity_rps <= unbounded.capacity_rps < math.inf
    workload = load_workload(DECODE_HEAVY)
    mean_output = float(workload.output_tokens.mean())
    assert request_lifetime_s(workload, 0.05) == pytest.approx(0.05 * mean_output)
    assert request_lifetime_s(workload, 1e6) == request_lifetime_s(workload, math.inf) == \
        pytest.approx(LIFETIME_TPOT_CAP_S * mean_output)
    assert main(["plan", "--tpot-slo", "inf", "--no-progress"]) == 2
    assert "an infinite one (TTFT 2s, TPOT infs)" in capsys.readouterr().err


def test_a_loose_ttft_slo_lengthens_the_runs_until_an_overload_fails_it(capsys):
    """At TTFT 30 s (FlowKV's setup: 1,024/256 tokens on A100s) the long runs lasted two
    request lifetimes (~100 s of arrivals) and a queue growing for 100 s still met the SLO:
    one colocated A100 "sustained" 13.2 req/s. A run now lasts TTFT SLO / (target x the
    search's tolerance), so a rate the tolerance above capacity fails: the goodput is that of
    runs four times as long, within the tolerance. A TTFT SLO of 2 s keeps the 80-s runs."""
    tight = RunScale(lifetime_s=5.0, ttft_slo_s=2.0, target=0.9)
    assert LONG.duration_for(tight) == LONG.duration_s == 80.0
    loose = RunScale(lifetime_s=51.2, ttft_slo_s=30.0, target=0.9)
    assert LONG.duration_for(loose) == pytest.approx(30.0 / (0.9 * 0.04))
    assert SHORT.duration_for(loose) == pytest.approx(30.0 / (0.9 * 0.1))
    assert replace(LONG, ttft_overload=0.0).duration_for(loose) == pytest.approx(102.4)
    never = Config().with_values({"slo.ttft_s": 1e9})
    assert RunScale.of(load_workload(never), never).ttft_slo_s == TTFT_RUN_CAP_S

    base = Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_lengths": "fixed:1024:256",
        "workload.synthetic_requests": 400_000, "workload.synthetic_rate_rps": 10.0,
        "perf.model": "llama-3.1-8b", "perf.gpu": "a100", "perf.tp": 1,
        "slo.ttft_s": 30.0, "slo.tpot_s": 0.2})
    samples = WorkloadSamples(base, 1)
    [candidate] = [c for c in enumerate_candidates(SEARCH_SPACES["colocated"], 1, [1])
                   if c.settings["instance.chunk_size_tokens"] == 2048]

    def goodput(fidelity: Fidelity) -> float:
        return run_trial(Trial(0, candidate, fidelity, 0, guess_rps=10.0), samples).goodput_rps

    longer = replace(LONG, duration_s=4 * LONG.duration_for(samples.scale),
                     lifetimes=0.0)
    settled, bounded = goodput(longer), goodput(LONG)
    assert bounded == pytest.approx(settled, rel=LONG.rel_tol)
    assert goodput(replace(LONG, ttft_overload=0.0)) > 1.2 * settled
    # beyond the cap (a long run: 60 / (0.9 x 0.04) = 1,667 s) the plan says what can pass
    assert main(["plan", "--ttft-slo", "1000", "--policy", "colocated", "--gpus", "1",
                 "--time-limit", "4", "--jobs", "1", "--no-progress"]) == 1  # no winner in 4 s
    assert ("runs are sized for a TTFT SLO of 60s (a long one lasts 1,667s of arrivals); at "
            "1000s a rate up to 67% above") in capsys.readouterr().out


def test_plan_inputs_that_crashed_or_ran_away_are_answered_at_once(tmp_path, capsys):
    """Found by a probe: --tp above --gpus and a trace arriving at one instant were a
    ZeroDivisionError; --json into no directory failed after the whole search; a TPOT SLO
    below every decode step ran 27 s into 3.5 GB (the screen's capacity was 0 too, so the
    search crawled up from 0.001 req/s) before saying the time limit passed."""
    assert main(["plan", "--gpus", "3", "--gpu", "a100", "--model", "llama-3.1-70b",
                 "--no-progress"]) == 2  # names the degree that fits and where
    assert "TP 2 fits on 2 of them: --gpus 2" in capsys.readouterr().err
    burst = tmp_path / "burst.csv"
    burst.write_text("arrival_s,input_tokens,output_tokens\n0,500,100\n0,300,50\n")
    for argv, message in (
            (["--gpus", "5", "--tp", "8"], "a tensor-parallel degree of 8 needs 8 GPUs"),
            (["--trace", str(burst)], "has none to scale (2 requests arriving at one instant)"),
            (["--json", str(tmp_path / "missing" / "plan.json")], "does not exist")):
        assert main(["plan", "--no-progress", *argv]) == 2
        assert message in capsys.readouterr().err
    started = time.monotonic()
    assert main(["plan", "--tpot-slo", "0.002", "--policy", "colocated", "--gpus", "2",
                 "--shortlist", "1", "--verify", "0", "--jobs", "1", "--time-limit", "60",
                 "--no-progress"]) == 1
    assert "no candidate meets the SLOs at any rate tried" in capsys.readouterr().out
    assert time.monotonic() - started < 30  # was the whole time limit, then "give it more"


def test_a_goodput_that_only_reached_the_search_ceiling_is_flagged(capsys):
    """60 requests of a trace: any rate serves them as a burst, so every rate tried passes
    and the plan's "goodput" (over 1,000,000 req/s on 8 GPUs) is only the search's ceiling."""
    assert main(["plan", "--max-requests", "60", "--policy", "colocated", "--gpus", "2",
                 "--shortlist", "1", "--verify", "0", "--jobs", "1", "--time-limit", "60",
                 "--no-progress"]) == 0
    assert ("warning: colocated: every rate the search tried met the SLOs, up to its "
            "ceiling") in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--policy", "taichi", "--gpus", "4"], "--gpus: not used by pdserve plan --policy taichi"),
    (["--policy", "ampd", "--gpus", "4", "--json", "x.json", "--time-limit", "5"],
     "--json, --time-limit: not used by pdserve plan --policy ampd"),
    (["--instances", "4", "--top", "3"],
     "--instances, --top: not used by pdserve plan --policy all"),
])
def test_options_a_planner_does_not_read_are_refused(argv, message, capsys):
    """TaiChi's planner placed 8 instances under --gpus 4 and wrote no --json, silently."""
    assert main(["plan", "--no-progress", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_winner_config_replays_a_short_trace_as_often_as_the_plan_did(tmp_path, capsys):
    """A trace shorter than a confirmation run is replayed end to end in the plan; the
    winner.yaml replayed it once, so `simulate --config` served a burst (+36 % on 64 GPUs).
    200 requests at ~2 req/s, one GPU: the winner's config repeats the trace and its own
    goodput search lands inside the plan's interval."""
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(0.5, 200))
    trace = tmp_path / "short.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(
        f"{t:.3f},{rng.integers(200, 2000)},{rng.integers(50, 300)}\n" for t in arrivals))
    out = tmp_path / "plan"
    assert main(["plan", "--trace", str(trace), "--policy", "colocated", "--gpus", "1",
                 "--shortlist", "1", "--verify", "1", "--seeds", "2", "--jobs", "1",
                 "--time-limit", "120", "--no-progress", "--out", str(out)]) == 0
    capsys.readouterr()
    config = Config.from_yaml(out / "winner.yaml")
    assert config.workload.repeat > 1
    low, high = json.loads((out / "summary.json").read_text())["winner"]["ci95"]
    experiment = Experiment.from_config(config)
    goodput = experiment.goodput().rate_rps
    assert low * 0.97 <= goodput <= high * 1.03, (low, goodput, high)


def test_a_session_plan_draws_as_many_sessions_as_its_runs_need():
    """Capped at the default 1,000 sessions, a session plan's runs were bursts: the winner
    served "1,500,134 req/s" on 8 GPUs."""
    import argparse

    from pdserve.planning.planner import SYNTHETIC_DRAW_MAX, uncapped_synthetic

    sessions = Config().with_values({"workload.trace": "agent:toolbench"})
    plain = argparse.Namespace()
    assert uncapped_synthetic(sessions, plain).workload.synthetic_requests == \
        SYNTHETIC_DRAW_MAX // 8
    given = argparse.Namespace(**{"workload.synthetic_requests": 300})
    assert uncapped_synthetic(sessions.with_values({"workload.synthetic_requests": 300}),
                              given).workload.synthetic_requests == 300


def test_the_screen_is_within_a_fifth_of_the_simulation_where_it_models_everything():
    """Disaggregated, Poisson arrivals, one length: queueing is all it leaves out."""
    shape = WorkloadShape.of(load_workload(PREFILL_HEAVY))
    screen = Screen(H800_8B, shape, SLO(2.0, 0.012), 0.9, 256)
    [candidate] = [c for c in enumerate_candidates(SEARCH_SPACES["static-pd"], 2, [1])
                   if c.settings["instance.chunk_size_tokens"] == 2048]
    simulated = Experiment.from_config(candidate.config(PREFILL_HEAVY)).goodput().rate_rps
    estimate = screen.estimate(candidate.deployment)
    assert estimate.goodput_rps == pytest.approx(simulated, rel=0.2)
    assert estimate.tpot_s <= 0.012 and estimate.ttft_p90_s < 2.0


def test_goodput_search_from_a_guess_finds_the_same_rate_in_fewer_runs():
    def run(scale: float):  # attainment 1 up to scale 3.3, then 0
        return replace(EMPTY, slo_attainment=1.0 if scale <= 3.3 else 0.0)

    plain = search_goodput(run, 2.0, 0.9, 0.02)
    guessed = search_goodput(run, 2.0, 0.9, 0.02, start_scale=3.0, step=1.25)
    for result in (plain, guessed):
        assert 3.3 / 1.02 <= result.rate_scale <= 3.3
    assert len(guessed.points) < len(plain.points)
    with pytest.raises(ValueError):
        search_goodput(run, 2.0, 0.9, 0.02, step=1.0)


def test_intervals_and_ties():
    a = Interval.of([10.0, 11.0, 12.0])
    assert a.mean == 11.0 and a.low < 10.0 and a.high > 12.0  # t(2) = 4.30: wide
    assert Interval.of([5.0]).low == Interval.of([5.0]).high == 5.0
    same_step = Interval.of([5.0, 5.0, 5.0], resolution=0.04)  # seeds on one search step
    assert (same_step.low, same_step.high) == (5.0, pytest.approx(5.2))
    assert a.overlaps(Interval.of([12.0, 13.0, 14.0]))
    assert not a.overlaps(Interval.of([20.0, 20.5, 21.0]))
    spread = Interval.of([0.0, 20.8])  # a rate is never negative
    assert spread.low == 0.0 and spread.high > 20.8


def test_the_time_limit_is_honoured():
    base = Config().with_values({"perf.gpu": "h800"})  # azure-conv on 8 GPUs: minutes of work
    started = time.monotonic()
    outcome, screened = planner.search(base, "all", 8, budget(4.0))
    wall = time.monotonic() - started
    assert screened > 300
    assert outcome.stopped_at_limit and outcome.wall_s <= 4.0
    assert wall < 4.0 + 3.0  # plus loading the trace and screening, before the clock starts


def test_a_plan_on_a_thousand_gpus_screens_a_grid_of_splits_within_its_time_limit(capsys):
    """Every split up to 64 instances; above, the ends and 1/64 steps (1,024 GPUs had
    314,000 candidates and screened for 92 s whatever the time limit). A screen that still
    outlasts the limit says so, instead of running on."""
    assert split_counts(2) == [1] and split_counts(64) == list(range(1, 64))
    grid = split_counts(1024)
    assert grid[:16] == list(range(1, 17)) and grid[-16:] == list(range(1008, 1024))
    assert grid == sorted(set(grid)) and len(grid) < 100
    assert max(b - a for a, b in zip(grid, grid[1:], strict=False)) == 1024 // 64
    static = enumerate_candidates(SEARCH_SPACES["static-pd"], 1024, [1])
    assert len(static) == 2 * len(grid)  # two chunk sizes
    started = time.monotonic()
    assert main(["plan", "--gpus", "1024", "--gpu", "h100", "--trace", "synthetic",
                 "--time-limit", "4", "--no-progress"]) == 2
    assert "the time limit (4s) passed while screening" in capsys.readouterr().err
    assert time.monotonic() - started < 4 + 10  # building the candidates is not cut short


@pytest.mark.parametrize(("base", "spaces", "disaggregated"), [
    (PREFILL_HEAVY.with_values({"slo.tpot_s": 0.008}), "colocated,static-pd", True),
    (DECODE_HEAVY, "colocated,static-pd,taichi", False)])
def test_the_planner_finds_the_optimum_known_by_construction(base, spaces, disaggregated):
    """Aggregation against disaggregation where the construction decides. Prefill-heavy:
    on the H800 a decode step of these batches takes 6.3-7.6 ms and one that also carries
    the smallest chunk (256 tokens) 9.6-10 ms, so under an 8 ms TPOT SLO a colocated
    instance may spend only about a third of its steps on prefill chunks (16 a prompt),
    while 1P1D's decode instance never does. (At 12 ms, as before the measured-kernel
    model, 256-token chunks fit and colocated won.)"""
    outcome, _ = planner.search(base, spaces, 2, budget(120.0))
    assert not outcome.stopped_at_limit
    rows = policy_rows(outcome)
    result = verdict(rows)
    assert result.winner is not None and result.winner.fidelity == "long"
    assert result.winner.candidate.deployment.moves_kv is disaggregated
    other_kind = [r for r in rows if r.candidate.deployment.moves_kv is not disaggregated]
    best_other = max(other_kind, key=lambda r: r.per_gpu.mean)
    assert result.winner.per_gpu.mean > 1.3 * best_other.per_gpu.mean  # not by a hair
    assert best_other.space not in result.tied_with
    if "taichi" in spaces:  # its own sliders span both ends: its best is the same kind
        [taichi] = [r for r in rows if r.space == "taichi"]
        assert taichi.candidate.deployment.moves_kv is disaggregated


def test_plan_writes_its_json_record_and_a_config_that_simulate_runs(tmp_path, capsys):
    record, out = tmp_path / "plan.json", tmp_path / "plan"
    # TPOT 9 ms: a decode step alone takes ~7 ms, any colocated step carrying a chunk more,
    # so static-pd wins (5.4 vs 4.0 req/s per GPU on the measured default)
    code = main(["plan", "--policy", "static-pd,colocated", "--gpus", "2", "--tp", "1",
                 "--trace", "synthetic", "--synthetic-lengths", "fixed:4096:64",
                 "--synthetic-requests", "300", "--synthetic-rate", "5", "--model",
                 "llama-3.1-8b", "--gpu", "h800", "--ttft-slo", "2", "--tpot-slo", "0.009",
                 "--time-limit", "60", "--jobs", "2", "--seeds", "2", "--verify", "1",
                 "--shortlist", "1", "--no-progress", "--json", str(record), "--out",
                 str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "winner: static-pd" in printed and "screen error" in printed
    # 300 requests are fewer than a confirmation wants (>= 1,000): said, and kept
    assert "warning: the synthetic workload holds 300 requests" in printed
    data = json.loads(record.read_text())
    assert set(data) == {"configurations_evaluated", "wall_s", "winner", "policies"}
    assert data["configurations_evaluated"] == 2 + 5  # 1P1D x 2 chunks; 2 colocated x 5
    assert 0 < data["wall_s"] <= 60
    winner = data["winner"]
    assert set(winner) == {"policy", "deployment", "goodput_rps", "ci95"}
    low, high = winner["ci95"]
    assert low <= winner["goodput_rps"] <= high and winner["goodput_rps"] > 0
    assert winner["deployment"]["policy.name"] == "static-pd"
    assert [p["policy"] for p in data["policies"]][0] == "static-pd"
    assert {"ttft_p90_s", "tpot_p50_s", "goodput_per_gpu"} <= set(data["policies"][0])
    assert (out / "pareto.png").stat().st_size > 0
    assert json.loads((out / "pareto.json").read_text())
    assert json.loads((out / "summary.json").read_text())["winner"] == winner
    page = (out / "report.html").read_text()  # plotly is a dev dependency
    for shown in ("pareto_ttft", "pareto_tpot", "each policy's best deployment", "colocated",
                  "static-pd"):
        assert shown in page
    config = Config.from_yaml(out / "winner.yaml")
    assert config.policy.name == "static-pd" and config.goodput.search
    assert config.workload.synthetic_requests == 300
    assert (config.cluster.prefill, config.cluster.decode, config.perf.tp) == (1, 1, 1)
    assert yaml.safe_load((out / "winner.yaml").read_text())["slo"]["tpot_s"] == 0.009
    assert main(["simulate", "--config", str(out / "winner.yaml"), "--no-progress"]) == 0
    assert "goodput" in capsys.readouterr().out


def test_confirmations_prefer_distinct_deployments_and_challengers_follow():
    from pdserve.planning.fidelity import TrialResult
    from pdserve.planning.multi_fidelity import MultiFidelitySearch

    shape = WorkloadShape.of(load_workload(PREFILL_HEAVY))
    screen = Screen(H800_8B, shape, SLO(2.0, 0.012), 0.9, 256)
    pick = {name: enumerate_candidates(SEARCH_SPACES[name], 2, [1])[0]
            for name in ("static-pd", "round-robin", "colocated")}
    search = MultiFidelitySearch(PREFILL_HEAVY, list(pick.values()), screen, budget(10.0, 2, 2))

    def result(key: int, fidelity: str, goodput: float, seed: int = 0) -> TrialResult:
        return TrialResult(key, fidelity, seed, goodput, 0.1, 0.2, 0.01, 0.01, 4, 100, 1.0)

    for key, goodput in enumerate((10.0, 9.9, 9.0)):  # static-pd, round-robin, colocated
        search._store(result(key, "short", goodput))
    # round-robin has static-pd's deployment: colocated is confirmed second
    assert search.confirm_list() == [(0, 0), (2, 0), (0, 1), (2, 1)]
    for key, goodput in ((0, 6.0), (2, 5.0)):
        for seed in (0, 1):
            search._store(result(key, "long", goodput, seed))
    # round-robin's short run (9.9) beats the best confirmed (6.0): it is next
    assert search.challengers() == [(1, 0), (1, 1)]
    for seed in (0, 1):
        search._store(result(1, "long", 5.5, seed))
    assert search.challengers() == []


def test_a_search_cut_between_its_stages_says_it_stopped_at_the_limit():
    """The deadline may fall after the last short trial ended and before the long stage was
    built: nothing is running or queued, yet the confirmations never ran (a fresh-clone CI
    run reported such a search as finished)."""
    from pdserve.planning.fidelity import TrialResult
    from pdserve.planning.multi_fidelity import MultiFidelitySearch

    shape = WorkloadShape.of(load_workload(PREFILL_HEAVY))
    screen = Screen(H800_8B, shape, SLO(2.0, 0.012), 0.9, 256)
    candidates = [enumerate_candidates(SEARCH_SPACES[name], 2, [1])[0]
                  for name in ("static-pd", "colocated")]
    search = MultiFidelitySearch(PREFILL_HEAVY, candidates, screen, budget(10.0, 2, 2))
    assert not search._unfinished("draining", 0, 0)  # no short result: nothing to confirm
    search._store(TrialResult(0, "short", 0, 10.0, 0.1, 0.2, 0.01, 0.01, 4, 100, 1.0))
    assert search._unfinished("draining", 0, 0) and search._unfinished("short", 0, 0)
    assert search._unfinished("long", 1, 0) and search._unfinished("long", 0, 2)
    assert not search._unfinished("long", 0, 0)


def test_a_synthetic_workload_is_drawn_as_long_as_the_runs_need_unless_capped(tmp_path):
    """A synthetic workload is lengths and a rate: without --synthetic-requests the planner
    draws what each run needs (a capped one measures a burst: 128/1024 tokens held 341 req/s
    on 4,000 requests where 80 s of arrivals at that rate attain 13 %); a count given on the
    command line or in --config stays a cap; a trace is left alone."""
    import argparse

    from pdserve.planning.planner import (
        SYNTHETIC_DRAW_MAX,
        confirmation_requests,
        uncapped_synthetic,
    )

    synthetic = Config().with_values({"workload.trace": "synthetic",
                                      "workload.synthetic_lengths": "fixed:128:1024"})
    plain = argparse.Namespace()
    assert uncapped_synthetic(synthetic, plain).workload.synthetic_requests == \
        SYNTHETIC_DRAW_MAX
    given = argparse.Namespace(**{"workload.synthetic_requests": 300})
    assert uncapped_synthetic(synthetic.with_values(
        {"workload.synthetic_requests": 300}), given).workload.synthetic_requests == 300
    path = tmp_path / "c.yaml"
    path.write_text("workload:\n  synthetic_requests: 500\n")
    from_file = argparse.Namespace(config=path)
    assert uncapped_synthetic(synthetic, from_file).workload.synthetic_requests == 1000
    trace = Config().with_values({"workload.trace": "azure-conv"})
    no_scale = RunScale(0.0, 0.0, 0.9)
    assert uncapped_synthetic(trace, plain) == trace and \
        confirmation_requests(trace, 10, no_scale) is None
    # 80 s of arrivals, at least 2 lifetimes (1,024 tokens x 30 ms), rounded to 2^(k/4)
    tight = synthetic.with_values({"slo.tpot_s": 0.03})
    wanted = confirmation_requests(tight, 100.0, RunScale.of(load_workload(tight), tight))
    assert 8000 * 0.85 <= wanted <= 8000 * 1.2


# AMPD's ToolBench agent sessions on 8 x H20 at its SLOs (bench/verdicts.py's ampd_base):
# rounds whose input is mostly the history of earlier rounds
TOOLBENCH = Config().with_values({
    "workload.trace": "agent:toolbench", "workload.synthetic_requests": 1000,
    "workload.synthetic_rate_rps": 0.5, "perf.model": "qwen3-32b", "perf.gpu": "h20",
    "slo.ttft_s": 0.35, "slo.tpot_s": 0.040, "seed": 1})


def test_the_screen_prices_a_session_round_on_a_prefill_instance_at_its_new_tokens():
    workload = load_workload(TOOLBENCH)
    shape = WorkloadShape.of(workload)
    new = [r.input_tokens - r.history_tokens for r in workload.requests()]
    assert shape.after_history.mean_tokens == pytest.approx(sum(new) / len(new))
    assert shape.after_history.mean_tokens < 0.5 * shape.whole.mean_tokens
    assert any(held > 0 for _, held in shape.after_history.quantiles)
    assert all(held == 0 for _, held in shape.whole.quantiles)
    # without sessions the two are one
    plain = WorkloadShape.of(load_workload(PREFILL_HEAVY))
    assert plain.after_history is plain.whole

    def perfs(tp: int, max_batch_size: int = 256):
        return perf_model("qwen3-32b", "h20", tp, max_batch_size=max_batch_size)

    screen = Screen(perfs, shape, SLO(0.35, 0.040), 0.9, 256)
    one_p_one_d = Deployment((InstanceGroup(1, 4, 2048, True, False),
                              InstanceGroup(1, 4, 2048, False, True)))
    estimate = screen.estimate(one_p_one_d)
    # the paper's deployment serves these SLOs (simulated: 5.4 req/s, docs/results/
    # verdicts.md); priced as whole inputs (P90 ~4,000 tokens) it met them at no rate
    assert estimate.goodput_rps > 0 and estimate.ttft_p90_s <= 0.35
    whole_priced = replace(shape, after_history=shape.whole)
    assert Screen(perfs, whole_priced, SLO(0.35, 0.040), 0.9, 256).estimate(
        one_p_one_d).goodput_rps == 0.0
    # two colocated instances: a round may land away from its history and recompute it
    colocated = Deployment((InstanceGroup(2, 4, 2048, True, True),))
    whole_screen = Screen(perfs, whole_priced, SLO(0.35, 0.040), 0.9, 256)
    assert screen.estimate(colocated) == whole_screen.estimate(colocated)
    # one instance: every round finds its history there
    alone = Deployment((InstanceGroup(1, 8, 2048, True, True),))
    assert screen.estimate(alone).goodput_rps > 1.5 * whole_screen.estimate(alone).goodput_rps


def test_the_planner_answers_for_a_session_workload():
    """Every deployment of these sessions once screened at 0, and the planner simulated none
    in 240 s: each trial searched down from 0.001 req/s, where a run spans days."""
    outcome, screened = planner.search(TOOLBENCH, "ampd,dynamo", 8, budget(60.0, seeds=2))
    assert screened > 100 and not outcome.stopped_at_limit
    result = verdict(policy_rows(outcome))
    assert result.winner is not None and result.winner.fidelity == "long"
    assert result.winner.per_gpu.mean > 0


def test_a_deployment_the_screen_fails_at_every_rate_is_searched_down_from_its_capacity():
    """A TTFT SLO no prefill meets (4,096 tokens in 0.05 s): the screen's goodput is 0 for
    every deployment, so each short trial starts where the deployment keeps up."""
    base = PREFILL_HEAVY.with_values({"slo.ttft_s": 0.05})
    outcome, _ = planner.search(base, "static-pd", 2, budget(60.0, seeds=1, verify=1))
    tried = [r for r in outcome.records if r.short is not None]
    assert tried and all(r.screen.goodput_rps == 0 for r in outcome.records)
    assert max(r.screen.capacity_rps for r in outcome.records) == max(
        r.screen.capacity_rps for r in tried)  # the shortlist takes the most capacity first
    for record in tried:
        assert record.short.goodput_rps == 0.0  # the simulation agrees: no rate meets it
    assert not outcome.stopped_at_limit and outcome.wall_s < 30


@pytest.mark.parametrize("flags, message", [
    (["--gpus", "0"], "argument --gpus: must be at least 1, got 0"),
    (["--jobs", "0"], "argument --jobs/--processes: must be at least 1, got 0"),
    (["--seeds", "0"], "argument --seeds: must be at least 1, got 0"),
    (["--verify", "-1"], "argument --verify: must be at least 0, got -1"),
    (["--time-limit", "nan"], "argument --time-limit: must be a number of seconds above 0"),
    (["--time-limit", "-5"], "argument --time-limit: must be a number of seconds above 0"),
    (["--policy", "taichi", "--instances", "1"], "argument --instances: must be at least 2"),
    (["--gpus", "1.5"], "argument --gpus: invalid integer value: '1.5'"),
])
def test_plan_refuses_counts_and_limits_that_mean_nothing(flags, message, capsys):
    """0 GPUs or processes used to plan for the defaults (8 GPUs, every CPU) and a negative
    time limit to skip every simulation: each is now a usage error naming its flag."""
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", "--no-progress", *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err



def test_a_winner_whose_decode_pool_falls_behind_is_noted():
    """3P + 1D batching 32 sequences: the decode instance cannot keep up, yet over a short
    run the requests' wait for a decode slot hides in TPOT (256 tokens under a 200-ms SLO),
    so the standard attainment passes a rate that, the wait counted in TTFT, only a few
    requests meet. The plan says so beside its winner; a colocated winner has no such wait."""
    from pdserve.planning.outcome import Interval, PolicyRow
    from pdserve.planning.report import format_decode_queue_note

    base = Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_lengths": "fixed:2048:256",
        "workload.synthetic_requests": 3000, "workload.synthetic_rate_rps": 10.0,
        "perf.model": "llama-3.1-8b", "perf.gpu": "h800", "perf.tp": 1,
        "instance.max_batch_size": 32, "slo.ttft_s": 2.0, "slo.tpot_s": 0.2})
    samples = WorkloadSamples(base, 1)
    [pd] = [c for c in enumerate_candidates(SEARCH_SPACES["static-pd"], 4, [1])
            if c.settings["cluster.prefill"] == 3
            and c.settings["instance.chunk_size_tokens"] == 2048]
    [colocated] = [c for c in enumerate_candidates(SEARCH_SPACES["colocated"], 4, [1])
                   if c.settings["instance.chunk_size_tokens"] == 2048]
    notes = {}
    for candidate in (pd, colocated):
        result = run_trial(Trial(0, candidate, FAST_SHORT, 0, guess_rps=10.0), samples)
        assert result.goodput_rps > 0
        row = PolicyRow(candidate.space, candidate, Interval.of([result.goodput_rps]),
                        "short", result.ttft_p50_s, result.ttft_p90_s, result.tpot_p50_s,
                        result.tpot_p90_s, 0.0, 1, 1,
                        attainment_with_decode_queue=result.attainment_with_decode_queue)
        notes[candidate.space] = (result.attainment_with_decode_queue,
                                  format_decode_queue_note(row, base.slo.targets(), 0.9))
    attained, note = notes["static-pd"]
    assert attained < 0.5 and f"attain {attained:.0%}" in note
    assert "--slo-counts-decode-queue" in note
    attained, note = notes["colocated"]
    assert attained >= 0.9 and note == ""
    # the SLO counting that wait already: no note
    counted = base.with_values({"slo.counts_decode_queue": True}).slo.targets()
    pd_row = PolicyRow("static-pd", pd, Interval.of([1.0]), "short", 0, 0, 0, 0, 0, 1, 1,
                       attainment_with_decode_queue=0.1)
    assert format_decode_queue_note(pd_row, counted, 0.9) == ""
    # at about the target (a sound deployment at its goodput's edge): no note
    edge = replace(pd_row, attainment_with_decode_queue=0.85)
    assert format_decode_queue_note(edge, base.slo.targets(), 0.9) == ""
