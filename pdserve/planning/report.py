"""A plan's outcome for a person and for a program: the table per policy, the winner and its
margin, the screen's error (text); the `--json` record; the winner's config file, ready for
`pdserve simulate --config` and `pdserve serve --config`; `report.html`: the Pareto plots and
the table per policy, on the page every run's report uses."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pdserve.config import Config
from pdserve.planning.candidates import Candidate
from pdserve.planning.outcome import ParetoPoint, PolicyRow, ScreenError, Verdict
from pdserve.types import SLO


def _ms(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.0f}"


def format_table(rows: list[PolicyRow]) -> str:
    lines = [f"{'policy':<30}{'best deployment':<44}{'goodput/GPU (95% CI)':>24}"
             f"{'TTFT p50/p90 ms':>17}{'TPOT p50/p90 ms':>17}{'fid.':>6}{'sim/scr':>9}"]
    for row in rows:
        g = row.per_gpu
        interval = (f"{g.mean:.2f} [{g.low:.2f}, {g.high:.2f}]" if g.samples > 1
                    else f"{g.mean:.2f} (1 run)")
        lines.append(f"{row.space:<30}{row.candidate.describe()[:43]:<44}{interval:>24}"
                     f"{_ms(row.ttft_p50_s) + '/' + _ms(row.ttft_p90_s):>17}"
                     f"{_ms(row.tpot_p50_s) + '/' + _ms(row.tpot_p90_s):>17}"
                     f"{row.fidelity:>6}{f'{row.simulated}/{row.screened}':>9}")
    return "\n".join(lines)


def format_verdict(result: Verdict, rows: list[PolicyRow] | None = None) -> str:
    winner = result.winner
    if winner is None:
        return "no candidate meets the SLOs at any rate tried: no winner"
    text = (f"winner: {winner.space} ({winner.candidate.describe()}), "
            f"{winner.per_gpu.mean:.2f} req/s per GPU, {winner.goodput.mean:.1f} req/s on "
            f"{winner.gpus} GPUs")
    if result.twins:
        text += f" (the same simulation as {', '.join(result.twins)}'s best)"
    runner = result.runner_up
    if runner is not None:
        text += f"; {result.margin:+.1%} over {runner.space}"
    if result.tied_with:
        text += (f"; a TIE within the 95 % intervals with {', '.join(result.tied_with)} "
                 f"(the seeds cannot tell them apart)")
    elif winner.goodput.samples < 2:
        text += "; one run only: no interval to call a tie by"
    unconfirmed = [r for r in rows or [] if r.fidelity == "short"
                   and r.per_gpu.mean > winner.per_gpu.mean]
    if winner.fidelity == "long" and unconfirmed:
        text += ("\nnot confirmed by long runs, higher in their short runs (which run optimistic): "
                 + ", ".join(f"{r.space} {r.per_gpu.mean:.2f}" for r in unconfirmed[:4]))
    return text


# how far below the target the winner's attainment with the decode queue counted must fall
# for a note: at the goodput rate a sound disaggregated deployment attains about the target
# either way (the azure-conv plan's rows: 0.90-1.00), one whose decode pool falls behind far
# less (plan question 7: 0.57)
DECODE_QUEUE_NOTE_MARGIN = 0.1


def format_decode_queue_note(winner: PolicyRow | None, slo: SLO, target: float) -> str:
    """A note when the winner moves KV and its runs at the goodput rate miss the target
    (by `DECODE_QUEUE_NOTE_MARGIN`) once the wait for a decode slot counts in TTFT: a
    decode pool that falls behind keeps its requests waiting after their first token, a
    wait the standard attainment spreads over TPOT, so a run of fixed length can pass it
    (docs/results/plan.md, question 7 with the batch limit searched). "" otherwise, or
    when the SLO counts that wait already."""
    if (winner is None or slo.counts_decode_queue or not winner.candidate.deployment.moves_kv
            or not winner.attainment_with_decode_queue < target - DECODE_QUEUE_NOTE_MARGIN):
        return ""
    return (f"note: the winner's requests wait for a decode slot: with that wait counted in "
            f"TTFT its runs at this rate attain {winner.attainment_with_decode_queue:.0%} "
            f"(target {target:.0%}), and a decode pool that falls behind can pass a run of "
            f"fixed length; plan with --slo-counts-decode-queue before trusting it")


def format_screen_error(error: ScreenError | None) -> str:
    if error is None:
        return "screen error: no simulated candidate to measure it against"
    return (f"screen error (screen goodput / {error.fidelity} simulation - 1, "
            f"{error.candidates} "
            f"candidates): median {error.median:+.1%}, median |error| "
            f"{error.median_abs:.1%}, P90 |error| {error.p90_abs:.1%}")


def _row_json(row: PolicyRow) -> dict[str, Any]:
    return {"policy": row.space, "deployment": row.candidate.settings,
            "described": row.candidate.describe(), "gpus": row.gpus,
            "goodput_rps": row.goodput.mean, "ci95": [row.goodput.low, row.goodput.high],
            "goodput_per_gpu": row.per_gpu.mean, "seeds": row.goodput.samples,
            "fidelity": row.fidelity, "ttft_p50_s": row.ttft_p50_s,
            "ttft_p90_s": row.ttft_p90_s, "tpot_p50_s": row.tpot_p50_s,
            "tpot_p90_s": row.tpot_p90_s,
            "attainment_with_decode_queue": row.attainment_with_decode_queue,
            "screen_goodput_rps": row.screen_goodput_rps,
            "candidates_screened": row.screened, "candidates_simulated": row.simulated}


def plan_json(evaluated: int, wall_s: float, rows: list[PolicyRow],
              result: Verdict) -> dict[str, Any]:
    """`--json`: exactly the keys issue 25 names; each policy's row inside `policies`."""
    winner = result.winner
    return {
        "configurations_evaluated": evaluated,
        "wall_s": wall_s,
        "winner": None if winner is None else {
            "policy": winner.space, "deployment": winner.candidate.settings,
            "goodput_rps": winner.goodput.mean,
            "ci95": [winner.goodput.low, winner.goodput.high]},
        "policies": [_row_json(row) for row in rows],
    }


def winner_config(base: Config, candidate: Candidate) -> Config:
    """The plan's config with the winner's values and the goodput search on: `pdserve
    simulate --config` reproduces the search on the plan's workload (the planner sizes a
    synthetic one as its confirmation runs: `planner.confirmation_requests`)."""
    return candidate.config(base).with_values({"goodput.search": True})


def write_config(path: Path, config: Config, header: str) -> None:
    path.write_text("".join(f"# {line}\n" for line in header.splitlines()) + config.to_yaml())


def write_plan_report(out: Path, base: Config, gpus: int, points: list[ParetoPoint],
                      rows: list[PolicyRow], result: Verdict,
                      document: dict[str, Any]) -> list[str]:
    """`summary.json` (the `--json` record) and `report.html` in `out`: goodput per GPU
    against TTFT P90 and against TPOT P90 for every simulated candidate (a colour per
    policy, the fronts joined, the SLOs dashed) and the table per policy."""
    from pdserve.metrics.report_page import write_plan
    from pdserve.metrics.views import goodput_latency_figure, table

    slo = base.slo
    groups = [p.space for p in points]
    labels = [f"{p.label} ({p.fidelity})" for p in points]
    goodput = [p.goodput_per_gpu for p in points]
    figures = [(name, goodput_latency_figure(
        f"goodput per GPU against {title} at the goodput rate", groups, labels,
        [getattr(p, attribute) for p in points], goodput, f"{title} (s)", limit_s))
        for name, title, attribute, limit_s in (
            ("pareto_ttft", "TTFT P90", "ttft_p90_s", slo.ttft_s),
            ("pareto_tpot", "TPOT P90", "tpot_p90_s", slo.tpot_s))]
    policy_table = table("each policy's best deployment, best goodput per GPU first", [
        "policy", "deployment", "goodput/GPU", "95 % low", "95 % high", "runs",
        "TTFT P50 s", "TTFT P90 s", "TPOT P50 s", "TPOT P90 s", "confirmed"], [
        [row.space, row.candidate.describe(), row.per_gpu.mean, row.per_gpu.low,
         row.per_gpu.high, row.per_gpu.samples, row.ttft_p50_s, row.ttft_p90_s,
         row.tpot_p50_s, row.tpot_p90_s, row.fidelity == "long"] for row in rows])
    winner = result.winner
    cards = [("winner", "none" if winner is None else
              f"{winner.space}: {winner.per_gpu.mean:.2f} req/s per GPU"),
             ("configurations", str(document["configurations_evaluated"]))]
    return write_plan(out, "pdserve plan", f"{base.perf.model} on {gpus} x {base.perf.gpu}, "
                      f"{base.workload.trace}; SLO TTFT {slo.ttft_s:g} s, TPOT "
                      f"{slo.tpot_s:g} s", document, figures, policy_table, cards)
