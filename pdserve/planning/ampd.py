"""`pdserve plan --policy ampd`: AMPD's offline deployment planner (sec. 5, Appendix A).

1. For each phase, parallel degree n in {1, 2, 4, 8} (those the model fits and divides) and
   replica count k, simulate one replica of degree n carrying 1/k of the session load
   (sessions start at rate/k, over at least STEADY_S seconds up to MAX_SESSION_FACTOR times
   the configured count: `ampd_inputs.replica_workload`) and take its p95 latency over the
   SLO: TTFT for a prefill replica, per-request mean ITL for a decode replica (Appendix A.1:
   the simulator models phase splitting and KV transmission with the alpha-beta model). The
   other phase is an idealised instance (a thousandth of the time, unbounded memory), so the
   figure is the replica's own. Replica counts are simulated on a grid (1, 2, 3, 4, 6, 8,
   then doubling steps, and the largest) and interpolated linearly in the load 1/k in
   between; the ILP sees every count up to 64 replicas of a degree and the planner's split
   grid beyond (`splits.split_counts`: every count to 4,095 made the ILP run for minutes
   in 5.5 GB on 4,096 GPUs; the paper plans 8-32 GPUs).
2. Solve the ILP of Eq. 5 (`ampd_ilp.solve`) for the top three deployments.
Simulations run in `--jobs` processes (2 by default), with a progress line per result.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from pdserve.cluster.topology import Topology
from pdserve.config import Config
from pdserve.config_flags import config_from_args
from pdserve.perf.fitted import PerfModel
from pdserve.perf.specs import check_tp, model_spec
from pdserve.planning.ampd_ilp import INFEASIBLE, Deployment, solve
from pdserve.planning.ampd_inputs import PlanInputs, replica_sim_settings, replica_workload
from pdserve.planning.ampd_verify import verify
from pdserve.planning.splits import split_counts
from pdserve.policies.ampd.preset import build_ampd_policy
from pdserve.sim.simulator import Simulator
from pdserve.types import Request

DEGREES = (1, 2, 4, 8)


def replica_grid(max_count: int) -> list[int]:
    counts, k = [], 1
    while k <= max_count:
        counts.append(k)
        k = k + 1 if k < 4 else k + 2 if k < 8 else k * 2
    if counts[-1] != max_count:
        counts.append(max_count)
    return counts


def feasible_degrees(inputs: PlanInputs) -> list[int]:
    spec, degrees = model_spec(inputs.model), []
    for degree in DEGREES:
        if degree >= inputs.gpus:
            continue
        try:
            check_tp(spec, degree)
            inputs.perf(degree)
        except ValueError:
            continue  # does not divide the heads, or the weights do not fit
        degrees.append(degree)
    return degrees


def idealised(perf: PerfModel) -> PerfModel:
    """The other phase, out of the way: a thousandth of the time, memory without bound."""
    prefill = replace(perf.prefill, intercept_s=perf.prefill.intercept_s * 1e-3,
                      per_token_s=perf.prefill.per_token_s * 1e-3,
                      per_attn_unit_s=perf.prefill.per_attn_unit_s * 1e-3,
                      per_token_above_knee_s=perf.prefill.per_token_above_knee_s * 1e-3)
    decode = replace(perf.decode, intercept_s=perf.decode.intercept_s * 1e-3,
                     per_seq_s=perf.decode.per_seq_s * 1e-3,
                     per_context_token_s=perf.decode.per_context_token_s * 1e-3,
                     batch1_extra_s=perf.decode.batch1_extra_s * 1e-3,
                     per_seq_above_knee_s=perf.decode.per_seq_above_knee_s * 1e-3,
                     per_seq_squared_s=perf.decode.per_seq_squared_s * 1e-3)
    return replace(perf, name=f"{perf.name} (idealised)", prefill=prefill, decode=decode,
                   kv_capacity_tokens=1 << 30)


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95)) if values else INFEASIBLE


def replica_tau(phase: str, degree: int, replicas: int, inputs: PlanInputs) -> float:
    """Normalised p95 latency of one replica of `phase` at `degree` with 1/replicas load."""
    real = inputs.perf(degree)
    ideal = idealised(real)
    perfs = [real, ideal] if phase == "prefill" else [ideal, real]
    policy, _ = build_ampd_policy("dynamo", inputs.slo, 1, 1, perfs, inputs.ampd)
    requests = replica_workload(inputs, replicas).requests()
    sim = Simulator(policy, 2, perfs, replica_sim_settings(),
                    Topology.for_perf_models(perfs, 8))
    done: list[Request] = [r for r in sim.run(requests).requests if r.finished]
    if len(done) < len(requests):
        return INFEASIBLE  # rejected: the replica cannot hold the sessions
    if phase == "prefill":
        return p95([r.first_token_s - r.arrival_s for r in done]) / inputs.slo.ttft_s
    itl = [(r.finish_s - r.first_token_s) / (r.generated_tokens - 1)
           for r in done if r.generated_tokens > 1]
    return p95(itl) / inputs.slo.tpot_s


def _job(args: tuple[str, int, int, PlanInputs]) -> tuple[str, int, int, float]:
    phase, degree, replicas, inputs = args
    return phase, degree, replicas, replica_tau(phase, degree, replicas, inputs)


def interpolate(samples: dict[int, float], counts: Sequence[int]) -> dict[int, float]:
    """tau at every replica count, linear in the load 1/k between simulated counts."""
    known = sorted(samples)
    loads = [1 / k for k in reversed(known)]
    values = [samples[k] for k in reversed(known)]
    return {k: float(np.interp(1 / k, loads, values)) for k in counts}


def tau_tables(inputs: PlanInputs, jobs: int = 2, progress: bool = True
               ) -> tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]]:
    degrees = feasible_degrees(inputs)
    if not degrees:
        raise ValueError(f"{inputs.model} fits no parallel degree in {DEGREES} on "
                         f"{inputs.gpus - 1} {inputs.gpu} GPUs")
    tasks = [(phase, degree, k, inputs) for phase in ("prefill", "decode") for degree in degrees
             for k in replica_grid((inputs.gpus - 1) // degree)]
    tasks.sort(key=lambda task: task[2])  # the busiest replicas (fewest) are the slowest: first
    samples: dict[tuple[str, int], dict[int, float]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for index, (phase, degree, k, tau) in enumerate(pool.map(_job, tasks), 1):
            samples.setdefault((phase, degree), {})[k] = tau
            if progress:
                print(f"  [{index}/{len(tasks)}] {phase} TP{degree} x{k}: p95/SLO "
                      f"{tau:.3g}", file=sys.stderr, flush=True)
    tables: tuple[dict[tuple[int, int], float], dict[tuple[int, int], float]] = ({}, {})
    for (phase, degree), by_count in samples.items():
        table = tables[0] if phase == "prefill" else tables[1]
        counts = split_counts((inputs.gpus - 1) // degree + 1)  # all to 64, a grid beyond
        for k, tau in interpolate(by_count, counts).items():
            table[degree, k] = tau
    return tables


def plan(inputs: PlanInputs, jobs: int = 2, top: int = 3,
         progress: bool = True) -> list[Deployment]:
    tau_prefill, tau_decode = tau_tables(inputs, jobs, progress)
    return solve(tau_prefill, tau_decode, inputs.gpus, top)


# `pdserve plan --policy ampd` starts from these config values (an agent workload on
# Qwen3-32B over H20s, as AMPD's evaluation), not the simulate defaults; `--config FILE` and
# the options override them
CONFIG_DEFAULTS: dict[str, Any] = {
    "workload.trace": "agent:toolbench", "workload.synthetic_requests": 150,
    "workload.synthetic_rate_rps": 2.0, "perf.model": "qwen3-32b", "perf.gpu": "h20",
    "slo.ttft_s": 0.35, "slo.tpot_s": 0.04}


def plan_defaults() -> Config:
    return Config().with_values(CONFIG_DEFAULTS)


def plan_inputs(config: Config, gpus: int) -> PlanInputs:
    workload = config.workload
    return PlanInputs(config.perf.model, config.perf.gpu, gpus, config.slo.targets(),
                      workload.trace, workload.synthetic_requests, workload.synthetic_rate_rps,
                      config.seed, config.policy.ampd, config.perf.backend or None,
                      config.perf.host_overhead)


def run_plan(args: argparse.Namespace) -> int:
    if args.gpus is None:
        raise ValueError("pdserve plan --policy ampd needs --gpus (the GPUs to deploy on)")
    if args.gpus < 2:
        raise ValueError(f"--gpus must be at least 2 (one per phase), got {args.gpus}")
    inputs = plan_inputs(config_from_args(args, plan_defaults()), args.gpus)
    started = time.perf_counter()
    print(f"planning {inputs.model} on {inputs.gpus} {inputs.gpu} GPUs for {inputs.workload} "
          f"at {inputs.rate_sps:g} sessions/s (TTFT SLO {inputs.slo.ttft_s:g}s, ITL SLO "
          f"{inputs.slo.tpot_s:g}s)", flush=True)
    degrees = feasible_degrees(inputs)
    if degrees:
        print(f"priced by {inputs.perf(degrees[0]).name}", flush=True)
    deployments = plan(inputs, args.jobs, max(args.top, args.verify))
    print(f"top {min(args.top, len(deployments))} deployments by the ILP (Z = worse phase's "
          f"p95 latency / its SLO), {time.perf_counter() - started:.1f}s:")
    for rank, deployment in enumerate(deployments[:args.top], 1):
        print(f"  {rank}. {deployment.describe()}  Z={deployment.z:.3g} (prefill "
              f"{deployment.tau_prefill:.3g}, decode {deployment.tau_decode:.3g})")
    if deployments and deployments[0].z > 1:
        print(f"warning: no deployment meets both SLOs: the best one's worse phase has a p95 "
              f"latency {deployments[0].z:.3g}x its SLO (Z > 1)")
    if args.verify > 0:
        checked = verify(inputs, deployments[:args.verify], args.jobs)
        print(f"the ILP's {len(checked)} best, simulated as whole clusters under ampd, "
              f"{time.perf_counter() - started:.1f}s:")
        for rank, (deployment, attainment) in enumerate(checked[:args.top], 1):
            print(f"  {rank}. {deployment.describe()}  SLO attainment {attainment:.1%}")
    if args.out:
        write_outputs(args.out, inputs, deployments, dict(checked) if args.verify > 0 else {})
    return 0


def write_outputs(out: Path, inputs: PlanInputs, deployments: Sequence[Deployment],
                  attained: dict[Deployment, float]) -> None:
    """summary.json (the ILP's deployments, with their simulated attainment when verified)
    and report.html: each deployment's two phases' normalised p95 latency, their Pareto
    front (the ILP minimises the worse of the two), the table."""
    from pdserve.metrics.report_page import write_plan
    from pdserve.metrics.views import pareto_figure, table

    labels = [d.describe() for d in deployments]
    document = {"planner": "ampd", "inputs": {
        "model": inputs.model, "gpu": inputs.gpu, "gpus": inputs.gpus,
        "workload": inputs.workload, "rate_sps": inputs.rate_sps,
        "ttft_slo_s": inputs.slo.ttft_s, "itl_slo_s": inputs.slo.tpot_s},
        "deployments": [{**asdict(d), "gpus_used": d.gpus, "describe": d.describe(),
                         **({"slo_attainment": attained[d]} if d in attained else {})}
                        for d in deployments]}
    written = write_plan(out, "pdserve plan: AMPD deployments",
               f"{inputs.model} on {inputs.gpus} {inputs.gpu} GPUs, {inputs.workload} at "
               f"{inputs.rate_sps:g} sessions/s",
               document, [("pareto", pareto_figure(
                   "deployments: each phase's p95 latency / its SLO (lower is better; "
                   "colour: Z)", labels, [d.tau_prefill for d in deployments],
                   [d.tau_decode for d in deployments], "prefill p95 / TTFT SLO",
                   "decode p95 / ITL SLO", [d.z for d in deployments], "Z"))],
               table("the ILP's deployments, best Z first", [
                   "rank", "deployment", "GPUs", "Z", "prefill tau", "decode tau",
                   "simulated attainment"], [
                   [rank, d.describe(), d.gpus, d.z, d.tau_prefill, d.tau_decode,
                    attained.get(d, float("nan"))] for rank, d in enumerate(deployments, 1)]),
               [("deployments", str(len(deployments)))])
    print(f"wrote {out}/: {', '.join(written)}")
