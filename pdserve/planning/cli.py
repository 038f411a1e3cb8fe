"""`pdserve plan --policy NAME ...`: the planners, keyed by the policy they configure.

Each planner is a module of this package with a `run(args) -> int` entry; `PLANNERS` maps a
policy name to it. The options the planners share (workload, model, GPU, SLOs, how many
results) default to None here and each planner fills in its own defaults
(`PLANNER_DEFAULTS`), so one subcommand serves both without either's defaults leaking into
the other. `pdserve.cli` needs one call, `add_plan_parser`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdserve.planning import ampd, taichi

PLANNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "taichi": taichi.run,
    "ampd": ampd.run_plan,
}
PLANNER_DEFAULTS: dict[str, dict[str, Any]] = {
    "taichi": {"top": 5},  # the rest come from --config or the simulate defaults
    "ampd": ampd.DEFAULTS,
}


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
    shared.add_argument("--trace", help="shipped trace, trace file, 'synthetic', or a session "
                        "workload (ampd: sharegpt-sessions, mooncake-sessions, "
                        "agent:toolbench|gaia|hotpotqa|dureader) [ampd: agent:toolbench]")
    shared.add_argument("--synthetic-requests", type=int,
                        help="synthetic requests (ampd: sessions per replica) [ampd: 150]")
    shared.add_argument("--synthetic-rate", type=float, help="requests (ampd: sessions) per "
                        "second [ampd: 2]")
    shared.add_argument("--seed", type=int, help="workload seed [0]")
    shared.add_argument("--model", help="model [ampd: qwen3-32b]")
    shared.add_argument("--gpu", help="GPU [ampd: h20]")
    shared.add_argument("--ttft-slo", type=float, help="TTFT target, seconds [ampd: 0.35]")
    shared.add_argument("--tpot-slo", type=float, help="TPOT (ampd: ITL) target, seconds "
                        "[ampd: 0.04]")
    shared.add_argument("--top", type=int, help="results to print [taichi: 5, ampd: 3]")
    shared.add_argument("--processes", type=int, default=2,
                        help="simulations in parallel [2]")
    tc = p.add_argument_group("taichi")
    tc.add_argument("--config", type=Path, help="YAML file of simulate config fields (the "
                    "workload, model, SLOs); flags override it")
    tc.add_argument("--synthetic-lengths", help="e.g. table:sharegpt, table:arxiv-lengths")
    tc.add_argument("--max-requests", type=int, help="keep at most this many requests")
    tc.add_argument("--tp", type=int, help="tensor-parallel degree per instance")
    tc.add_argument("--instances", type=int, help="instances to place [4]")
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
