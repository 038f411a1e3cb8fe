"""`pdserve plan --policy NAME ...`: the planners, keyed by the policy they configure.

Each planner is a module of this package with a `run(args) -> int` entry; `PLANNERS` maps a
policy name to it. The workload, model, GPU and SLOs are config values (`pdserve.config`),
set by `--config FILE` and the options; each planner starts from its own base config
(`PLANNER_CONFIGS`: taichi from the simulate defaults, ampd from AMPD's setting), and the
planners' own options default per planner (`PLANNER_DEFAULTS`), so one subcommand serves
both without either's defaults leaking into the other. `pdserve.cli` needs one call,
`add_plan_parser`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pdserve.config import Config
from pdserve.config_flags import PERF_SOURCE_FLAGS, Flag, add_flags, shown_default
from pdserve.planning import ampd, taichi

PLANNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "taichi": taichi.run,
    "ampd": ampd.run_plan,
}
PLANNER_CONFIGS: dict[str, Callable[[], Config]] = {  # where each planner's config starts
    "taichi": taichi.plan_defaults,
    "ampd": ampd.plan_defaults,
}
PLANNER_DEFAULTS: dict[str, dict[str, Any]] = {  # the planners' own options
    "taichi": {"top": 5},
    "ampd": {"top": 3},
}

SHARED_FLAGS = (
    Flag("--trace", "workload.trace", "shipped trace, trace file, 'synthetic', or a session "
         "workload (ampd: sharegpt-sessions, mooncake-sessions, "
         "agent:toolbench|gaia|hotpotqa|dureader)"),
    Flag("--synthetic-requests", "workload.synthetic_requests",
         "synthetic requests (ampd: sessions per replica)"),
    Flag("--synthetic-rate", "workload.synthetic_rate_rps",
         "requests (ampd: sessions) per second"),
    Flag("--seed", "seed", "workload seed"),
    Flag("--model", "perf.model", "simulated model"),
    Flag("--gpu", "perf.gpu", "GPU"),
    Flag("--ttft-slo", "slo.ttft_s", "TTFT target, seconds"),
    Flag("--tpot-slo", "slo.tpot_s", "TPOT (ampd: ITL) target, seconds"),
)
TAICHI_FLAGS = (
    Flag("--synthetic-lengths", "workload.synthetic_lengths",
         "e.g. table:sharegpt, table:arxiv-lengths"),
    Flag("--max-requests", "workload.max_requests", "keep at most this many requests",
         shown="all", type=int),
    Flag("--tp", "perf.tp", "tensor-parallel degree per instance", shown="the setup's"),
)


def per_planner(flag: Flag) -> Flag:
    """`flag` with its help showing each planner's default."""
    return replace(flag, shown=", ".join(f"{name}: {shown_default(flag, base())}"
                                         for name, base in PLANNER_CONFIGS.items()))


def _run(args: argparse.Namespace) -> int:
    for name, value in PLANNER_DEFAULTS[args.policy].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return PLANNERS[args.policy](args)


def add_plan_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="search a policy's configuration or deployment by simulation",
        description="taichi: search its sliders R_PD, S_P, S_D by simulating the workload and "
        "print the best configurations with their goodput. ampd: the ILP of AMPD Eq. 5 over "
        "prefill/decode parallel degrees and replicas, latencies by simulation.")
    p.add_argument("--policy", required=True, choices=list(PLANNERS))
    shared = p.add_argument_group("shared (each planner has its own defaults)")
    add_flags(shared, [per_planner(flag) for flag in SHARED_FLAGS], Config())
    add_flags(shared, PERF_SOURCE_FLAGS, Config())  # the same default for both planners
    shared.add_argument("--config", type=Path, help="YAML file of the config tree (the "
                        "workload, model, SLOs); options override it")
    shared.add_argument("--top", type=int, help="results to print [taichi: 5, ampd: 3]")
    shared.add_argument("--processes", type=int, default=2,
                        help="simulations in parallel [2]")
    shared.add_argument("--out", type=Path, help="write summary.json (every candidate) and "
                        "report.html (their Pareto plot and table) here")
    tc = p.add_argument_group("taichi")
    add_flags(tc, TAICHI_FLAGS, Config())
    cluster = Config().cluster
    tc.add_argument("--instances", type=int, help=f"instances to place [--prefill + --decode "
                    f"of the config: {cluster.prefill + cluster.decode}]")
    tc.add_argument("--chunk-sizes", default="256,512,1024,2048",
                    help="S_P candidates, tokens, comma-separated [256,512,1024,2048]")
    tc.add_argument("--d-chunk-sizes", default="0,64,128,256,512",
                    help="S_D candidates (0: disaggregation) [0,64,128,256,512]")
    tc.add_argument("--time-limit", type=float, default=600.0,
                    help="seconds; configurations not done by then are skipped [600]")
    tc.add_argument("--no-progress", action="store_true", help="no progress bar")
    am = p.add_argument_group("ampd")
    am.add_argument("--gpus", type=int, help="GPUs to deploy on (required)")
    am.add_argument("--verify", type=int, default=0, metavar="K",
                    help="simulate the ILP's K best deployments as whole clusters under ampd "
                    "and rank them by SLO attainment (pdserve's addition) [0: off]")
    p.set_defaults(handler=_run)
