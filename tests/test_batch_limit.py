"""The instances' batch limit (`instance.max_batch_size`) above the 256 sequences every fit
covers: the performance model is fitted up to it, and the planner tries a higher limit where
the plan's holds a deployment's decodes back."""

from __future__ import annotations

import pytest

from pdserve.config import Config
from pdserve.perf.fit import FIT_MIN_BATCHES
from pdserve.perf.presets import measured, perf_model
from pdserve.planning import planner
from pdserve.planning.candidates import (
    BATCH_LIMIT_SEARCHED,
    Deployment,
    InstanceGroup,
    enumerate_candidates,
    with_batch_limit,
)
from pdserve.planning.multi_fidelity import SearchBudget
from pdserve.planning.outcome import policy_rows, verdict
from pdserve.planning.run_length import Fidelity
from pdserve.planning.screen import Screen, WorkloadShape
from pdserve.policies.search_spaces import SEARCH_SPACES
from pdserve.sim.runner import Experiment, load_perf_model, load_workload
from pdserve.types import SLO

# short prompts, 256 output tokens, a TPOT SLO of 100 ms: on one H800 a decode step of 256
# sequences of the 8B takes about 20 ms, so the batch limit, not the SLO, caps an instance
BATCH_BOUND = Config().with_values({
    "workload.trace": "synthetic", "workload.synthetic_lengths": "fixed:128:256",
    "workload.synthetic_requests": 4000, "workload.synthetic_rate_rps": 40.0,
    "perf.model": "llama-3.1-8b", "perf.gpu": "h800", "perf.tp": 1,
    "slo.ttft_s": 2.0, "slo.tpot_s": 0.1})


def h800_8b(tp: int, max_batch_size: int = 256):
    return perf_model("llama-3.1-8b", "h800", tp, max_batch_size=max_batch_size)


@pytest.mark.parametrize(("model", "gpu", "tp"), [("qwen3-30b-a3b", "h100", 2),
                                                   ("llama-3.1-70b", "h200", 4)])
def test_a_higher_limit_fits_the_decode_steps_the_default_fit_extrapolates(model, gpu, tp):
    kernels = measured(model, gpu, tp)
    default, wide = perf_model(model, gpu, tp), perf_model(model, gpu, tp, max_batch_size=512)
    assert len(wide.decode.size_table_s) == 512
    assert len(default.decode.size_table_s) == FIT_MIN_BATCHES
    worst_default = 0.0
    for batch in (320, 384, 448, 512):
        context = batch * 1100
        truth = kernels.decode_step_s(batch, context)
        assert wide.batch_time_s(batch, context, 0, 0) == pytest.approx(truth, rel=0.01)
        worst_default = max(worst_default,
                            abs(default.batch_time_s(batch, context, 0, 0) / truth - 1))
    # the default model beyond its fitted batches: MoE +45 % at 512, the dense 70B -8 %
    assert worst_default > 0.05
    # a limit at or below the floor keeps the one model (every result priced before)
    assert perf_model(model, gpu, tp, max_batch_size=64) is default


def test_the_simulator_loads_the_model_fitted_to_its_batch_limit():
    assert load_perf_model(BATCH_BOUND) is h800_8b(1)
    wide = load_perf_model(BATCH_BOUND.with_values({"instance.max_batch_size": 512}))
    assert wide is h800_8b(1, 512) and len(wide.decode.size_table_s) == 512


def test_the_screen_says_which_deployments_the_batch_limit_holds_back():
    shape = WorkloadShape.of(load_workload(BATCH_BOUND))
    screen = Screen(h800_8b, shape, SLO(2.0, 0.1), 0.9, 256)
    colocated = Deployment((InstanceGroup(1, 1, 2048, True, True),))
    held = screen.estimate(colocated)
    assert held.batch_limited
    raised = screen.estimate(colocated.with_batch_limit(512))
    assert raised.goodput_rps > 1.1 * held.goodput_rps
    assert raised.tpot_s <= 0.1 and not raised.batch_limited
    # the same deployment under a TPOT SLO a batch of 256 cannot meet: the SLO binds first
    tight = Screen(h800_8b, shape, SLO(2.0, 0.012), 0.9, 256)
    assert not tight.estimate(colocated).batch_limited


def test_the_planner_adds_a_higher_limit_only_where_the_screen_finds_it_binding():
    shape = WorkloadShape.of(load_workload(BATCH_BOUND))
    screen = Screen(h800_8b, shape, SLO(2.0, 0.1), 0.9, 256)
    candidates = enumerate_candidates(SEARCH_SPACES["colocated"], 1, [1])
    for candidate in candidates:
        screen.estimate(candidate.deployment)
    added = planner.batch_limit_candidates(BATCH_BOUND, candidates, screen)
    assert added and len(added) <= len(candidates)
    for candidate in added:
        assert candidate.settings["instance.max_batch_size"] == BATCH_LIMIT_SEARCHED
        assert all(g.max_batch_size == BATCH_LIMIT_SEARCHED
                   for g in candidate.deployment.groups)
        assert "bs512" in candidate.describe()
    # a plan whose limit is that high already gets none
    assert planner.batch_limit_candidates(
        BATCH_BOUND.with_values({"instance.max_batch_size": 512}), candidates, screen) == []
    # TaiChi's aggregation point simulates as colocated: its twin carries the limit too
    taichi = [c for c in enumerate_candidates(SEARCH_SPACES["taichi"], 2, [1])
              if c.simulates_as]
    twin = with_batch_limit(taichi[0], 512)
    assert dict(twin.simulates_as)["instance.max_batch_size"] == 512


def test_the_planner_raises_the_limit_where_it_binds_and_the_simulation_agrees():
    """Known by construction: under a loose TPOT SLO the 256-sequence limit caps one
    colocated H800; at 512 the same instance carries more within the SLO."""
    fast = (Fidelity("short", duration_s=20.0, min_requests=200, rel_tol=0.1, step=1.2),
            Fidelity("long", duration_s=40.0, min_requests=400, rel_tol=0.05, step=1.15))
    outcome, _ = planner.search(BATCH_BOUND, "colocated", 1,
                                SearchBudget(120.0, 2, 2, 2, 2, *fast))
    assert not outcome.stopped_at_limit
    winner = verdict(policy_rows(outcome)).winner
    assert winner is not None and winner.fidelity == "long"
    assert winner.candidate.settings["instance.max_batch_size"] == 512
    config = winner.candidate.config(BATCH_BOUND)
    raised = Experiment.from_config(config).goodput().rate_rps
    held = Experiment.from_config(
        config.with_values({"instance.max_batch_size": 256})).goodput().rate_rps
    assert raised > 1.1 * held


def test_plan_takes_the_batch_limit_and_the_decode_queue_definition_as_flags():
    from pdserve.cli import build_parser
    from pdserve.config_flags import config_from_args

    args = build_parser().parse_args(["plan", "--max-batch-size", "512",
                                      "--slo-counts-decode-queue"])
    config = config_from_args(args, planner.plan_defaults())
    assert config.instance.max_batch_size == 512 and config.slo.counts_decode_queue
    plain = config_from_args(build_parser().parse_args(["plan"]), planner.plan_defaults())
    assert plain.instance.max_batch_size == 256 and not plain.slo.counts_decode_queue


def test_a_batch_limit_no_fit_covers_is_refused_before_anything_runs():
    """A limit of 10^8 (a typo) used to spend minutes fitting a model to it."""
    with pytest.raises(ValueError, match="must be at most 16,384 sequences"):
        Config().with_values({"instance.max_batch_size": 100_000_000})
    assert Config().with_values({"instance.max_batch_size": 16_384}).instance.max_batch_size \
        == 16_384
    with pytest.raises(ValueError, match="above the 16,384"):
        perf_model("llama-3.1-8b", "h100", 1, max_batch_size=20_000)
