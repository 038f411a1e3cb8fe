"""AMPD and its baselines as policies (AMPD sec. 7.1 and the Fig. 5 ablation).

| preset          | roles | prefill routing                   | queue order        |
|-----------------|-------|-----------------------------------|--------------------|
| ampd            | xPyD  | Alg. 1 (adaptive local/remote)    | Alg. 2 reordering  |
| ampd-no-reorder | xPyD  | Alg. 1                            | FCFS  (w/o PR)     |
| dynamo          | xPyD  | always remote, shortest queue     | FCFS  (w/o AR+PR)  |
All three bind each session to a decode worker by memory use and keep its history KV there;
a remote prefill reads the history lazily and returns only the new KV. `perfs` gives one
performance model per instance (the planner's mixed parallel degrees); by default every
instance has the setup's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from pdserve.perf.fitted import PerfModel
from pdserve.policies.ampd.context import AmpdContext
from pdserve.policies.ampd.reordering import TtftAwareOrder
from pdserve.policies.ampd.roles import AmpdRoles
from pdserve.policies.ampd.routing import AmpdDecodeRouter, AmpdPrefillRouter
from pdserve.policies.ampd.settings import AmpdSettings
from pdserve.policies.base import Policy
from pdserve.policies.search import Knob, SearchSpace
from pdserve.types import SLO

AMPD_VARIANTS: dict[str, tuple[bool, bool]] = {  # name -> (adaptive routing, reordering)
    "ampd": (True, True),
    "ampd-no-reorder": (True, False),
    "dynamo": (False, False),
}


def build_ampd_policy(name: str, slo: SLO, prefill: int, decode: int,
                      perfs: Sequence[PerfModel], settings: AmpdSettings | None = None,
                      seed: int = 0) -> tuple[Policy, AmpdContext]:
    """`settings`: alpha, beta (Alg. 1) and the lookahead window (Alg. 2); by default the
    paper's (`AmpdSettings`). `seed`: Alg. 1's random choice among slack workers (the run's
    `seed`)."""
    settings = settings or AmpdSettings()
    adaptive, reorder = AMPD_VARIANTS[name]
    context = AmpdContext(slo.ttft_s, slo.tpot_s, list(perfs), alpha=settings.alpha,
                          beta=settings.beta)
    policy = Policy(name=name, prefill_router=AmpdPrefillRouter(context, adaptive, seed),
                    decode_router=AmpdDecodeRouter(context),
                    role_manager=AmpdRoles(context, prefill, decode))
    if reorder:
        policy.queue_order = partial(TtftAwareOrder, slo.ttft_s, settings.window)
    return policy, context


# what `pdserve plan` searches: the split (its ILP proposes parallel degrees per phase too,
# `pdserve.planning.proposals`) and Alg. 2's window
SEARCH_SPACES = (
    SearchSpace("ampd", "ampd", "AMPD", "disaggregated", knobs=(
        Knob("policy.ampd.window", (1, 3, 8),
             "Alg. 2: tasks looked at per dequeue; larger reorders more, postpones longer"),),
        chunk_sizes=(2048, 8192)),
    SearchSpace("ampd-no-reorder", "ampd-no-reorder", "AMPD", "disaggregated",
                chunk_sizes=(2048, 8192)),
    SearchSpace("dynamo", "dynamo", "AMPD", "disaggregated", chunk_sizes=(2048, 8192)),
)
