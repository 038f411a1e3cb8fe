"""`pdserve plan --policy NAME ...`: the planners, keyed by the policy they configure.

Each planner is a module of this package with a `run(args) -> int` entry; `PLANNERS` maps a
policy name to it, and `add_plan_parser` adds the subcommand with the options they share
(workload, model, SLOs, search bounds) so `pdserve.cli` needs one call.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from pdserve.planning import taichi

PLANNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "taichi": taichi.run,
}


def add_plan_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="search a policy's configuration by simulation",
        description="Search a policy's configuration (taichi: its sliders R_PD, S_P, S_D) "
        "by simulating the workload and print the best configurations with their goodput.")
    p.add_argument("--policy", required=True, choices=list(PLANNERS))
    p.add_argument("--config", type=Path, help="YAML file of simulate config fields (the "
                   "workload, model, SLOs); flags override it")
    p.add_argument("--trace", help="shipped trace, trace file, or 'synthetic'")
    p.add_argument("--synthetic-lengths", help="e.g. table:sharegpt, table:arxiv-lengths")
    p.add_argument("--synthetic-requests", type=int, help="synthetic: number of requests")
    p.add_argument("--synthetic-rate", type=float, help="synthetic: requests per second")
    p.add_argument("--max-requests", type=int, help="keep at most this many requests")
    p.add_argument("--seed", type=int, help="workload seed")
    p.add_argument("--model", help="model (e.g. qwen2.5-14b)")
    p.add_argument("--gpu", help="GPU (e.g. a100)")
    p.add_argument("--tp", type=int, help="tensor-parallel degree per instance")
    p.add_argument("--instances", type=int, help="instances to place [4]")
    p.add_argument("--ttft-slo", type=float, help="TTFT target, seconds")
    p.add_argument("--tpot-slo", type=float, help="TPOT target, seconds")
    p.add_argument("--chunk-sizes", default="256,512,1024,2048",
                   help="S_P candidates, tokens, comma-separated [256,512,1024,2048]")
    p.add_argument("--d-chunk-sizes", default="0,64,128,256,512",
                   help="S_D candidates (0: disaggregation) [0,64,128,256,512]")
    p.add_argument("--processes", type=int, default=2, help="simulations in parallel [2]")
    p.add_argument("--time-limit", type=float, default=600.0,
                   help="seconds; configurations not done by then are skipped [600]")
    p.add_argument("--top", type=int, default=5, help="configurations to print [5]")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(handler=lambda args: PLANNERS[args.policy](args))
