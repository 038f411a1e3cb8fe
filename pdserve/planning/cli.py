"""`pdserve plan --policy NAME ...`: the planners, keyed by the policy they configure.

Each planner is a module of this package with a `run(args) -> int` entry; `PLANNERS` maps a
policy name to it: `all` (the default) and every search space by name go to the
multi-fidelity planner over every preset (`planner.py`); `taichi` and `ampd` keep their
papers' own planners (the slider grid, the ILP over simulated replicas). The workload,
model, GPU and SLOs are config values (`pdserve.config`), set by `--config FILE` and the
options; each planner starts from its own base config (`PLANNER_CONFIGS`: taichi and all
from the simulate defaults, ampd from AMPD's setting), and the planners' own options default
per planner (`PLANNER_DEFAULTS`), so one subcommand serves them all without one's defaults
leaking into another's. `pdserve.cli` needs one call, `add_plan_parser`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from pdserve.config import MAX_INSTANCES, Config
from pdserve.config_flags import (
    PERF_SOURCE_FLAGS,
    Flag,
    add_flags,
    at_least,
    positive_seconds,
    shown_default,
)
from pdserve.planning import ampd, planner, taichi
from pdserve.policies.search_spaces import SEARCH_SPACES, spaces_for

PLANNERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "taichi": taichi.run,
    "ampd": ampd.run_plan,
    "all": planner.run,
}
# any other search space (or a preset with the same composition) by name: planner.run
MAX_JOBS = 1024  # processes: more would only fork the machine into the ground
SPACE_NAMES = [name for space in SEARCH_SPACES.values() for name in (space.name, *space.same_as)
               if name not in PLANNERS]
PLANNER_CONFIGS: dict[str, Callable[[], Config]] = {  # where each planner's config starts
    "taichi": taichi.plan_defaults,
    "ampd": ampd.plan_defaults,
    "all": planner.plan_defaults,
}
PLANNER_DEFAULTS: dict[str, dict[str, Any]] = {  # the planners' own options
    "taichi": {"top": 5, "time_limit": 600.0, "jobs": 2, "verify": 0},
    "ampd": {"top": 3, "time_limit": 600.0, "jobs": 2, "verify": 0},
    # about a minute and a half on 2 cores, all of them (jobs None: os.cpu_count())
    "all": {"top": 5, "time_limit": 85.0, "jobs": None, "verify": 2},
}
# options a planner does not read: given, they are an error, not silently ignored (TaiChi's
# planner placed 8 instances under --gpus 4 and wrote no --json)
NOT_READ: dict[str, tuple[str, ...]] = {
    "taichi": ("gpus", "json", "verify"),  # it places --instances of the config's degree
    "ampd": ("json", "instances", "time_limit"),
    "all": ("instances", "top"),  # the table has a row per policy
}

SHARED_FLAGS = (
    Flag("--trace", "workload.trace", "shipped trace, trace file, 'synthetic', or a session "
         "workload (ampd: sharegpt-sessions, mooncake-sessions, "
         "agent:toolbench|gaia|hotpotqa|dureader[:new|prompt])"),
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
TAICHI_AND_ALL_FLAGS = (  # taichi and all read them; ampd sets its own
    Flag("--synthetic-lengths", "workload.synthetic_lengths",
         "e.g. table:sharegpt, table:arxiv-lengths"),
    Flag("--max-requests", "workload.max_requests", "keep at most this many requests",
         shown="all", type=int),
    Flag("--tp", "perf.tp", "tensor-parallel degree per instance", shown="the setup's"),
    Flag("--max-batch-size", "instance.max_batch_size", "sequences an instance batches (all: "
         "the search also tries 512 where this limit binds)"),
    Flag("--slo-counts-decode-queue", "slo.counts_decode_queue", "attainment on TaiChi's "
         "definitions: TTFT until the decode instance's first token (the wait for a decode "
         "slot counts), TPOT over its gaps", switch=True),
)


def per_planner(flag: Flag) -> Flag:
    """`flag` with its help showing each planner's default."""
    return replace(flag, shown=", ".join(f"{name}: {shown_default(flag, base())}"
                                         for name, base in PLANNER_CONFIGS.items()))


def _run(args: argparse.Namespace) -> int:
    planner_name = args.policy if args.policy in PLANNERS else "all"
    if planner_name == "all":
        spaces_for(args.policy, sessions=True)  # an unknown name is an error now
    given = [name for name in NOT_READ[planner_name] if getattr(args, name) is not None]
    if given:
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags}: not used by pdserve plan --policy {args.policy} "
                         f"(see pdserve plan --help for which planner reads what)")
    for name, value in PLANNER_DEFAULTS[planner_name].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return PLANNERS[planner_name](args)


def add_plan_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan", help="search policies, deployments and knobs by screen and simulation",
        description="all (default): every preset and composition across papers, each "
        "deployment (tensor-parallel degree, split, chunk size) and knob: an analytic screen, "
        "short simulations of each policy's best, long multi-seed confirmations of the few "
        "best; the table per policy, the winner, a Pareto plot and the winner's config. A "
        "search space's name searches that one alone. taichi: search its sliders R_PD, S_P, S_D by "
        "simulating the workload. ampd: the ILP of AMPD Eq. 5 over prefill/decode parallel "
        "degrees and replicas, latencies by simulation.")
    p.add_argument("--policy", default="all", metavar="POLICY",
                   help=f"all, taichi, ampd, or search spaces, comma-separated "
                   f"({', '.join(SPACE_NAMES)}) [all]")
    shared = p.add_argument_group("shared (each planner has its own defaults)")
    add_flags(shared, [per_planner(flag) for flag in SHARED_FLAGS], Config())
    add_flags(shared, PERF_SOURCE_FLAGS, Config())  # the same default for both planners
    shared.add_argument("--config", type=Path, help="YAML file of the config tree (the "
                        "workload, model, SLOs); options override it")
    shared.add_argument("--gpus", type=at_least(1, MAX_INSTANCES), help="GPUs to deploy on "
                        f"(ampd: required) [all: {planner.DEFAULT_GPUS}]")
    shared.add_argument("--top", type=at_least(1), help="results to print [taichi: 5, ampd: 3]")
    shared.add_argument("--out", type=Path, help="taichi, ampd: write summary.json (every "
                        "candidate) and report.html (their Pareto plot and table) here; all: "
                        "winner.yaml (for simulate/serve --config), pareto.png, pareto.json, "
                        "summary.json (the --json record) and report.html")
    shared.add_argument("--jobs", "--processes", dest="jobs", type=at_least(1, MAX_JOBS),
                        help="simulations in parallel [taichi, ampd: 2; all: the CPUs]")
    shared.add_argument("--time-limit", type=positive_seconds, help="seconds; what is not "
                        "done by then is skipped (taichi: the search; all: the whole command) "
                        "[taichi: 600, all: 85]")
    shared.add_argument("--verify", type=at_least(0), metavar="K", help="all: confirm the K "
                        "policies with the best short runs by long multi-seed runs; ampd: "
                        "simulate the ILP's K best deployments as whole clusters under ampd "
                        "and rank them by SLO attainment (pdserve's addition) [all: 2, ampd: 0]")
    shared.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_flags(p.add_argument_group("taichi, all"), TAICHI_AND_ALL_FLAGS, Config())
    tc = p.add_argument_group("taichi")
    cluster = Config().cluster
    tc.add_argument("--instances", type=at_least(2, MAX_INSTANCES), help=f"instances to "
                    f"place [--prefill + --decode of the config: "
                    f"{cluster.prefill + cluster.decode}]")
    tc.add_argument("--chunk-sizes", default="256,512,1024,2048",
                    help="S_P candidates, tokens, comma-separated [256,512,1024,2048]")
    tc.add_argument("--d-chunk-sizes", default="0,64,128,256,512",
                    help="S_D candidates (0: disaggregation) [0,64,128,256,512]")
    every = p.add_argument_group("all")
    every.add_argument("--shortlist", type=at_least(1), default=2,
                       help="short simulations per policy [2]")
    every.add_argument("--seeds", type=at_least(1), default=3,
                       help="long samples per confirmed candidate (trace windows or "
                       "synthetic seeds) [3]")
    every.add_argument("--json", type=Path, help="write the plan's record here")
    p.set_defaults(handler=_run)
