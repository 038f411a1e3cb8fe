"""ARES's presets and its rebalancer as a component any preset can add
(`../shared/papers/ares.md`, sec. 6.1 baselines).

All three share the paper's "prefill-decode real-time KV cache load balancing" foundation:
xPyD, prefill by the least predicted queue, each prefilled request to the decode instance
with the fewest KV tokens (running plus arriving) -- the `min-running-tokens` router.
  vllm                the foundation, no migration ("vLLM")
  reschedule-current  plus Alg. 1 on the current load only ("vLLM + rescheduling")
  ares                plus Alg. 1 with predicted future load (ARES)
`policy.rebalancer: ares` (or `reschedule-current`) in a config adds the same rebalancer to
any other preset (e.g. `policy.name: arrow`): `attach_rebalancer`.
`policy.decode_router: predicted-load` replaces the foundation's dispatch by current load
with dispatch by predicted load (`dispatch.py`), with or without the rebalancer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from pdserve.perf.fitted import PerfModel
from pdserve.policies.ares.rebalancer import AresRebalancer
from pdserve.policies.ares.settings import AresSettings
from pdserve.policies.base import NoRebalancing, Policy
from pdserve.policies.search import Knob, SearchSpace

ARES_PRESETS: dict[str, str] = {"vllm": "", "reschedule-current": "reschedule-current",
                                "ares": "ares"}  # preset -> its rebalancer
REBALANCERS = ("ares", "reschedule-current", "none")


def attach_rebalancer(policy: Policy, name: str, settings: AresSettings,
                      perf: PerfModel, instance_perfs: Sequence[PerfModel] = ()) -> Policy:
    """`policy` with its rebalancer replaced by `name` (see REBALANCERS);
    `instance_perfs`: each instance's model in a heterogeneous cluster."""
    if name not in REBALANCERS:
        raise ValueError(f"unknown rebalancer {name!r}; known: {', '.join(REBALANCERS)}")
    if name == "none":
        policy.rebalancer, policy.decode_forecast = NoRebalancing(), None
        return policy
    if not isinstance(policy.rebalancer, NoRebalancing | AresRebalancer):
        raise ValueError(f"policy {policy.name!r} has its own rebalancer "
                         f"({type(policy.rebalancer).__name__}); ARES cannot replace it")
    if name == "reschedule-current":
        settings = replace(settings, predictive=False)
    rebalancer = AresRebalancer(settings, perf, instance_perfs)
    policy.rebalancer = rebalancer
    policy.decode_forecast = rebalancer.forecast_settings
    return policy


# what `pdserve plan` searches: the split, and how eagerly Alg. 1 migrates
_THETA = Knob("policy.ares.theta", (0.05, 0.1, 0.2),
              "overload margin: small migrates on noise, large leaves TPOT gaps")
SEARCH_SPACES = (
    SearchSpace("ares", "ares", "ARES", "disaggregated", knobs=(
        _THETA, Knob("policy.ares.interval_s", (0.5, 1.0, 2.0),
                     "rebalancing round: short reacts sooner, moves more")),
        chunk_sizes=(2048, 8192)),
    SearchSpace("reschedule-current", "reschedule-current", "ARES", "disaggregated",
                knobs=(_THETA,), chunk_sizes=(2048, 8192)),
)
