"""Reproduce ARES's evaluation (`../shared/papers/ares.md`, sec. 6) in the simulator.

Setup (sec. 6.1): DeepSeek-R1-Distill-Qwen-7B with W8A8 on RTX 4090D (the
`deepseek-r1-distill-qwen-7b-w8a8 @ rtx-4090d` preset, priced by `--backend`: by default the
presets' default, the newest vLLM measured on the L40S scaled to the 4090D, its fp8 GEMMs
standing for INT8 W8A8; the header names it), 1 prefill + 3 decode instances,
one GPU per node (instances talk over a 25 Gbps link, `tcp-25g`), Poisson arrivals of the
long-output workloads (`table:sharegpt-long`, `table:alpaca-long`; Table 2). SLOs are not
given in the paper; pdserve uses TTFT 10 s and TPOT 30 ms (about 1.6x the paper's 18.23 ms
step at 50 % KV). Goodput is SLO-meeting requests per second at the offered rate
(`Summary.goodput_rps`), as sec. 6.2 defines it.

  table 1  rates (ShareGPT 0.13-0.17 req/s as the paper, plus heavier rates where memory
           runs out), policies vllm, reschedule-current, ares with noisy / history / oracle
           predictors: goodput, throughput, P99 TPOT, preemptions, migrations
  table 2  sensitivity of ares (oracle and history) to theta, H and beta_t's decay
  table 3  Fig. 12: 8..256 decode instances (0.3 req/s per 8, as sec. 6.4), 25 Gbps, the
           variance across instances of the per-step execution time, sampled each second
           (the decode step time of each instance's batch from the perf model), averaged over
           the run; and the wall time of one rescheduling round at each size
  table 4  Fig. 13: the same variance on the 1P+3D setup, every policy and predictor
  table 5  predicted-length-aware dispatch (`policy.decode_router: predicted-load`, pdserve's
           option; the paper has no dispatch rule) against dispatch by current load, with
           and without ARES's rebalancer, at the paper's ShareGPT rates and past them

    python bench/ares_repro.py                 # all tables (~10 min on 2 shared cores)
    python bench/ares_repro.py --tables 1 --requests 300
    python bench/ares_repro.py --quick         # every table, tiny (20 requests, 8 decode
                                               # instances for 60 s): the test suite's run
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.cluster.actions import Action
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.config import Config
from pdserve.metrics.summary import Summary
from pdserve.perf.presets import DEFAULT_BACKEND, perf_model
from pdserve.policies.ares.rebalancer import AresRebalancer
from pdserve.policies.base import Rebalancer
from pdserve.policies.presets import build_policy
from pdserve.sim.records import SimResult
from pdserve.sim.runner import Experiment, build_topology, sim_settings
from pdserve.sim.simulator import Simulator

MODEL, GPU = "deepseek-r1-distill-qwen-7b-w8a8", "rtx-4090d"
POLICIES = [("vllm", "history"), ("reschedule-current", "history"),
            ("ares", "noisy:mae=2000"), ("ares", "history"), ("ares", "oracle")]


def base_config(backend: str, values: dict[str, object]) -> Config:
    """1P+3D W8A8 4090Ds priced by `backend`, one per node on 25 Gbps, with `values` (by
    dotted config path)."""
    return Config().with_values({
        "perf.backend": backend,
        "workload.trace": "synthetic", "workload.synthetic_lengths": "table:sharegpt-long",
        "cluster.prefill": 1, "cluster.decode": 3, "perf.model": MODEL, "perf.gpu": GPU,
        "cluster.inter_node_link": "tcp-25g", "cluster.instances_per_node": 1,
        "slo.ttft_s": 10.0, "slo.tpot_s": 0.03, **values})


@dataclass
class Row:
    label: str
    goodput_rps: float
    throughput_rps: float
    p99_tpot_ms: float
    preemptions: int
    migrations: int
    wall_s: float


def run(config: Config, label: str) -> Row:
    experiment = Experiment.from_config(config)
    started = time.perf_counter()
    result = experiment.simulate()
    summary = experiment.summarize(result)
    return Row(label, summary.goodput_rps, summary.throughput_rps,
               summary.tpot_s.p99 * 1e3, summary.preemptions, result.migrations,
               time.perf_counter() - started)


def print_rows(rows: list[Row]) -> None:
    width = max(34, *(len(r.label) for r in rows))
    print(f"  {'policy':{width}s} {'goodput':>8s} {'thruput':>8s} {'P99 TPOT':>9s} "
          f"{'preempt':>7s} {'migr':>5s}")
    for r in rows:
        print(f"  {r.label:{width}s} {r.goodput_rps:8.4f} {r.throughput_rps:8.4f} "
              f"{r.p99_tpot_ms:7.1f}ms {r.preemptions:7d} {r.migrations:5d}", flush=True)


def table_rates(backend: str, requests: int, seeds: int) -> None:
    print("table 1: 1P+3D, W8A8 4090D, 25 Gbps; goodput/throughput in req/s "
          f"({requests} requests, mean of {seeds} seeds)")
    cases = [("sharegpt-long", 0.13), ("sharegpt-long", 0.15), ("sharegpt-long", 0.17),
             ("sharegpt-long", 0.25), ("sharegpt-long", 0.35), ("alpaca-long", 0.25)]
    for trace, rate in cases:
        print(f" {trace} at {rate} req/s")
        rows = []
        for policy, predictor in POLICIES:
            per_seed = [run(base_config(backend, {
                "policy.name": policy, "policy.ares.forecast.predictor": predictor,
                "seed": seed, "workload.synthetic_requests": requests,
                "workload.synthetic_rate_rps": rate,
                "workload.synthetic_lengths": f"table:{trace}"}),
                policy if policy != "ares" else f"ares ({predictor})")
                for seed in range(seeds)]
            rows.append(Row(per_seed[0].label,
                            *(statistics.fmean(getattr(r, f) for r in per_seed)
                              for f in ("goodput_rps", "throughput_rps", "p99_tpot_ms")),
                            round(statistics.fmean(r.preemptions for r in per_seed)),
                            round(statistics.fmean(r.migrations for r in per_seed)),
                            sum(r.wall_s for r in per_seed)))
        print_rows(rows)


DISPATCH = [("vllm", "", "history"), ("vllm", "predicted-load", "history"),
            ("vllm", "predicted-load", "noisy:mae=3873"), ("vllm", "predicted-load", "oracle"),
            ("ares", "", "noisy:mae=3873"), ("ares", "predicted-load", "noisy:mae=3873")]


def table_dispatch(backend: str, requests: int, seeds: int) -> None:
    print("table 5: dispatch by predicted load vs by current load, ShareGPT long outputs "
          f"({requests} requests, mean of {seeds} seeds; per-seed preemptions in brackets)")
    for rate in (0.13, 0.17, 0.2, 0.25):
        print(f" sharegpt-long at {rate} req/s")
        rows = []
        for policy, router, predictor in DISPATCH:
            label = (f"{policy} + {'predicted' if router else 'current'}-load dispatch "
                     f"({predictor})")
            per_seed = [run(base_config(backend, {
                "policy.name": policy, "policy.decode_router": router,
                "policy.ares.forecast.predictor": predictor, "seed": seed,
                "workload.synthetic_requests": requests,
                "workload.synthetic_rate_rps": rate}), label) for seed in range(seeds)]
            rows.append(Row(label + f" [{' '.join(str(r.preemptions) for r in per_seed)}]",
                            *(statistics.fmean(getattr(r, f) for r in per_seed)
                              for f in ("goodput_rps", "throughput_rps", "p99_tpot_ms")),
                            round(statistics.fmean(r.preemptions for r in per_seed)),
                            round(statistics.fmean(r.migrations for r in per_seed)),
                            sum(r.wall_s for r in per_seed)))
        print_rows(rows)


def table_sensitivity(backend: str, requests: int) -> None:
    print(f"table 2: ares sensitivity at 0.25 req/s sharegpt-long ({requests} requests)")
    variants: list[tuple[str, dict[str, object]]] = [
        ("defaults (theta .1, H 2000, decay .8)", {}),
        ("theta 0.05", {"policy.ares.theta": 0.05}), ("theta 0.2", {"policy.ares.theta": 0.2}),
        ("theta 0.4", {"policy.ares.theta": 0.4}),
        ("H 500", {"policy.ares.forecast.horizon_steps": 500}),
        ("H 8000", {"policy.ares.forecast.horizon_steps": 8000}),
        ("decay 0.5", {"policy.ares.forecast.decay": 0.5}),
        ("decay 1.0 (flat)", {"policy.ares.forecast.decay": 1.0}),
        ("refresh k 100", {"policy.ares.forecast.refresh_every_tokens": 100}),
    ]
    for predictor in ("oracle", "history"):
        rows = [run(base_config(backend, {"policy.name": "ares",
                                          "policy.ares.forecast.predictor": predictor,
                                          "workload.synthetic_requests": requests,
                                          "workload.synthetic_rate_rps": 0.25, **values}),
                    f"{predictor}: {label}")
                for label, values in variants]
        print_rows(rows)


class StepTimeProbe:
    """Wraps a policy's rebalancer: on each tick records every busy decode instance's current
    step time (the perf model's decode step for its batch) before the rebalancer acts."""

    def __init__(self, inner: Rebalancer, step_s: Callable[[int, int], float],
                 warmup_s: float) -> None:
        self.inner, self.step_s, self.warmup_s = inner, step_s, warmup_s
        self.variances_ms2: list[float] = []
        self.on_decode = getattr(inner, "on_decode", None)

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        if view.now_s >= self.warmup_s:
            times = [self.step_s(view.instances[i].running_decodes,
                                 view.instances[i].running_tokens) * 1e3
                     for i in board.decode_candidates if view.instances[i].running_decodes]
            if len(times) > 1:
                self.variances_ms2.append(statistics.pvariance(times))
        return self.inner.on_tick(view, board)


def simulate_probed(config: Config, warmup_s: float
                    ) -> tuple[Summary, SimResult, StepTimeProbe, Rebalancer, float]:
    """One run with the step-time probe around the policy's rebalancer."""
    experiment = Experiment.from_config(config)
    policy, count = build_policy(experiment.policy_setup())
    inner = policy.rebalancer
    probe = StepTimeProbe(inner, experiment.perf.decode.step_s, warmup_s)
    policy.rebalancer = probe
    # KV transfers priced by block alignment, as this table has always been run (a run of
    # the config alone prices this preset's at a fixed call count)
    settings = sim_settings(config.with_values({"sim.transfer_mode": "aligned"}))
    started = time.perf_counter()
    result = Simulator(policy, count, experiment.perf, settings,
                       build_topology(config, experiment.perf, count)).run(
        experiment.workload.requests())
    wall = time.perf_counter() - started
    return experiment.summarize(result), result, probe, inner, wall


def table_balance(backend: str, sizes: list[int], duration_s: float, warmup_s: float
                  ) -> None:
    print(f"table 3 (Fig. 12): decode instances (and one prefill per 8), 0.3 req/s per 8, "
          f"25 Gbps, {duration_s:.0f} s of arrivals; variance across decode instances of the "
          f"per-step execution time (ms^2), sampled each second after {warmup_s:.0f} s, "
          f"mean; ARES (oracle) round wall time at the scheduler and reading the reports")
    print(f"  {'decode':>6s} {'policy':20s} {'var ms^2':>9s} {'migr':>5s} {'preempt':>7s} "
          f"{'P99 TPOT':>9s} {'round p50':>9s} {'round p99':>9s} {'reports p50':>11s} "
          f"{'sim wall':>8s}")
    for size in sizes:
        rate = 0.3 * size / 8
        for policy in ("vllm", "reschedule-current", "ares"):
            config = base_config(backend, {
                "policy.name": policy, "policy.ares.forecast.predictor": "oracle",
                "cluster.decode": size, "cluster.prefill": max(1, size // 8),
                "workload.synthetic_requests": max(50, int(rate * duration_s)),
                "workload.synthetic_rate_rps": rate})
            summary, result, probe, inner, wall = simulate_probed(config, warmup_s)
            var = statistics.fmean(probe.variances_ms2) if probe.variances_ms2 else 0.0
            rounds = ""
            if isinstance(inner, AresRebalancer) and inner.records:
                walls = sorted((r.wall_s - r.forecast_wall_s) * 1e3 for r in inner.records)
                reports = statistics.median(r.forecast_wall_s * 1e3 for r in inner.records)
                rounds = (f"{walls[len(walls) // 2]:7.2f}ms "
                          f"{walls[int(0.99 * (len(walls) - 1))]:7.2f}ms {reports:9.2f}ms")
            else:
                rounds = f"{'':9s} {'':9s} {'':11s}"
            print(f"  {size:6d} {policy:20s} {var:9.2f} {result.migrations:5d} "
                  f"{summary.preemptions:7d} {summary.tpot_s.p99 * 1e3:7.1f}ms {rounds} "
                  f"{wall:7.1f}s", flush=True)


def table_small_balance(backend: str, requests: int) -> None:
    print(f"table 4 (Fig. 13): 1P+3D, sharegpt-long, {requests} requests; mean variance across "
          f"the 3 decode instances of the per-step execution time (ms^2), sampled each second "
          f"after 300 s")
    print(f"  {'rate':>5s} {'policy':24s} {'var ms^2':>9s} {'migr':>5s} {'preempt':>7s} "
          f"{'P99 TPOT':>9s}")
    for rate in (0.17, 0.25):
        for policy, predictor in POLICIES:
            config = base_config(backend, {"policy.name": policy,
                                           "policy.ares.forecast.predictor": predictor,
                                           "workload.synthetic_requests": requests,
                                           "workload.synthetic_rate_rps": rate})
            summary, result, probe, _, _ = simulate_probed(config, 300.0)
            var = statistics.fmean(probe.variances_ms2) if probe.variances_ms2 else 0.0
            label = policy if policy != "ares" else f"ares ({predictor})"
            print(f"  {rate:5.2f} {label:24s} {var:9.2f} {result.migrations:5d} "
                  f"{summary.preemptions:7d} {summary.tpot_s.p99 * 1e3:7.1f}ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", default="1,2,3,4,5")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--sizes", default="8,16,32,64,128,256")
    parser.add_argument("--duration", type=float, default=1200.0,
                        help="seconds of arrivals in table 3")
    parser.add_argument("--warmup", type=float, default=300.0,
                        help="seconds before table 3 samples the variance")
    parser.add_argument("--backend", default=DEFAULT_BACKEND, help="performance source: vllm, "
                        "sglang, trtllm (@version optional) or vidur [%(default)s]")
    parser.add_argument("--quick", action="store_true", help="every table, tiny: 20 requests, "
                        "1 seed, 8 decode instances for 60 s (checks the script runs)")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.seeds, args.sizes = 20, 1, "8"
        args.duration, args.warmup = 60.0, 10.0
    tables = set(args.tables.split(","))
    perf = perf_model(MODEL, GPU, 1, args.backend)
    print(f"priced by {perf.name}: KV {perf.kv_capacity_tokens:,} tokens per instance",
          flush=True)
    if "1" in tables:
        table_rates(args.backend, args.requests, args.seeds)
    if "2" in tables:
        table_sensitivity(args.backend, args.requests)
    if "3" in tables:
        table_balance(args.backend, [int(s) for s in args.sizes.split(",")], args.duration,
                      args.warmup)
    if "4" in tables:
        table_small_balance(args.backend, args.requests)
    if "5" in tables:
        table_dispatch(args.backend, args.requests, args.seeds)


if __name__ == "__main__":
    main()
