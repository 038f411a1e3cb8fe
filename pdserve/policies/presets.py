"""Named policies, each just a composition of components.

| preset      | roles              | prefill router | decode router      |
|-------------|--------------------|----------------|--------------------|
| colocated   | all mixed          | min-load       | in-place           |
| static-pd   | xPyD fixed         | min-load       | min-running-tokens |
| min-load    | xPyD fixed         | min-load       | min-running-tokens | (Arrow Fig. 8)
| round-robin | xPyD fixed         | round-robin    | round-robin        | (Arrow Fig. 8)

Any preset's routers can be swapped by name (`prefill_router`, `decode_router`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.perf.fitted import PerfModel
from pdserve.policies.base import DecodeRouter, Policy, PrefillRouter, RoleManager
from pdserve.policies.in_place import InPlaceDecodeRouter
from pdserve.policies.min_load import MinLoadPrefillRouter, MinRunningTokensDecodeRouter
from pdserve.policies.round_robin import RoundRobinDecodeRouter, RoundRobinPrefillRouter
from pdserve.policies.static_roles import ColocatedRoles, StaticRoles

PREFILL_ROUTERS: dict[str, Callable[[PerfModel], PrefillRouter]] = {
    "round-robin": lambda perf: RoundRobinPrefillRouter(),
    "min-load": lambda perf: MinLoadPrefillRouter(perf.prefill),
}
DECODE_ROUTERS: dict[str, Callable[[PerfModel], DecodeRouter]] = {
    "round-robin": lambda perf: RoundRobinDecodeRouter(),
    "min-running-tokens": lambda perf: MinRunningTokensDecodeRouter(),
    "in-place": lambda perf: InPlaceDecodeRouter(),
}


@dataclass(frozen=True)
class Preset:
    disaggregated: bool
    prefill_router: str
    decode_router: str


PRESETS: dict[str, Preset] = {
    "colocated": Preset(False, "min-load", "in-place"),
    "static-pd": Preset(True, "min-load", "min-running-tokens"),
    "min-load": Preset(True, "min-load", "min-running-tokens"),
    "round-robin": Preset(True, "round-robin", "round-robin"),
}


def _pick(table: dict[str, Callable[[PerfModel], object]], name: str, what: str) -> Callable:
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(table)}")
    return table[name]


def build_policy(name: str, perf: PerfModel, *, instances: int = 8, prefill: int = 4,
                 decode: int = 4, prefill_router: str = "",
                 decode_router: str = "") -> tuple[Policy, int]:
    """The policy named `name` (with optional router overrides) and its instance count."""
    if name not in PRESETS:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    roles: RoleManager
    if preset.disaggregated:
        roles, count = StaticRoles(prefill, decode), prefill + decode
    else:
        roles, count = ColocatedRoles(), instances
    policy = Policy(
        name=name,
        prefill_router=_pick(PREFILL_ROUTERS, prefill_router or preset.prefill_router,
                             "prefill router")(perf),
        decode_router=_pick(DECODE_ROUTERS, decode_router or preset.decode_router,
                            "decode router")(perf),
        role_manager=roles)
    return policy, count
