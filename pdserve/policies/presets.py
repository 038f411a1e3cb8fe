"""Named policies, each just a composition of components.

| preset      | roles         | prefill router | decode router      | paper             |
|-------------|---------------|----------------|--------------------|-------------------|
| colocated   | all mixed     | min-load       | in-place           | vLLM-like         |
| static-pd   | xPyD fixed    | min-load       | min-running-tokens |                   |
| min-load    | xPyD fixed    | min-load       | min-running-tokens | Arrow Fig. 8      |
| round-robin | xPyD fixed    | round-robin    | round-robin        | Arrow Fig. 8      |
| arrow       | xPyD, elastic | arrow (Alg. 1) | arrow (Alg. 2)     | Arrow "SLO aware" |
| flowkv      | xPyD+reserve  | min TTFT, hits | min transfer time  | FlowKV Alg. 1     |
| ampd        | xPyD fixed    | AMPD Alg. 1    | bound (AMPD sec. 3)| AMPD (+ Alg. 2)   |
| dynamo      | xPyD fixed    | always remote  | bound (AMPD sec. 3)| AMPD's Dynamo     |
| continuum   | all mixed     | session affinity | in-place         | vLLM-Continuum-like |
(`ampd-no-reorder` is ampd without Alg. 2; see policies/ampd/preset.py.)
| taichi      | P-/D-heavy    | taichi (Alg. 2)| taichi (Alg. 1)    | TaiChi            |
| vllm        | xPyD fixed    | min-load       | min-running-tokens | ARES's "vLLM"     |
| reschedule-current | xPyD   | min-load       | min-running-tokens | + Alg. 1, current load |
| ares        | xPyD fixed    | min-load       | min-running-tokens | + ARES Alg. 1     |
(Any preset takes ARES's rebalancer with `PolicyConfig.rebalancer`; policies/ares/preset.py;
and decode router `predicted-load`, dispatch by predicted future load: policies/ares/dispatch.py.)

Any preset's routers can be swapped by name (`PolicyConfig.prefill_router`,
`decode_router`), except taichi's, whose components share per-request state
(`policies/taichi/preset.py`); its sliders are `PolicySetup.prefill : decode` (R_PD) and
`PolicyConfig.taichi`. `PolicyConfig.phase_priority` replaces any policy's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pdserve.instance.phase_priority import parse_phase_priority
from pdserve.policies.ampd.preset import AMPD_VARIANTS, build_ampd_policy
from pdserve.policies.ares.dispatch import PredictedLoadDecodeRouter
from pdserve.policies.ares.preset import ARES_PRESETS, attach_rebalancer
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.decode_router import ArrowDecodeRouter
from pdserve.policies.arrow.prefill_router import ArrowPrefillRouter
from pdserve.policies.arrow.preset import arrow_context
from pdserve.policies.arrow.role_manager import ArrowRoleManager
from pdserve.policies.base import DecodeRouter, Policy, PrefillRouter, RoleManager
from pdserve.policies.flowkv.preset import build_flowkv
from pdserve.policies.in_place import InPlaceDecodeRouter
from pdserve.policies.min_load import MinLoadPrefillRouter, MinRunningTokensDecodeRouter
from pdserve.policies.round_robin import RoundRobinDecodeRouter, RoundRobinPrefillRouter
from pdserve.policies.session_affinity import SessionAffinityPrefillRouter, SessionFirstOrder
from pdserve.policies.setup import PolicySetup
from pdserve.policies.static_roles import ColocatedRoles, StaticRoles
from pdserve.policies.taichi.preset import build_taichi


@dataclass(frozen=True)
class Preset:
    elastic: bool  # Arrow pools
    disaggregated: bool
    prefill_router: str
    decode_router: str


PRESETS: dict[str, Preset] = {
    "colocated": Preset(False, False, "min-load", "in-place"),
    "static-pd": Preset(False, True, "min-load", "min-running-tokens"),
    "min-load": Preset(False, True, "min-load", "min-running-tokens"),
    "round-robin": Preset(False, True, "round-robin", "round-robin"),
    "arrow": Preset(True, True, "arrow", "arrow"),
    "flowkv": Preset(False, True, "flowkv", "flowkv"),  # built by policies/flowkv/preset.py
    **{name: Preset(False, True, "ampd", "ampd") for name in AMPD_VARIANTS},
    "continuum": Preset(False, False, "session-affinity", "in-place"),
    "taichi": Preset(False, True, "taichi", "taichi"),  # built by `build_taichi`
    **{name: Preset(False, True, "min-load", "min-running-tokens") for name in ARES_PRESETS},
}

PREFILL_ROUTERS: dict[str, Callable[[PolicySetup, ArrowContext | None], PrefillRouter]] = {
    "round-robin": lambda setup, arrow: RoundRobinPrefillRouter(),
    "min-load": lambda setup, arrow: MinLoadPrefillRouter(setup.perf.prefill),
    "arrow": lambda setup, arrow: ArrowPrefillRouter(arrow or arrow_context(setup)),
    "session-affinity": lambda setup, arrow: SessionAffinityPrefillRouter(setup.perf.prefill),
}
DECODE_ROUTERS: dict[str, Callable[[PolicySetup, ArrowContext | None], DecodeRouter]] = {
    "round-robin": lambda setup, arrow: RoundRobinDecodeRouter(),
    "min-running-tokens": lambda setup, arrow: MinRunningTokensDecodeRouter(),
    "in-place": lambda setup, arrow: InPlaceDecodeRouter(),
    "arrow": lambda setup, arrow: ArrowDecodeRouter(arrow or arrow_context(setup)),
    "predicted-load": lambda setup, arrow: PredictedLoadDecodeRouter(
        setup.ares.forecast, setup.output_lengths_known),
}


def _pick(table: dict[str, Callable], name: str, what: str) -> Callable:
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(table)}")
    return table[name]


def build_policy(setup: PolicySetup) -> tuple[Policy, int]:
    """The policy `setup.policy` names (with its router, phase priority and rebalancer
    overrides) and its instance count."""
    section = setup.policy
    policy, count = _build_preset(section.name, setup)
    rebalancer = section.rebalancer or ARES_PRESETS.get(section.name, "")
    if rebalancer:
        attach_rebalancer(policy, rebalancer, setup.ares, setup.perf, setup.perfs)
    if isinstance(policy.decode_router, PredictedLoadDecodeRouter):
        _keep_predicted_forecasts(policy, policy.decode_router)
    if section.phase_priority:
        policy.phase_priority = parse_phase_priority(section.phase_priority)
    return policy, count


def _keep_predicted_forecasts(policy: Policy, router: PredictedLoadDecodeRouter) -> None:
    """The instances keep the forecasts predicted-load dispatch reads (the rebalancer's,
    which must then predict too)."""
    if policy.decode_forecast is None:
        policy.decode_forecast = router.settings
    elif policy.decode_forecast != router.settings:
        raise ValueError("decode router 'predicted-load' reads the instances' predicted "
                         "load; the 'reschedule-current' rebalancer keeps only their current "
                         "load (use rebalancer 'ares' or 'none' with it)")


def _build_preset(name: str, setup: PolicySetup) -> tuple[Policy, int]:
    if name not in PRESETS:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(PRESETS)}")
    if name == "flowkv":
        return build_flowkv(setup)
    if name in AMPD_VARIANTS:
        return build_ampd_policy(name, setup.slo, setup.prefill, setup.decode,
                                 setup.perfs or [setup.perf], setup.policy.ampd,
                                 setup.seed)[0], \
            setup.prefill + setup.decode
    preset = PRESETS[name]
    if name == "taichi":
        if setup.policy.prefill_router or setup.policy.decode_router:
            raise ValueError("taichi's routers are its Algorithms 2 and 1 and cannot be "
                             "replaced; switch them off with policy.taichi."
                             "length_aware_prefill / policy.taichi.flowing_decode")
        return build_taichi(setup.perf, setup.slo, setup.prefill, setup.decode, setup.taichi,
                            setup.max_batch_size)
    prefill_name = setup.policy.prefill_router or preset.prefill_router
    decode_name = setup.policy.decode_router or preset.decode_router
    uses_arrow = preset.elastic or "arrow" in (prefill_name, decode_name)
    arrow = arrow_context(setup) if uses_arrow else None  # one context, shared
    roles: RoleManager
    if preset.elastic:
        assert arrow is not None
        roles, count = ArrowRoleManager(arrow, setup.prefill, setup.decode), \
            setup.prefill + setup.decode
    elif preset.disaggregated:
        roles, count = StaticRoles(setup.prefill, setup.decode), setup.prefill + setup.decode
    else:
        roles, count = ColocatedRoles(), setup.instances
    policy = Policy(
        name=name,
        prefill_router=_pick(PREFILL_ROUTERS, prefill_name, "prefill router")(setup, arrow),
        decode_router=_pick(DECODE_ROUTERS, decode_name, "decode router")(setup, arrow),
        role_manager=roles)
    if name == "continuum":
        policy.queue_order = SessionFirstOrder
    return policy, count
