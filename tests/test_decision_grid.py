"""`bench/decision_grid.py`: AIConfigurator's printed answer parsed (a captured
`aiconfigurator cli default` output, Llama-3.1-8B on 8 x H200, 1000/200, TTFT 2 s, TPOT
100 ms), and the grid's questions covering every factor level."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = Path(__file__).resolve().parent / "data" / "aic_cli_default_8b_h200.txt"


def _grid():
    spec = importlib.util.spec_from_file_location("decision_grid",
                                                  ROOT / "bench" / "decision_grid.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["decision_grid"] = module
    spec.loader.exec_module(module)
    return module


def test_parse_aic_reads_each_modes_best_row():
    grid = _grid()
    answer = grid.parse_aic(SAMPLE.read_text())
    assert answer.winner == "agg"
    assert (answer.agg_configs, answer.disagg_configs) == (565, 41)
    agg = answer.agg
    assert agg.rps == 252.35 and agg.gpus_used == 8 and agg.replicas == 8
    assert (agg.decode_tp, agg.decode_batch) == (1, 480)
    assert agg.tpot_ms == pytest.approx(1000 / 13.27)
    assert agg.describe == "8 x TP1, bs 480"
    disagg = answer.disagg
    assert disagg.rps == 197.15 and disagg.ttft_ms == 41.09
    assert (disagg.decode_tp, disagg.decode_batch) == (1, 504)
    assert disagg.describe == "1 x (5P TP1 + 3D TP1), decode bs 504"


def test_parse_aic_without_a_feasible_disaggregated_row():
    grid = _grid()
    text = SAMPLE.read_text()
    cut = text.index("disagg Top Configurations")
    answer = grid.parse_aic(text[:cut])
    assert answer.disagg is None and answer.agg.rps == 252.35
    with pytest.raises(ValueError, match="Best Experiment Chosen"):
        grid.parse_aic(text.replace("Best Experiment Chosen", "Chosen"))


def test_questions_cover_every_factor_level():
    grid = _grid()
    questions = grid.questions()
    assert len(questions) == 24 and len({q.key for q in questions}) == 24
    assert {q.model for q in questions} == {"llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"}
    assert {q.gpu for q in questions} == {"h100", "h200"}
    assert {(q.input_tokens, q.output_tokens) for q in questions} == {(1000, 200), (4000, 500)}
    for model in grid.SLO_PAIRS:  # two SLO pairs per model, the tight one tighter on both
        pairs = {(q.ttft_slo_s, q.tpot_slo_s) for q in questions if q.model == model}
        (t1, p1), (t2, p2) = sorted(pairs)
        assert t1 < t2 and p1 < p2
    subset = grid.questions(models=["qwen3-32b"], gpus=["h100"], slos=["tight"])
    assert [q.key for q in subset] == ["qwen3-32b/h100/1000:200/1.5s:40ms",
                                       "qwen3-32b/h100/4000:500/1.5s:40ms"]
    command = subset[0].aic_command()
    assert command[command.index("--tpot") + 1] == "40"
    assert command[command.index("--model-path") + 1] == "Qwen/Qwen3-32B"


def test_compare_needs_both_sides_within_tolerance_and_the_winner():
    grid = _grid()
    answer = grid.parse_aic(SAMPLE.read_text())
    pd = {"agg": {"rps": 252.35 * 1.14}, "disagg": {"rps": 197.15 * 0.9}}
    verdict = grid.compare(answer, pd)
    assert verdict["within_tolerance"] and verdict["agree"] and verdict["pd_winner"] == "agg"
    pd["disagg"]["rps"] = 197.15 * 1.6  # disaggregation now wins, and by more than 15 %
    verdict = grid.compare(answer, pd)
    assert not verdict["within_tolerance"] and not verdict["same_winner"]
    assert verdict["pd_winner"] == "disagg" and math.isclose(verdict["ratio_disagg"], 1.6)


def test_the_degrees_recorded_come_from_the_deployment():
    from pdserve.planning.candidates import enumerate_candidates, mixed_degree_candidates
    from pdserve.policies.search_spaces import SEARCH_SPACES

    grid, space = _grid(), SEARCH_SPACES["static-pd"]
    [mixed] = [c for c in mixed_degree_candidates(space, 8, [2, 4], "h100")
               if c.settings["instance.chunk_size_tokens"] == 2048
               and c.deployment.groups[0].tp == 2]  # 2P TP2 + 1D TP4
    assert (grid._degree(mixed, decode=False), grid._degree(mixed, decode=True)) == (2, 4)
    same = enumerate_candidates(space, 8, [4])[0]
    assert grid._degree(same, decode=False) == grid._degree(same, decode=True) == 4
