"""Reproduce AMPD's experiments (sec. 7, Fig. 4-5, Appendix A.2-A.3) in the simulator.

Setup (sec. 7.1): H20 GPUs, NVLink inside an 8-GPU server, 200 Gb/s InfiniBand per GPU
between servers; Qwen3-32B (TP2 instances) and Llama-3.1-70B (TP4); ToolBench-like and
HotpotQA-like sessions on one server, DuReader-like on two, GAIA-like on four
(`agent:<kind>` workloads, Table 1); Poisson session arrivals; the paper's SLOs per model and
trace (Fig. 4 titles). Policies: ampd, ampd w/o PR (no reordering), dynamo (always remote:
AMPD w/o AR+PR, the Dynamo baseline), colocated (vLLM-like) and continuum (colocated with
session affinity and continuing rounds first, a vLLM-Continuum stand-in). Disaggregated
policies split the instances half and half.

Load: the paper's x-axis is a load level without a unit; here load L starts L * base
sessions per second, where base puts 30 % of the cluster's prefill capacity (2048-token
chunks, no history) under the trace's per-session prefill tokens.

Also: the share of local and remote prefills under ampd; the planner's top three against
the best deployments found by simulating every deployment (Qwen3-32B, ToolBench, 8 GPUs);
and the planner's wall time at 8, 64 and 256 GPUs (noisy on a shared machine).

Every H20 is priced by `--backend` (default: the presets' default, the newest vLLM measured
for the H100's tables, scaled to the H20 per bound); the header names it.

    python bench/ampd_repro.py            # a few minutes on 2 cores
    python bench/ampd_repro.py --quick    # 4 sessions per run (GAIA 2), no planner: the test
                                          # suite's run
"""

from __future__ import annotations

import argparse
import itertools
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
from pdserve.workload.sessions import AGENT_PROFILES, session_workload

MODELS = {"qwen3-32b": 2, "llama-3.1-70b": 4}  # default tensor parallelism (the load's base)
TP_CHOICES = {"qwen3-32b": (2, 4, 8), "llama-3.1-70b": (4, 8)}
TRACE_GPUS = {"toolbench": 8, "hotpotqa": 8, "dureader": 16, "gaia": 32}
SLOS = {  # AMPD Fig. 4: (TTFT, ITL) in seconds
    ("qwen3-32b", "toolbench"): (0.35, 0.040), ("qwen3-32b", "gaia"): (1.0, 0.035),
    ("qwen3-32b", "hotpotqa"): (0.45, 0.030), ("qwen3-32b", "dureader"): (1.2, 0.040),
    ("llama-3.1-70b", "toolbench"): (1.0, 0.050), ("llama-3.1-70b", "gaia"): (1.5, 0.035),
    ("llama-3.1-70b", "hotpotqa"): (2.5, 0.045), ("llama-3.1-70b", "dureader"): (5.0, 0.050),
}
POLICIES = ("ampd", "ampd-no-reorder", "dynamo", "colocated", "continuum")
LOADS = (0.8, 1.6, 2.4)
BASE_UTILISATION = 0.3


@dataclass(frozen=True)
class Case:
    model: str
    trace: str
    policy: str
    load: float
    sessions: int
    tp: int
    backend: str  # the performance source (`perf.backend`)
    ampd: AmpdSettings = AmpdSettings()  # alpha, beta, window (the paper's by default)


def topology(perfs: list[PerfModel], tp: int) -> Topology:
    inter = network_link("rdma-200g").aggregated(tp)
    return Topology.build([gpu_link(p) for p in perfs], GPUS_PER_NODE // tp, inter)


def base_rate_sps(perf: PerfModel, trace: str, instances: int) -> float:
    chunk = 2048
    per_instance = chunk / perf.prefill.time_s(chunk, attn_units(chunk, 0))
    profile = AGENT_PROFILES[trace]
    per_session = profile.mean_rounds * profile.prefill_tokens
    return BASE_UTILISATION * instances * per_instance / per_session


def run_case(case: Case) -> dict[str, float]:
    tp = case.tp
    perf = perf_model(case.model, "h20", tp, case.backend)
    instances = TRACE_GPUS[case.trace] // tp
    slo = SLO(*SLOS[case.model, case.trace])
    default_tp = MODELS[case.model]
    rate = case.load * base_rate_sps(perf_model(case.model, "h20", default_tp, case.backend),
                                     case.trace, TRACE_GPUS[case.trace] // default_tp)
    workload = session_workload(f"agent:{case.trace}", case.sessions, rate, seed=1)
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


def end_to_end(pool: ProcessPoolExecutor, sessions: int, backend: str) -> None:
    cases = [Case(m, t, p, load, sessions if t != "gaia" else sessions // 2, tp, backend)
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
    print("| model | trace (GPUs) | load | " + " | ".join(POLICIES) + " | ampd local share |")
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


def planner_vs_exhaustive(pool: ProcessPoolExecutor, sessions: int, backend: str) -> None:
    rate = 1.6 * base_rate_sps(perf_model("qwen3-32b", "h20", 2, backend), "toolbench", 4)
    inputs = PlanInputs("qwen3-32b", "h20", 8, SLO(*SLOS["qwen3-32b", "toolbench"]),
                        "agent:toolbench", sessions, rate, seed=1, backend=backend)
    started = time.perf_counter()
    top = plan(inputs, jobs=2, top=10, progress=False)
    planned_s = time.perf_counter() - started
    checked = verify(inputs, top, jobs=2)
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


def sensitivity(pool: ProcessPoolExecutor, sessions: int, backend: str) -> None:
    """Fig. 6: w, alpha, beta one at a time (Llama-3.1-70B, DuReader-like, 16 GPUs)."""
    base = Case("llama-3.1-70b", "dureader", "ampd", 1.6, sessions, 8, backend)
    def with_ampd(**changes: float) -> Case:
        return replace(base, ampd=replace(base.ampd, **changes))

    variants = ([("w", w, with_ampd(window=w)) for w in (2, 3, 4, 5)]
                + [("alpha", a, with_ampd(alpha=a)) for a in (0.75, 0.8, 0.85, 0.9, 0.95, 1.0)]
                + [("beta", b, with_ampd(beta=b)) for b in (0.75, 0.8, 0.85, 0.9, 0.95)])
    results = list(pool.map(run_case, [case for _, _, case in variants]))
    print("\n## Sensitivity (Fig. 6; Llama-3.1-70B, DuReader-like, 16 GPUs as TP8, load 1.6)\n")
    for (name, value, _), result in zip(variants, results, strict=True):
        print(f"  {name:5s} = {value:<5g}  attainment {result['attainment']:.1%}  "
              f"(local share {result['local_share']:.0%})")


def planner_time(sessions: int, backend: str) -> None:
    print("\n## Planner wall time (2 processes; the machine is shared, so noisy)\n")
    perf = perf_model("qwen3-32b", "h20", 2, backend)
    for gpus in (8, 64, 256):
        rate = 1.6 * base_rate_sps(perf, "toolbench", gpus // 2)
        inputs = PlanInputs("qwen3-32b", "h20", gpus, SLO(*SLOS["qwen3-32b", "toolbench"]),
                            "agent:toolbench", sessions, rate, seed=1, backend=backend)
        started = time.perf_counter()
        best = plan(inputs, jobs=2, progress=False)[0]
        print(f"  {gpus:4d} GPUs: {time.perf_counter() - started:5.1f} s -> {best.describe()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=80, help="sessions per run [80]")
    parser.add_argument("--skip-planner", action="store_true")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="performance source: vllm, "
                        "sglang, trtllm (@version optional) or vidur [%(default)s]")
    parser.add_argument("--quick", action="store_true", help="4 sessions per run, no planner "
                        "(checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.skip_planner = 4, True
    started = time.perf_counter()
    for model, tp in MODELS.items():
        print(f"{model} on H20: priced by {perf_model(model, 'h20', tp, args.backend).name}")
    with ProcessPoolExecutor(max_workers=2) as pool:
        end_to_end(pool, args.sessions, args.backend)
        sensitivity(pool, args.sessions, args.backend)
        if not args.skip_planner:
            planner_vs_exhaustive(pool, args.sessions, args.backend)
    if not args.skip_planner:
        planner_time(args.sessions, args.backend)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
