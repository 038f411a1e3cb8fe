"""`pdserve plan`: one subcommand, one planner per policy (`PLANNERS`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from pdserve.planning import ampd

PLANNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "ampd": ampd.run_plan,
}


def add_plan_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="propose a deployment (parallel degrees and replicas) for a policy",
        description="Search deployments for a policy's planner. ampd: the ILP of AMPD "
                    "Eq. 5 over prefill/decode parallel degrees, latencies by simulation.")
    p.add_argument("--policy", required=True, choices=list(PLANNERS))
    ampd.add_arguments(p)
    p.set_defaults(handler=lambda args: PLANNERS[args.policy](args))
