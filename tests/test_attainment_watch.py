"""The goodput search's early stop: a run stops once its SLO attainment is decided either
way, and the search takes the same path to the same rate as with full runs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from pdserve.config import Config
from pdserve.metrics.attainment_watch import AttainmentWatch, _needed
from pdserve.sim.runner import Experiment
from pdserve.types import SLO, Request

SLO_1S = SLO(ttft_s=1.0, tpot_s=0.1)


def _requests(count: int) -> list[Request]:
    return [Request(i, float(i), 100, 11) for i in range(count)]


def _finish(request: Request, ttft_s: float, tpot_s: float) -> None:
    request.first_token_s = request.arrival_s + ttft_s
    request.generated_tokens = request.output_tokens
    request.finish_s = request.first_token_s + tpot_s * (request.output_tokens - 1)


def test_needed_is_the_fewest_met_requests_whose_share_reaches_the_target() -> None:
    for total in (1, 3, 7, 10, 59, 100, 1000):
        for target in (0.1, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0):
            needed = _needed(total, target)
            assert needed / total >= target
            assert (needed - 1) / total < target
    assert _needed(59, 0.8) == 48  # 47/59 = 0.797, 48/59 = 0.814


def test_decides_pass_once_enough_requests_met() -> None:
    requests = _requests(10)
    watch = AttainmentWatch(requests, SLO_1S, 0.8, [0.0] * 10)
    for request in requests[:7]:
        _finish(request, 0.5, 0.05)
        watch.finished(request)
    assert not watch.decided  # 7 met, 3 still open: 70 % .. 100 %
    _finish(requests[7], 0.5, 0.05)
    watch.finished(requests[7])
    assert watch.decided and watch.passes and watch.met == 8


def test_decides_fail_on_misses_rejections_and_late_first_tokens() -> None:
    requests = _requests(10)
    watch = AttainmentWatch(requests, SLO_1S, 0.8, [0.0] * 10)
    for request in requests:
        watch.arrived(request)
    _finish(requests[0], 0.5, 0.2)  # TPOT missed
    watch.finished(requests[0])
    watch.rejected(requests[1])
    assert not watch.decided  # 2 missed: at most 80 %
    watch.tick(3.5)  # request 2 arrived at 2.0, no first token by 3.5 > 2.0 + 1.0
    assert watch.decided and not watch.passes and watch.missed == 3
    _finish(requests[2], 2.0, 0.05)  # its late first token: counted once
    watch.finished(requests[2])
    assert watch.missed == 3


def test_a_late_first_token_counts_the_control_latency() -> None:
    requests = _requests(2)
    watch = AttainmentWatch(requests, SLO_1S, 1.0, [0.3, 0.0])
    for request in requests:
        watch.arrived(request)
    watch.tick(0.75)  # request 0 would be seen at 0.75 + 0.3 > 1.0 only from 0.7 on
    assert watch.decided and not watch.passes
    _finish(requests[1], 0.99, 0.05)
    other = AttainmentWatch(requests[1:], SLO_1S, 1.0, [0.0])
    other.finished(requests[1])
    assert other.decided and other.passes


def test_shifts_must_match_the_requests() -> None:
    with pytest.raises(ValueError, match="2 control-latency shifts for 3"):
        AttainmentWatch(_requests(3), SLO_1S, 0.9, [0.0, 0.0])


def _experiment(control_latency: bool) -> Experiment:
    values: dict[str, object] = {
        "workload.trace": "synthetic", "workload.synthetic_requests": 300,
        "workload.synthetic_rate_rps": 6, "workload.synthetic_lengths": "lognormal:1500:200:1.0",
        "policy.name": "static-pd", "cluster.prefill": 1, "cluster.decode": 1,
        "perf.model": "llama-3.1-8b", "perf.gpu": "h800", "slo.ttft_s": 0.5,
        "slo.tpot_s": 0.05}
    if control_latency:
        values.update({"sim.control_latency_s": 0.02, "sim.control_latency_p90_s": 0.05})
    return Experiment.from_config(Config().with_values(values))


@pytest.mark.parametrize("control_latency", [False, True])
def test_a_stopped_run_gives_the_full_runs_verdict(control_latency: bool) -> None:
    experiment = _experiment(control_latency)
    target = experiment.config.goodput.target
    verdicts, stopped = set(), 0
    for scale in (0.5, 2.0, 4.0, 8.0, 30.0):
        full = experiment.simulate(scale)
        early = experiment.simulate(scale, decide_attainment=target)
        assert not full.decided_early
        full_passes = experiment.summarize(full).slo_attainment >= target
        assert (experiment.summarize(early).slo_attainment >= target) == full_passes
        verdicts.add(full_passes)
        if early.decided_early:
            stopped += 1
            assert early.events < full.events
            assert any(math.isnan(r.finish_s) and not r.rejected_reason
                       for r in early.requests)
    assert verdicts == {True, False} and stopped >= 3


def test_the_search_takes_the_same_path_to_the_same_rate() -> None:
    experiment = _experiment(control_latency=True)
    full = experiment.goodput(stop_when_decided=False)
    early = experiment.goodput()
    assert early.rate_scale == full.rate_scale > 0
    assert [p.rate_scale for p in early.points] == [p.rate_scale for p in full.points]
    target = full.target_attainment
    for a, b in zip(full.points, early.points, strict=True):
        assert (a.summary.slo_attainment >= target) == (b.summary.slo_attainment >= target)
        assert not a.decided_early
    assert sum(p.decided_early for p in early.points) >= len(early.points) // 2


def test_a_watch_that_does_not_decide_a_pass_decides_a_fail() -> None:
    requests = _requests(10)
    watch = AttainmentWatch(requests, SLO_1S, 0.8, [0.0] * 10, decides_pass=False)
    for request in requests[:9]:
        _finish(request, 0.5, 0.05)
        watch.finished(request)
    assert watch.passes and not watch.decided  # a pass runs to its end
    failing = AttainmentWatch(requests, SLO_1S, 0.8, [0.0] * 10, decides_pass=False)
    for request in requests[:3]:
        failing.rejected(request)
    assert failing.decided and not failing.passes


def test_the_planners_trials_stop_failing_steps_with_the_same_result(monkeypatch) -> None:
    """`planning/fidelity.py`: the same rate, search path and latencies at the rate found
    (its passing step ran in full), in fewer events."""
    from pdserve.planning.candidates import enumerate_candidates
    from pdserve.planning.fidelity import Trial, WorkloadSamples, run_trial
    from pdserve.planning.run_length import Fidelity
    from pdserve.policies.search_spaces import SEARCH_SPACES

    base = _experiment(control_latency=True).config
    samples = WorkloadSamples(base, 1)
    fidelity = Fidelity("short", duration_s=20.0, min_requests=200, rel_tol=0.05, step=1.25)
    [candidate] = [c for c in enumerate_candidates(SEARCH_SPACES["static-pd"], 2, [1])
                   if c.settings["instance.chunk_size_tokens"] == 2048]
    trial = Trial(0, candidate, fidelity, 0, guess_rps=3.0)
    runs: list[tuple[bool, int]] = []  # (stopped early, events) of each step's run
    simulate = Experiment.simulate

    def recorded(self: Experiment, *args: object, **kwargs: object) -> object:
        result = simulate(self, *args, **kwargs)  # type: ignore[arg-type]
        runs.append((result.decided_early, result.events))
        return result

    monkeypatch.setattr(Experiment, "simulate", recorded)
    full = run_trial(trial, samples, stop_when_decided=False)
    full_runs, runs[:] = list(runs), []
    early = run_trial(trial, samples)
    assert full.goodput_rps > 0 and full.runs >= 4
    assert not any(stopped for stopped, _ in full_runs)
    assert sum(stopped for stopped, _ in runs) >= 2
    assert sum(events for _, events in runs) < sum(events for _, events in full_runs)
    assert replace(early, wall_s=0.0) == replace(full, wall_s=0.0)
