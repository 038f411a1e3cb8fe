"""`pdserve plan --policy taichi`: the slider grid, goodput per setting, the time bound."""

from __future__ import annotations

from pdserve.cli import main
from pdserve.config import Config
from pdserve.planning.taichi import SliderPoint, evaluate, search, slider_grid
from pdserve.sim.runner import Experiment

BASE = Config().with_values({"workload.trace": "synthetic", "workload.synthetic_requests": 250,
                             "workload.synthetic_rate_rps": 20.0,
                             "workload.synthetic_lengths": "table:sharegpt", "seed": 2,
                             "perf.model": "qwen2.5-14b", "perf.gpu": "a100", "perf.tp": 1,
                             "slo.ttft_s": 3.0, "slo.tpot_s": 0.11, "monitor.interval_s": 0.2})


def test_grid_spans_aggregation_disaggregation_and_hybrid():
    points = slider_grid(4, [256, 1024], [0, 128, 256])
    modes = [p.mode for p in points]
    assert modes.count("aggregation") == 2 and modes.count("disaggregation") == 3
    # hybrid: 3 ratios x (256: 128 | 1024: 128, 256)
    assert modes.count("hybrid") == 9
    assert all(0 < p.chunk_d_tokens < p.chunk_p_tokens for p in points if p.mode == "hybrid")


def test_aggregation_point_has_colocated_goodput():
    experiment = Experiment.from_config(BASE)
    result = evaluate(SliderPoint(0, 4, 512, 512), experiment)
    colocated = Experiment(BASE.with_values({"policy.name": "colocated", "cluster.instances": 4,
                                             "instance.chunk_size_tokens": 512}),
                           experiment.workload, experiment.perf).goodput()
    assert result.goodput_rps == colocated.rate_rps > 0
    assert result.attainment >= 0.9


def test_parallel_search_ranks_by_goodput_and_respects_the_time_limit():
    points = [SliderPoint(0, 4, 512, 512), SliderPoint(2, 2, 16384, 0),
              SliderPoint(2, 2, 1024, 512)]
    results = search(BASE, points, processes=2, time_limit_s=300)
    assert len(results) == 3
    goodputs = [r.goodput_rps for r in results]
    assert goodputs == sorted(goodputs, reverse=True) and goodputs[0] > 0
    assert search(BASE, points, processes=2, time_limit_s=0.001) == []


def test_plan_command_prints_the_best_settings(capsys):
    code = main(["plan", "--policy", "taichi", "--trace", "synthetic", "--synthetic-lengths",
                 "table:sharegpt", "--synthetic-requests", "150", "--synthetic-rate", "20",
                 "--model", "qwen2.5-14b", "--gpu", "a100", "--tp", "1", "--instances", "2",
                 "--chunk-sizes", "512,1024", "--d-chunk-sizes", "0,256", "--top", "3",
                 "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "5 settings simulated" in out and "best: --policy taichi" in out
    assert out.count("req/s") >= 1 and "goodput" in out
