"""Reproduce AMPD's experiments (sec. 7, Fig. 4-5, Appendix A.2-A.3) in the simulator.

Setup (sec. 7.1): H20 GPUs, NVLink inside an 8-GPU server, 200 Gb/s InfiniBand per GPU
between servers; Qwen3-32B (TP2 instances) and Llama-3.1-70B (TP4); ToolBench-like and
HotpotQA-like sessions on one server, DuReader-like on two, GAIA-like on four
(`agent:<kind>` workloads, Table 1); Poisson session arrivals; the paper's SLOs per model and
trace (Fig. 4 titles). Policies: ampd, ampd w/o PR (no reordering), dynamo (always remote:
AMPD w/o AR+PR, the Dynamo baseline), colocated (vLLM-like) and continuum (colocated with
session affinity and continuing rounds first, a vLLM-Continuum stand-in). Disaggregated
policies split the instances half and half.

Load (`--axis`): `load` (the default) starts L * base sessions per second at load L, where
base puts 30 % of the cluster's prefill capacity (2048-token chunks, no history) under the
trace's per-session new prompt tokens; `sessions` starts L sessions per second, Fig. 4's
axis ("Request Arrival Rate (request/s)", ticks 0.8-2.4 for every trace; a request is a
session, sec. 3), with the sensitivity at Fig. 6's 2 requests/s. `--reading` says how
Table 1's prefill length is read (`pdserve.workload.sessions`): `new` (the default) new
prompt tokens per round, `prompt` the mean prompt per round, history included. The
feasibility table sets each trace's prefill work per session against the cluster's prefill
capacity (every instance prefilling only, perfect 2K-token batches, history kept) under both
readings.

Also: the share of local and remote prefills under ampd; the planner's top three against
the best deployments found by simulating every deployment (Qwen3-32B, ToolBench, 8 GPUs);
and the planner's wall time at 8, 64 and 256 GPUs (noisy on a shared machine).

Every H20 is priced by `--backend` (default: the presets' default, the newest vLLM measured
for the H100's tables, scaled to the H20 per bound); the header names it.

    python bench/ampd_repro.py            # a few minutes on 2 cores
    python bench/ampd_repro.py --axis sessions --reading prompt   # the paper's setup
    python bench/ampd_repro.py --quick    # 4 sessions per run (GAIA 2), no planner: the test
                                          # suite's run
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from pdserve.cluster.topology import GPUS_PER_NODE, Topology, gpu_link, network_link
from pdserve.config import Config
from pdserve.metrics.summary import summarize
from pdserve.perf.fitted import PerfModel
from pdserve.perf.presets import DEFAULT_BACKEND, perf_model
from pdserve.planning.ampd import feasible_degrees, plan
from pdserve.planning.ampd_ilp import Deployment
from pdserve.planning.ampd_inputs import PlanInputs, replica_sim_settings
from pdserve.planning.ampd_verify import cluster_attainment, verify
from pdserve.policies.ampd.preset import AMPD_VARIANTS, build_ampd_policy
from pdserve.policies.ampd.settings import AmpdSettings
from pdserve.policies.presets import build_policy
from pdserve.sim.runner import policy_setup
from pdserve.sim.simulator import Simulator
from pdserve.types import SLO, attn_units
from pdserve.workload.sessions import AGENT_PROFILES, TABLE1_READINGS, session_workload

MODELS = {"qwen3-32b": 2, "llama-3.1-70b": 4}  # default tensor parallelism (the load's base)
TP_CHOICES = {"qwen3-32b": (2, 4, 8), "llama-3.1-70b": (4, 8)}
TRACE_GPUS = {"toolbench": 8, "hotpotqa": 8, "dureader": 16, "gaia": 32}
# AMPD's gain in SLO attainment over (Dynamo, vLLM, vLLM-Continuum) annotated in Fig. 4 at
# 0.8, 1.6 and 2.4 requests/s (the text's 1st, 3rd and 5th triple before each panel's title;
# the order is read from the legend and from vLLM-Continuum "nearly tied with vLLM"; None:
# the text lost it)
PAPER_BASELINES = ("dynamo", "colocated", "continuum")
PAPER_FIG4_GAINS: dict[tuple[str, str], tuple[tuple[float | None, ...], ...]] = {
    ("qwen3-32b", "toolbench"): ((0.0, 3.78, 3.78), (0.0302, 25.38, 25.38),
                                 (0.1217, 15.14, 15.14)),
    ("qwen3-32b", "gaia"): ((0.0757, 0.0, 0.0), (0.1513, 0.1076, 0.1076),
                            (0.1968, 0.0776, 0.0135)),
    ("qwen3-32b", "hotpotqa"): ((0.0169, 0.0345, 0.0345), (0.2193, 0.4591, 0.3692),
                                (2.19, 0.4775, 0.3199)),
    ("qwen3-32b", "dureader"): ((0.0, 5.43, 5.43), (0.1819, 11.99, 11.99), (0.0909, 8.59, None)),
    ("llama-3.1-70b", "toolbench"): ((0.0, 0.5088, 0.5088), (0.1364, 1.86, 1.86),
                                     (0.9586, 1.04, 1.04)),
    ("llama-3.1-70b", "gaia"): ((2.23, 0.2489, 0.2489), (4.74, 0.3489, 0.3489),
                                (9.68, 0.2488, 0.1501)),
    ("llama-3.1-70b", "hotpotqa"): ((0.0, 0.1020, 0.1020), (0.1333, 0.7003, 0.7003),
                                    (0.6161, 0.0918, 0.0918)),
    ("llama-3.1-70b", "dureader"): ((0.0, 0.25, 0.25), (0.1334, 0.4572, 0.4572),
                                    (0.1892, 1.20, 1.20)),
}
SLOS = {  # AMPD Fig. 4: (TTFT, ITL) in seconds
    ("qwen3-32b", "toolbench"): (0.35, 0.040), ("qwen3-32b", "gaia"): (1.0, 0.035),
    ("qwen3-32b", "hotpotqa"): (0.45, 0.030), ("qwen3-32b", "dureader"): (1.2, 0.040),
    ("llama-3.1-70b", "toolbench"): (1.0, 0.050), ("llama-3.1-70b", "gaia"): (1.5, 0.035),
    ("llama-3.1-70b", "hotpotqa"): (2.5, 0.045), ("llama-3.1-70b", "dureader"): (5.0, 0.050),
}
POLICIES = ("ampd", "ampd-no-reorder", "dynamo", "colocated", "continuum")
LOADS = (0.8, 1.6, 2.4)  # load levels, or sessions per second (Fig. 4's ticks)
AXES = ("load", "sessions")
SENSITIVITY_LOAD = {"load": 1.6, "sessions": 2.0}  # Fig. 6: 2 reqs/s
BASE_UTILISATION = 0.3
CHUNK_TOKENS = 2048


@dataclass(frozen=True)
class Setup:
    """What every run of this script shares: its load axis and reading of Table 1."""

    sessions: int  # per run (GAIA half)
    backend: str  # the performance source (`perf.backend`)
    axis: str = "load"  # "load": L x base sessions/s; "sessions": L sessions/s
    reading: str = "new"  # Table 1's prefill length: "new" tokens or mean "prompt" per round
    jobs: int = 2

    def workload_name(self, trace: str) -> str:
        return f"agent:{trace}" if self.reading == "new" else f"agent:{trace}:{self.reading}"

    def rate_sps(self, model: str, trace: str, load: float) -> float:
        """Sessions started per second at `load` on this setup's axis."""
        if self.axis == "sessions":
            return load
        tp = MODELS[model]
        perf = perf_model(model, "h20", tp, self.backend)
        return load * base_rate_sps(perf, trace, TRACE_GPUS[trace] // tp, self.reading)


@dataclass(frozen=True)
class Case:
    model: str
    trace: str
    policy: str
    load: float
    sessions: int
    tp: int
    setup: Setup
    ampd: AmpdSettings = AmpdSettings()  # alpha, beta, window (the paper's by default)


def topology(perfs: list[PerfModel], tp: int) -> Topology:
    inter = network_link("rdma-200g").aggregated(tp)
    return Topology.build([gpu_link(p) for p in perfs], GPUS_PER_NODE // tp, inter)


def base_rate_sps(perf: PerfModel, trace: str, instances: int, reading: str = "new") -> float:
    chunk = CHUNK_TOKENS
    per_instance = chunk / perf.prefill.time_s(chunk, attn_units(chunk, 0))
    profile = AGENT_PROFILES[trace]
    per_session = profile.mean_rounds * profile.new_tokens_per_round(reading)
    return BASE_UTILISATION * instances * per_instance / per_session


def run_case(case: Case) -> dict[str, float]:
    tp, setup = case.tp, case.setup
    perf = perf_model(case.model, "h20", tp, setup.backend)
    instances = TRACE_GPUS[case.trace] // tp
    slo = SLO(*SLOS[case.model, case.trace])
    rate = setup.rate_sps(case.model, case.trace, case.load)
    workload = session_workload(setup.workload_name(case.trace), case.sessions, rate, seed=1)
    half = instances // 2
    if case.policy in AMPD_VARIANTS:
        policy, context = build_ampd_policy(case.policy, slo, half, instances - half, [perf],
                                            case.ampd)
    else:
        config = Config().with_values({"policy.name": case.policy, "cluster.instances": instances,
                                       "slo.ttft_s": slo.ttft_s, "slo.tpot_s": slo.tpot_s})
        policy, _ = build_policy(policy_setup(config, perf))
        context = None
    sim = Simulator(policy, instances, perf, replica_sim_settings(),
                    topology([perf] * instances, tp))
    result = sim.run(workload.requests())
    summary = summarize(result.requests, slo)
    stats = result.sessions
    out = {"attainment": summary.slo_attainment, "ttft": summary.ttft_attainment,
           "itl": summary.tpot_attainment, "evicted": stats.history_evicted}
    if context is not None:
        local = context.counts["local"] + context.counts["cost-local"]
        out["local_share"] = local / max(1, sum(context.counts.values()))
    return out


def deployment_attainment(args: tuple[Deployment, PlanInputs]) -> float:
    return cluster_attainment(*args)


def load_label(setup: Setup) -> str:
    return "sessions/s" if setup.axis == "sessions" else "load"


def prefill_instance_s(perf: PerfModel, new_tokens: int, history_tokens: int) -> float:
    """An instance's time for one round's prefill at its best: a share of full 2K-token
    steps (no per-step overhead of its own) plus the attention to its history."""
    full = perf.prefill.time_s(CHUNK_TOKENS, 0)
    attention = (perf.prefill.time_s(CHUNK_TOKENS, attn_units(new_tokens, history_tokens))
                 - full)
    return new_tokens / CHUNK_TOKENS * full + attention


def feasibility(setup: Setup, sessions: int = 400) -> None:
    """Each trace's prefill work per session under both readings of Table 1 against the
    cluster's prefill capacity: every instance prefilling only, in perfect 2K-token
    batches, every history kept (an upper bound on what any policy can serve)."""
    print("\n## Prefill feasibility: work per session against the cluster's prefill capacity "
          "(every instance prefilling only, full 2K-token batches, history kept; the TP with "
          "the most capacity)\n")
    print("| model | trace (GPUs) | reading | new tokens / session | mean prompt | TP | "
          "capacity sessions/s | capacity tokens/s (at 2K, no history) | "
          + " | ".join(f"demand at {load:g} sessions/s" for load in LOADS) + " |")
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(LOADS))
    for model, trace, reading in itertools.product(MODELS, TRACE_GPUS, TABLE1_READINGS):
        workload = session_workload(f"agent:{trace}:{reading}", sessions, 1.0, seed=1)
        assert workload.history_tokens is not None
        history = workload.history_tokens.tolist()
        new = (workload.input_tokens - workload.history_tokens).tolist()
        best: tuple[float, int, PerfModel] | None = None
        for tp in TP_CHOICES[model]:
            perf = perf_model(model, "h20", tp, setup.backend)
            busy_s = sum(prefill_instance_s(perf, n, h) for n, h in zip(new, history,
                                                                        strict=True))
            capacity_sps = (TRACE_GPUS[trace] // tp) * sessions / busy_s
            if best is None or capacity_sps > best[0]:
                best = (capacity_sps, tp, perf)
        assert best is not None
        capacity_sps, tp, perf = best
        tokens_per_session = sum(new) / sessions
        chunk_tps = (TRACE_GPUS[trace] // tp) * CHUNK_TOKENS / perf.prefill.time_s(
            CHUNK_TOKENS, 0)
        demand = " | ".join(f"{load * tokens_per_session:,.0f} tok/s = "
                            f"{load / capacity_sps:.0%}" for load in LOADS)
        print(f"| {model} | {trace} ({TRACE_GPUS[trace]}) | {reading} | "
              f"{tokens_per_session:,.0f} | {workload.input_tokens.mean():,.0f} | {tp} | "
              f"{capacity_sps:.2f} | {capacity_sps * tokens_per_session:,.0f} "
              f"({chunk_tps:,.0f}) | {demand} |")


def end_to_end(pool: ProcessPoolExecutor, setup: Setup) -> None:
    sessions = setup.sessions
    cases = [Case(m, t, p, load, sessions if t != "gaia" else sessions // 2, tp, setup)
             for m in MODELS for t in TRACE_GPUS for tp in TP_CHOICES[m]
             if TRACE_GPUS[t] // tp >= 2 for load in LOADS for p in POLICIES]
    results = dict(zip(cases, pool.map(run_case, cases), strict=True))

    def result(m: str, t: str, p: str, load: float, tp: int) -> dict[str, float]:
        return results[next(c for c in cases if (c.model, c.trace, c.policy, c.load, c.tp)
                            == (m, t, p, load, tp))]

    tuned: dict[tuple[str, str, str], int] = {}  # every policy at its best TP (sec. 7.1)
    for m, t, p in itertools.product(MODELS, TRACE_GPUS, POLICIES):
        options = [tp for tp in TP_CHOICES[m] if TRACE_GPUS[t] // tp >= 2]
        tuned[m, t, p] = max(options, key=lambda tp: sum(
            result(m, t, p, load, tp)["attainment"] for load in LOADS))
    print("\n## SLO attainment (TTFT and ITL both met), % of requests; each policy at the "
          "TP (instances half prefill, half decode) that serves it best\n")
    print(f"| model | trace (GPUs) | {load_label(setup)} | " + " | ".join(POLICIES)
          + " | ampd local share |")
    print("|---|---|---|" + "---|" * (len(POLICIES) + 1))
    gains: dict[str, list[float]] = {p: [] for p in POLICIES[1:]}
    for m, t, load in itertools.product(MODELS, TRACE_GPUS, LOADS):
        row = {p: result(m, t, p, load, tuned[m, t, p]) for p in POLICIES}
        cells = " | ".join(f"{row[p]['attainment']:.1%} (T {row[p]['ttft']:.0%}, "
                           f"I {row[p]['itl']:.0%}) TP{tuned[m, t, p]}" for p in POLICIES)
        print(f"| {m} | {t} ({TRACE_GPUS[t]}) | {load:g} | {cells} | "
              f"{row['ampd']['local_share']:.0%} |")
        for p in gains:
            if row[p]["attainment"] > 0:
                gains[p].append(row["ampd"]["attainment"] / row[p]["attainment"] - 1)
    print("\nampd's mean relative gain in attainment over each policy (cases where that "
          "policy attains > 0):")
    for p, values in gains.items():
        mean = sum(values) / len(values) if values else float("nan")
        print(f"  vs {p}: {mean:+.0%} over {len(values)} cases")
    if setup.axis == "sessions":
        against_paper({(m, t, load): {p: result(m, t, p, load, tuned[m, t, p])["attainment"]
                                      for p in POLICIES}
                       for m, t, load in itertools.product(MODELS, TRACE_GPUS, LOADS)})


def against_paper(attainment: dict[tuple[str, str, float], dict[str, float]]) -> None:
    """AMPD's gain over each baseline per cell, the paper's (Fig. 4's annotations) beside
    this run's, and how far apart they are: mean and median |ln((1 + paper) / (1 + here))|
    over the cells where both are defined."""
    print("\n## Against the paper's Fig. 4 (its annotated gains at the same requests/s)\n")
    print("| model | trace | sessions/s | " + " | ".join(
        f"vs {p}: paper / here" for p in PAPER_BASELINES) + " |")
    print("|---|---|---|" + "---|" * len(PAPER_BASELINES))
    distance: dict[str, list[float]] = {p: [] for p in PAPER_BASELINES}
    no_gain: dict[str, list[float]] = {p: [] for p in PAPER_BASELINES}  # the yardstick
    for (m, t), ticks in PAPER_FIG4_GAINS.items():
        for load, paper in zip(LOADS, ticks, strict=True):
            row = attainment[m, t, load]
            cells = []
            for p, paper_gain in zip(PAPER_BASELINES, paper, strict=True):
                here = row["ampd"] / row[p] - 1 if row[p] > 0 else None
                cells.append(f"{'-' if paper_gain is None else f'{paper_gain:+.0%}'} / "
                             f"{'-' if here is None else f'{here:+.0%}'}")
                if paper_gain is not None and here is not None:
                    distance[p].append(abs(math.log((1 + paper_gain) / (1 + here))))
                    no_gain[p].append(abs(math.log(1 + paper_gain)))
            print(f"| {m} | {t} | {load:g} | " + " | ".join(cells) + " |")
    print("\n|ln((1 + paper gain) / (1 + this run's))| per baseline (in brackets: a run "
          "with no gain anywhere, the yardstick):")
    for p, values in distance.items():
        print(f"  vs {p}: mean {statistics.fmean(values):.2f} "
              f"({statistics.fmean(no_gain[p]):.2f}), median {statistics.median(values):.2f} "
              f"({statistics.median(no_gain[p]):.2f}) over {len(values)} cells")


def planner_vs_exhaustive(pool: ProcessPoolExecutor, setup: Setup) -> None:
    rate = setup.rate_sps("qwen3-32b", "toolbench", 1.6)
    inputs = PlanInputs("qwen3-32b", "h20", 8, SLO(*SLOS["qwen3-32b", "toolbench"]),
                        setup.workload_name("toolbench"), setup.sessions, rate, seed=1,
                        backend=setup.backend)
    started = time.perf_counter()
    top = plan(inputs, jobs=setup.jobs, top=10, progress=False)
    planned_s = time.perf_counter() - started
    checked = verify(inputs, top, jobs=setup.jobs)
    verified_s = time.perf_counter() - started
    degrees = feasible_degrees(inputs)
    keys = [(pn, pk, dn, dk) for pn, dn in itertools.product(degrees, repeat=2)
            for pk in range(1, 8) for dk in range(1, 8) if pn * pk + dn * dk <= 8]
    deployments = [Deployment(pn, pk, dn, dk, 0.0, 0.0, 0.0) for pn, pk, dn, dk in keys]
    scores = list(pool.map(deployment_attainment, [(d, inputs) for d in deployments]))
    ranked = sorted(zip(scores, keys, strict=True), key=lambda x: -x[0])
    rank_of = {key: i + 1 for i, (_, key) in enumerate(ranked)}

    def key_of(d: Deployment) -> tuple[int, int, int, int]:
        return d.prefill_degree, d.prefill_replicas, d.decode_degree, d.decode_replicas
    print(f"\n## Planner vs exhaustive simulation (Qwen3-32B, ToolBench-like, 8 GPUs, "
          f"{rate:.2f} sessions/s, {len(keys)} deployments)\n")
    print(f"the ILP alone (Eq. 5, {planned_s:.1f} s):")
    for i, d in enumerate(top[:3], 1):
        print(f"  {i}. {d.describe()}  Z={d.z:.3g}  -> exhaustive rank {rank_of[key_of(d)]}, "
              f"attainment {scores[keys.index(key_of(d))]:.1%}")
    print(f"the ILP's 10 best checked by whole-cluster simulation (--verify 10, "
          f"{verified_s:.1f} s in all):")
    for i, (d, attainment) in enumerate(checked[:3], 1):
        print(f"  {i}. {d.describe()}  {attainment:.1%}  -> exhaustive rank "
              f"{rank_of[key_of(d)]}")
    print("exhaustive top 3 (ampd attainment):")
    for score, (pn, pk, dn, dk) in ranked[:3]:
        print(f"  {pk}P x TP{pn} + {dk}D x TP{dn}: {score:.1%}")


def sensitivity(pool: ProcessPoolExecutor, setup: Setup) -> None:
    """Fig. 6: w, alpha, beta one at a time (Llama-3.1-70B, DuReader-like, 16 GPUs)."""
    load = SENSITIVITY_LOAD[setup.axis]
    base = Case("llama-3.1-70b", "dureader", "ampd", load, setup.sessions, 8, setup)
    def with_ampd(**changes: float) -> Case:
        return replace(base, ampd=replace(base.ampd, **changes))

    variants = ([("w", w, with_ampd(window=w)) for w in (2, 3, 4, 5)]
                + [("alpha", a, with_ampd(alpha=a)) for a in (0.75, 0.8, 0.85, 0.9, 0.95, 1.0)]
                + [("beta", b, with_ampd(beta=b)) for b in (0.75, 0.8, 0.85, 0.9, 0.95)])
    results = list(pool.map(run_case, [case for _, _, case in variants]))
    print(f"\n## Sensitivity (Fig. 6; Llama-3.1-70B, DuReader-like, 16 GPUs as TP8, "
          f"{load_label(setup)} {load:g})\n")
    for (name, value, _), result in zip(variants, results, strict=True):
        print(f"  {name:5s} = {value:<5g}  attainment {result['attainment']:.1%}  "
              f"(local share {result['local_share']:.0%})")


def planner_time(setup: Setup) -> None:
    print(f"\n## Planner wall time ({setup.jobs} processes; the machine is shared, so noisy)\n")
    perf = perf_model("qwen3-32b", "h20", 2, setup.backend)
    for gpus in (8, 64, 256):
        # the load axis scales with the cluster; sessions/s scale as the paper's traces do
        # with their servers (8 GPUs at the axis' value)
        rate = (1.6 * base_rate_sps(perf, "toolbench", gpus // 2, setup.reading)
                if setup.axis == "load" else 1.6 * gpus / 8)
        inputs = PlanInputs("qwen3-32b", "h20", gpus, SLO(*SLOS["qwen3-32b", "toolbench"]),
                            setup.workload_name("toolbench"), setup.sessions, rate, seed=1,
                            backend=setup.backend)
        started = time.perf_counter()
        best = plan(inputs, jobs=setup.jobs, progress=False)[0]
        print(f"  {gpus:4d} GPUs: {time.perf_counter() - started:5.1f} s -> {best.describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=80, help="sessions per run [80]")
    parser.add_argument("--skip-planner", action="store_true")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="performance source: vllm, "
                        "sglang, trtllm (@version optional) or vidur [%(default)s]")
    parser.add_argument("--axis", choices=AXES, default="load", help="the loads are load "
                        "levels (x a base rate) or sessions per second, Fig. 4's axis "
                        "[%(default)s]")
    parser.add_argument("--reading", choices=TABLE1_READINGS, default="new", help="Table 1's "
                        "prefill length as new tokens per round or as the mean prompt per "
                        "round, history included [%(default)s]")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes [2]")
    parser.add_argument("--quick", action="store_true", help="4 sessions per run, no planner "
                        "(checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.skip_planner = 4, True
    setup = Setup(args.sessions, args.backend, args.axis, args.reading, args.jobs)
    started = time.perf_counter()
    for model, tp in MODELS.items():
        print(f"{model} on H20: priced by {perf_model(model, 'h20', tp, args.backend).name}")
    unit = "sessions per second" if args.axis == "sessions" else "L x a base rate"
    meaning = "mean prompt per round" if args.reading == "prompt" else "new tokens per round"
    print(f"axis: {args.axis} ({unit}); Table 1's prefill length read as {args.reading} "
          f"({meaning})")
    feasibility(setup, 40 if args.quick else 400)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        end_to_end(pool, setup)
        sensitivity(pool, setup)
        if not args.skip_planner:
            planner_vs_exhaustive(pool, setup)
    if not args.skip_planner:
        planner_time(setup)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
