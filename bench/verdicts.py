"""Verdicts on the five papers' headline claims (issue 26): each claim is a comparison run by
`pdserve.planning.verdict` (every contender tuned by the planner's same search, or all at the
paper's fixed deployment where the claim is about a mechanism at a fixed deployment; goodput
over 3 seeds bisected to 1 %, run length doubled until goodput moves < 3 %; mean and 95 %
Student-t interval; win / loss only when the intervals separate).

Each paper's setup is its reproduction script's (`bench/<paper>_repro.py`, and the paper's
doc in docs/results/); where this file departs from it, the comparison's comment says so.
Goodput is the highest rate at which >= 90 % of requests meet both SLOs (DistServe's, Arrow's,
TaiChi's; ARES's and AMPD's papers measure otherwise, and the claim rows say so).

    python bench/verdicts.py --quick                   # a tiny comparison, ~15 s (the test)
    python bench/verdicts.py --list                    # the comparisons and their claims
    python bench/verdicts.py --only ares-memory --out docs/results/verdicts
    python bench/verdicts.py --out docs/results/verdicts   # every comparison (hours on 2 cores)

`--out DIR` writes DIR/NAME.json per comparison and DIR/rows.md: the verdicts.md rows of the
claims whose comparisons ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from pdserve.config import Config
from pdserve.planning.multi_fidelity import SearchBudget
from pdserve.planning.run_length import LONG, SHORT, Fidelity
from pdserve.planning.verdict import (
    Comparison,
    Contender,
    Measurement,
    VerdictResult,
    VerdictRun,
    format_verdict,
    verdict_json,
)


@dataclass(frozen=True)
class Claim:
    paper: str
    claim: str  # the paper's headline claim
    figure: str  # the paper's figure for it
    comparison: str  # the comparison that tests it
    against: str  # the contender the claim's policy is set against


def budget(jobs: int, limit_s: float = 900.0) -> SearchBudget:
    """The tuning search every contender of a comparison gets: the planner's fidelities, the
    2 best deployments by the screen simulated short, the best confirmed on one long run."""
    return SearchBudget(limit_s, jobs, 2, 1, 1, SHORT, LONG)


MEASURE = Measurement(seeds=3, duration_s=30.0, min_requests=300, lifetimes=1.0,
                      max_doublings=2)
# TaiChi's chat runs are short (a few seconds per request): doubled up to 32x (960 s of
# arrivals), where MEASURE's 4x never settled. FlowKV's too: at its 30 s TTFT SLO a run of
# T seconds absorbs an overload for ~30 s, so goodput falls as ~1/T (1K prompts: 26.8 ->
# 21.8 -> 19.2 req/s over 1x-4x, 12 % at the last doubling), which 32x brings under 3 %
LONG_MEASURE = replace(MEASURE, max_doublings=5)
# Arrow's traces are short at its goodputs (azure-code's 8,819 requests are ~80 s at 110
# req/s): from 4x on a run replays the trace end to end (`workload.repeat`), so a doubling
# takes in more of the trace's pattern rather than the same whole trace again; up to 128x
# (min-load 4P4D is prefill-bound at ~40 req/s, where its attainment falls only ~0.7 points
# per req/s: a point of attainment moves its goodput ~4 %, and at 64x one seed still moved 5 %)
ARROW_MEASURE = replace(MEASURE, max_doublings=7)
# AMPD's sessions: runs of 300 rounds (~40 sessions) moved goodput by up to 30 % per
# doubling, at 8x still by 2-15 % (the session draws), at 32x one seed by 3.1 %; up to 64x
AMPD_MEASURE = Measurement(seeds=3, duration_s=120.0, min_requests=1200, lifetimes=1.0,
                           max_doublings=6)
# ARES's heavy-tailed outputs (P90 32K tokens, ~11 minutes of decoding): goodput fell
# 0.44 -> 0.27 -> 0.20 req/s over 150 -> 300 -> 600 requests, so runs start at 300; up to
# 128x, where at 8x a doubling still moved a seed's goodput by up to 26 % either way, at 16x
# by 3-8 %, at 32x by 3.5-4.3 % and at 64x one draw (seed 2) by 4.5 % (each doubling draws a
# new sample of the tail, not a trend)
ARES_MEASURE = Measurement(seeds=3, duration_s=1200.0, min_requests=300, lifetimes=4.0,
                           max_doublings=7)


def arrow_base(trace: str, ttft_s: float, tpot_s: float) -> Config:
    """bench/arrow_repro.py: Llama-3.1-8B on 8 x H800, the trace, the paper's SLOs."""
    return Config().with_values({
        "workload.trace": trace, "perf.model": "llama-3.1-8b", "perf.gpu": "h800",
        "slo.ttft_s": ttft_s, "slo.tpot_s": tpot_s, "instance.max_batch_size": 256,
        "monitor.interval_s": 1.0, "seed": 0})


def ares_base() -> Config:
    """bench/ares_repro.py: 1P+3D W8A8 RTX 4090D, one per node on 25 Gbps, Table 2's long
    ShareGPT outputs; the memory-bound regime (KV 165K tokens per decode instance)."""
    return Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_lengths": "table:sharegpt-long",
        "workload.synthetic_requests": 100_000, "workload.synthetic_rate_rps": 0.25,
        "cluster.prefill": 1, "cluster.decode": 3, "perf.tp": 1,
        "perf.model": "deepseek-r1-distill-qwen-7b-w8a8", "perf.gpu": "rtx-4090d",
        "cluster.inter_node_link": "tcp-25g", "cluster.instances_per_node": 1,
        "slo.ttft_s": 10.0, "slo.tpot_s": 0.03, "policy.ares.forecast.predictor": "history",
        "seed": 0})


def ares_alpaca_base() -> Config:
    """As `ares_base`, Table 2's Alpaca long outputs (mean 8.6K tokens)."""
    return ares_base().with_values({"workload.synthetic_lengths": "table:alpaca-long"})


def ampd_base() -> Config:
    """bench/ampd_repro.py: Qwen3-32B on 8 x H20, ToolBench-like agent sessions, the paper's
    Fig. 4 SLOs (TTFT 0.35 s, ITL 40 ms, judged as TPOT); rate in sessions per second."""
    return Config().with_values({
        # at most 16,000 sessions (~4 rounds each) per run: enough for AMPD_MEASURE's 64x
        # (1,000 ran out before 8x); the cap also bounds the planner's trials
        "workload.trace": "agent:toolbench", "workload.synthetic_requests": 16000,
        "workload.synthetic_rate_rps": 0.5, "perf.model": "qwen3-32b", "perf.gpu": "h20",
        "slo.ttft_s": 0.35, "slo.tpot_s": 0.040, "seed": 1})


def ampd_prompt_base() -> Config:
    """`ampd_base` with Table 1 read as the mean prompt per round, history included
    (`agent:toolbench:prompt`, the likelier reading: docs/results/ampd.md); rounds are ~3x
    cheaper and goodput ~8x higher, so up to 24,000 sessions (3,000 ran out before 8x)."""
    return ampd_base().with_values({"workload.trace": "agent:toolbench:prompt",
                                    "workload.synthetic_requests": 24000,
                                    "workload.synthetic_rate_rps": 6.0})


def taichi_base(ttft_s: float, tpot_s: float) -> Config:
    """bench/taichi_repro.py: Qwen2.5-14B, 4 x A100 (TP 1), ShareGPT chat, the SLO pair,
    judged on TaiChi's own TTFT and TPOT (the wait for a decode slot counts, sec. 4.1)."""
    return Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_lengths": "table:sharegpt",
        "workload.synthetic_requests": 100_000, "workload.synthetic_rate_rps": 30.0,
        "perf.model": "qwen2.5-14b", "perf.gpu": "a100", "perf.tp": 1,
        "slo.ttft_s": ttft_s, "slo.tpot_s": tpot_s, "slo.counts_decode_queue": True,
        "monitor.interval_s": 0.1, "seed": 1})


def flowkv_base(input_tokens: int = 1024) -> Config:
    """bench/flowkv_repro.py (a): Llama-3.1-8B on A100s, prompts of `input_tokens` (the paper's
    1K, 5K and 10K), 256 output tokens, its lax SLOs (TTFT 30 s, TPOT 200 ms: a throughput
    comparison)."""
    return Config().with_values({
        "workload.trace": "synthetic",
        "workload.synthetic_lengths": f"fixed:{input_tokens}:256",
        "workload.synthetic_requests": 100_000, "workload.synthetic_rate_rps": 10.0,
        "perf.model": "llama-3.1-8b", "perf.gpu": "a100", "perf.tp": 1,
        "slo.ttft_s": 30.0, "slo.tpot_s": 0.2, "seed": 0})


def flowkv_hetero_base() -> Config:
    """bench/flowkv_repro.py (b): 4 L20 + 4 H20, arXiv lengths, 25 Gbps between nodes."""
    return Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_lengths": "table:arxiv-lengths",
        "workload.synthetic_requests": 100_000, "workload.synthetic_rate_rps": 4.0,
        "perf.model": "llama-3.1-8b", "cluster.inter_node_link": "tcp-25g",
        "slo.ttft_s": 10.0, "slo.tpot_s": 0.1, "seed": 0})


def comparisons(jobs: int) -> dict[str, Comparison]:
    b = budget(jobs)
    arrow3 = (Contender("arrow", "arrow"), Contender("vllm (colocated)", "colocated"),
              Contender("disaggregated (static-pd)", "static-pd"))
    # the claim is about the rebalancer: all three on the paper's 1P3D (memory-bound regime)
    ares3 = (Contender("ares (history)", "ares", (("policy.name", "ares"),)),
             Contender("reschedule-current", "reschedule-current",
                       (("policy.name", "reschedule-current"),)),
             Contender("vllm", "static-pd", (("policy.name", "vllm"),)))
    # at the paper's deployment (fixed): AMPD, its two ablations' baselines and colocated vLLM
    ampd4 = tuple(Contender(label, name, (("policy.name", name),)) for label, name in (
        ("ampd", "ampd"), ("dynamo", "dynamo"), ("vllm (colocated)", "colocated"),
        ("ampd-no-reorder", "ampd-no-reorder")))
    ampd4_spaces = (Contender("ampd", "ampd"), Contender("dynamo", "dynamo"),
                    Contender("vllm (colocated)", "colocated"),
                    Contender("ampd-no-reorder", "ampd-no-reorder"))
    taichi3 = (Contender("taichi", "taichi"), Contender("aggregation (colocated)", "colocated"),
               Contender("disaggregation (static-pd)", "static-pd"))
    found = [
        Comparison("arrow-azure-code", arrow_base("azure-code", 3.0, 0.1), 8, arrow3, b,
                   ARROW_MEASURE),
        Comparison("arrow-azure-conv", arrow_base("azure-conv", 2.0, 0.15), 8, arrow3, b,
                   ARROW_MEASURE),
        # Fig. 8's ablation is about the mechanism at one deployment: 4P4D TP 1 both
        Comparison("arrow-ablation-azure-code", arrow_base("azure-code", 3.0, 0.1).with_values(
            {"cluster.prefill": 4, "cluster.decode": 4, "perf.tp": 1}), 8,
            (Contender("arrow", "arrow", (("policy.name", "arrow"),)),
             Contender("min-load 4P4D", "static-pd", (("policy.name", "static-pd"),))),
            b, ARROW_MEASURE, tune=False),
        Comparison("ares-memory", ares_base(), 4, ares3, b, ARES_MEASURE, tune=False),
        # the SLO sweep (the 30 ms pair is pdserve's, the paper gives none): a looser TPOT
        # moves the goodput rate up into the memory-bound regime where rebalancing acts
        *(Comparison(f"ares-memory-tpot{ms}", ares_base().with_values({"slo.tpot_s": ms / 1e3}),
                     4, ares3, b, ARES_MEASURE, tune=False) for ms in (60, 100)),
        Comparison("ares-alpaca", ares_alpaca_base(), 4, ares3, b, ARES_MEASURE, tune=False),
        # predicted-length-aware dispatch (pdserve's option, policies/ares/dispatch.py) with a
        # predictor as accurate as the paper's (MAE 3,873 tokens), against dispatch by
        # current load and against ARES's migrations on the same predictor
        Comparison("ares-dispatch", ares_base(), 4, (
            Contender("vllm + predicted dispatch (MAE 3873)", "static-pd", (
                ("policy.name", "vllm"), ("policy.decode_router", "predicted-load"),
                ("policy.ares.forecast.predictor", "noisy:mae=3873"))),
            Contender("vllm", "static-pd", (("policy.name", "vllm"),)),
            Contender("ares (MAE 3873)", "ares", (
                ("policy.name", "ares"), ("policy.ares.forecast.predictor", "noisy:mae=3873")))),
            b, ARES_MEASURE, tune=False),
        # every contender at its own best deployment of the 8 GPUs, by the same search
        Comparison("ampd-toolbench", ampd_base(), 8, ampd4_spaces, b, AMPD_MEASURE),
        Comparison("ampd-toolbench-prompt", ampd_prompt_base(), 8, ampd4_spaces, b,
                   AMPD_MEASURE),
        # the paper's own deployment (ampd_repro.py's: TP 4, disaggregated ones 1P1D, colocated
        # 2 instances), every contender there
        Comparison("ampd-toolbench-fixed", ampd_base().with_values({
            "perf.tp": 4, "cluster.prefill": 1, "cluster.decode": 1, "cluster.instances": 2,
            "workload.synthetic_rate_rps": 1.0}), 8, ampd4, b, AMPD_MEASURE, tune=False),
        # as ampd-toolbench-fixed with Table 1 read as the mean prompt per round, history
        # included (`agent:toolbench:prompt`, the likelier reading: docs/results/ampd.md)
        Comparison("ampd-toolbench-prompt-fixed", ampd_prompt_base().with_values({
            "perf.tp": 4, "cluster.prefill": 1, "cluster.decode": 1, "cluster.instances": 2,
            "workload.synthetic_rate_rps": 6.0}), 8, ampd4, b, AMPD_MEASURE, tune=False),
        Comparison("taichi-chat-slo1", taichi_base(3.0, 0.110), 4, taichi3, b, LONG_MEASURE),
        Comparison("taichi-chat-slo2", taichi_base(4.0, 0.070), 4, taichi3, b, LONG_MEASURE),
        *(Comparison(f"flowkv-a100-{label}", flowkv_base(tokens), 2, (
            Contender("flowkv", "flowkv"), Contender("colocated", "colocated"),
            Contender("static-pd", "static-pd")), b, LONG_MEASURE)
          for label, tokens in (("1k", 1024), ("5k", 5120), ("10k", 10240))),
        # heterogeneous GPUs are not a planner candidate: the paper's 4 + 4 placement, fixed
        Comparison("flowkv-hetero", flowkv_hetero_base(), 8, (
            Contender("flowkv P-L20/D-H20", "flowkv", (
                ("policy.name", "flowkv"),
                ("cluster.instances", "4xl20:prefill,4xh20:decode"))),
            Contender("colocated L20+H20", "colocated", (
                ("policy.name", "colocated"), ("cluster.instances", "4xl20:mixed,4xh20:mixed"))),
            Contender("flowkv P-H20/D-L20", "flowkv", (
                ("policy.name", "flowkv"),
                ("cluster.instances", "4xh20:prefill,4xl20:decode")))),
            b, LONG_MEASURE, tune=False),
    ]
    return {c.name: c for c in found}


CLAIMS = (
    Claim("Arrow", "goodput over vLLM (1 x TP 8), Azure Code", "5.62x", "arrow-azure-code",
          "vllm (colocated)"),
    Claim("Arrow", "goodput over vLLM-disaggregated (1P1D TP 4), Azure Code", "7.78x",
          "arrow-azure-code", "disaggregated (static-pd)"),
    Claim("Arrow", "goodput over vLLM, Azure Conversation", "3.76x", "arrow-azure-conv",
          "vllm (colocated)"),
    Claim("Arrow", "goodput over vLLM-disaggregated, Azure Conversation", "4.06x",
          "arrow-azure-conv", "disaggregated (static-pd)"),
    Claim("Arrow", "elastic pools over the same 4P4D with min-load dispatch (Fig. 8)", "1.67x",
          "arrow-ablation-azure-code", "min-load 4P4D"),
    Claim("ARES", "goodput over vLLM, ShareGPT long outputs (sec. 6.2)", "1.93x", "ares-memory",
          "vllm"),
    Claim("ARES", "goodput over rescheduling on current load (prediction matters)", "1.16x",
          "ares-memory", "reschedule-current"),
    *(Claim("ARES", f"goodput over vLLM, ShareGPT long outputs, TPOT SLO {ms} ms (SLO sweep)",
            "1.93x", f"ares-memory-tpot{ms}", "vllm") for ms in (60, 100)),
    Claim("ARES", "goodput over vLLM, Alpaca long outputs (up to)", "2.24x", "ares-alpaca",
          "vllm"),
    Claim("ARES", "prediction over current-load rescheduling, Alpaca",
          "P99 TPOT -45.4 % (no goodput figure)", "ares-alpaca", "reschedule-current"),
    Claim("ARES", "predicted-length-aware dispatch over current-load dispatch (sec. 3's "
          "motivation; pdserve's option)", "none (no dispatch rule in the paper)",
          "ares-dispatch", "vllm"),
    Claim("ARES", "predicted-length-aware dispatch over ARES's migrations, same predictor",
          "none", "ares-dispatch", "ares (MAE 3873)"),
    Claim("AMPD", "SLO attainment over Dynamo (always remote prefill)", "+67.29 %",
          "ampd-toolbench", "dynamo"),
    Claim("AMPD", "SLO attainment over vLLM (colocated)", "+339.74 %", "ampd-toolbench",
          "vllm (colocated)"),
    Claim("AMPD", "prefill reordering (Alg. 2) over none", "+13.42-14.81 %", "ampd-toolbench",
          "ampd-no-reorder"),
    Claim("AMPD", "SLO attainment over Dynamo, Table 1 read as mean prompt per round",
          "+67.29 %", "ampd-toolbench-prompt", "dynamo"),
    Claim("AMPD", "SLO attainment over vLLM, Table 1 read as mean prompt per round",
          "+339.74 %", "ampd-toolbench-prompt", "vllm (colocated)"),
    Claim("AMPD", "prefill reordering over none, Table 1 read as mean prompt per round",
          "+13.42-14.81 %", "ampd-toolbench-prompt", "ampd-no-reorder"),
    Claim("AMPD", "SLO attainment over Dynamo, at the paper's 1P1D TP4", "+67.29 %",
          "ampd-toolbench-fixed", "dynamo"),
    Claim("AMPD", "SLO attainment over vLLM (2 x TP4), at the paper's deployment", "+339.74 %",
          "ampd-toolbench-fixed", "vllm (colocated)"),
    Claim("AMPD", "prefill reordering over none, at the paper's 1P1D TP4", "+13.42-14.81 %",
          "ampd-toolbench-fixed", "ampd-no-reorder"),
    Claim("AMPD", "SLO attainment over Dynamo, mean-prompt reading, at the paper's 1P1D TP4",
          "+67.29 %", "ampd-toolbench-prompt-fixed", "dynamo"),
    Claim("AMPD", "SLO attainment over vLLM (2 x TP4), mean-prompt reading, paper's deployment",
          "+339.74 %", "ampd-toolbench-prompt-fixed", "vllm (colocated)"),
    Claim("AMPD", "prefill reordering over none, mean-prompt reading, at the paper's 1P1D TP4",
          "+13.42-14.81 %", "ampd-toolbench-prompt-fixed", "ampd-no-reorder"),
    Claim("TaiChi", "goodput over the best aggregation, chat SLO1", "+9-11 %",
          "taichi-chat-slo1", "aggregation (colocated)"),
    Claim("TaiChi", "goodput over the best disaggregation, chat SLO1", "+43-49 %",
          "taichi-chat-slo1", "disaggregation (static-pd)"),
    Claim("TaiChi", "goodput over the best aggregation, chat SLO2", "+24-25 %",
          "taichi-chat-slo2", "aggregation (colocated)"),
    Claim("TaiChi", "goodput over the best disaggregation, chat SLO2", "+29-37 %",
          "taichi-chat-slo2", "disaggregation (static-pd)"),
    Claim("FlowKV", "throughput over vLLM colocated, 2 A100s, 1K-token inputs",
          "+25 % (mean of 1K/5K/10K)", "flowkv-a100-1k", "colocated"),
    Claim("FlowKV", "throughput over vLLM-Disagg 1P1D, 2 A100s", "+35 %", "flowkv-a100-1k",
          "static-pd"),
    Claim("FlowKV", "throughput over vLLM colocated, 2 A100s, 5K-token inputs",
          "+25 % (mean of 1K/5K/10K)", "flowkv-a100-5k", "colocated"),
    Claim("FlowKV", "throughput over vLLM-Disagg 1P1D, 2 A100s, 5K-token inputs", "+35 %",
          "flowkv-a100-5k", "static-pd"),
    Claim("FlowKV", "throughput over vLLM colocated, 2 A100s, 10K-token inputs",
          "+25 % (mean of 1K/5K/10K)", "flowkv-a100-10k", "colocated"),
    Claim("FlowKV", "throughput over vLLM-Disagg 1P1D, 2 A100s, 10K-token inputs", "+35 %",
          "flowkv-a100-10k", "static-pd"),
    Claim("FlowKV", "heterogeneous 4P4D P-L20/D-H20 over vLLM colocated (E2E, gov_report)",
          "48.9 % faster", "flowkv-hetero", "colocated L20+H20"),
    Claim("FlowKV", "heterogeneous P-L20/D-H20 over P-H20/D-L20 (E2E, gov_report)",
          "34.67 % faster", "flowkv-hetero", "flowkv P-H20/D-L20"),
)


def quick(jobs: int) -> Comparison:
    """A tiny comparison with a known winner: 16-token prompts, 128 output tokens, 20 ms TPOT
    on 2 H800s; static-pd's 1P1D halves the decode capacity colocated's two instances have."""
    base = Config().with_values({
        "workload.trace": "synthetic", "workload.synthetic_lengths": "fixed:16:128",
        "workload.synthetic_requests": 100_000, "workload.synthetic_rate_rps": 10.0,
        "perf.model": "llama-3.1-8b", "perf.gpu": "h800", "perf.tp": 1,
        "slo.ttft_s": 2.0, "slo.tpot_s": 0.02})
    tiny = SearchBudget(30.0, jobs, 1, 1, 1, Fidelity("short", 2.0, 50, 0.1, 1.2),
                        Fidelity("long", 2.0, 50, 0.1, 1.2))
    return Comparison("quick-decode-heavy", base, 2, (
        Contender("colocated", "colocated"), Contender("static-pd", "static-pd")), tiny,
        Measurement(seeds=3, duration_s=1.0, min_requests=50, lifetimes=0.0, max_doublings=1))


def _interval(result: VerdictResult, label: str) -> str:
    r = next(c for c in result.contenders if c.label == label)
    g = r.goodput
    return f"{g.mean:.3g} +- {(g.high - g.low) / 2:.2g}"


def claim_row(claim: Claim, result: VerdictResult) -> str:
    """A verdicts.md row: paper, claim, the paper's figure, pdserve's (both goodputs with
    their intervals, the ratio), seeds and run length, the outcome."""
    first = result.contenders[0]
    other = next(c for c in result.contenders if c.label == claim.against)
    outcome = next(o for o in result.outcomes if o.against == claim.against)
    ratio = first.goodput.mean / other.goodput.mean if other.goodput.mean > 0 else float("inf")
    runs = ", ".join(f"{c.run_requests} req / {c.run_s:.0f} s" for c in (first, other))
    flags = [] if first.stationary and other.stationary else ["not stationary at the cap"]
    return (f"| {claim.paper} | {claim.claim} | {claim.figure} | {first.label} "
            f"{_interval(result, first.label)} vs {other.label} "
            f"{_interval(result, claim.against)} req/s ({ratio:.2f}x) | "
            f"{len(first.seeds)} ({runs}{'; ' + flags[0] if flags else ''}) | "
            f"**{outcome.result}** |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tiny comparison only")
    parser.add_argument("--only", help="comparisons by name, comma-separated")
    parser.add_argument("--list", action="store_true", help="list comparisons and claims")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--out", type=Path, help="write NAME.json and rows.md here")
    args = parser.parse_args()
    table = comparisons(args.jobs)
    if args.list:
        for name, c in table.items():
            print(f"{name}: {', '.join(x.label for x in c.contenders)} on {c.gpus} GPUs"
                  + ("" if c.tune else " (fixed deployment)"))
            for claim in CLAIMS:
                if claim.comparison == name:
                    print(f"    {claim.paper}: {claim.claim} (paper {claim.figure})")
        return 0
    if args.quick:
        chosen = [quick(args.jobs)]
    else:
        names = args.only.split(",") if args.only else list(table)
        unknown = [n for n in names if n not in table]
        if unknown:
            print(f"unknown comparisons {unknown}; known: {', '.join(table)}", file=sys.stderr)
            return 2
        chosen = [table[n] for n in names]
    rows = []
    for comparison in chosen:
        started = time.monotonic()
        result = VerdictRun(comparison, lambda text: print(text, flush=True)).run()
        wall_s = time.monotonic() - started
        print(format_verdict(result))
        print(f"({wall_s:.0f} s wall)\n", flush=True)
        rows += [claim_row(c, result) for c in CLAIMS if c.comparison == comparison.name]
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            record = verdict_json(result) | {"wall_s": wall_s}
            (args.out / f"{comparison.name}.json").write_text(json.dumps(record, indent=1)
                                                              + "\n")
    if rows:
        print("\n".join(rows))
        if args.out:
            with (args.out / "rows.md").open("a") as f:
                f.write("\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
