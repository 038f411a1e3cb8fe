"""The `flowkv` preset: FlowKV's load-aware scheduling as one composition.

  roles           prefill, decode and reserve instances (`PolicySetup.roles`, or
                  `prefill` P + `decode` D + `reserve` reserve in that order)
  prefill router  min predicted TTFT with prefix hits (Alg. 1 line 19)
  decode router   min KV transfer latency (Alg. 1 line 22)
  role manager    scenarios: imbalance help, elastic scaling (Alg. 1 lines 24-30)
  local schedulers  prefill-first (FlowKV sec. 3.4), switched per instance when lent
"""

from __future__ import annotations

from pdserve.instance.phase_priority import PhasePriority
from pdserve.policies.base import Policy
from pdserve.policies.flowkv.context import FlowKVContext
from pdserve.policies.flowkv.decode_router import FlowKVDecodeRouter
from pdserve.policies.flowkv.prefill_router import FlowKVPrefillRouter
from pdserve.policies.flowkv.role_manager import FlowKVRoleManager
from pdserve.policies.search import Knob, SearchSpace
from pdserve.policies.setup import PolicySetup
from pdserve.types import Role


def flowkv_roles(setup: PolicySetup) -> list[Role]:
    if setup.roles:
        return list(setup.roles)
    return ([Role.PREFILL] * setup.prefill + [Role.DECODE] * setup.decode
            + [Role.RESERVE] * setup.reserve)


def build_flowkv(setup: PolicySetup) -> tuple[Policy, int]:
    roles = flowkv_roles(setup)
    perfs = list(setup.perfs) if setup.perfs else [setup.perf] * len(roles)
    homes = [role if role in (Role.PREFILL, Role.DECODE) else Role.RESERVE for role in roles]
    settings = setup.flowkv
    context = FlowKVContext(settings, perfs, homes, setup.chunk_size_tokens,
                            setup.max_batch_size)
    policy = Policy(
        name="flowkv",
        prefill_router=FlowKVPrefillRouter(context, settings.prefix_aware_routing),
        decode_router=FlowKVDecodeRouter(context),
        role_manager=FlowKVRoleManager(context, roles, PhasePriority.PREFILL_FIRST),
        phase_priority=PhasePriority.PREFILL_FIRST)
    return policy, len(roles)


# what `pdserve plan` searches: the split and the instances held back for elastic scaling
SEARCH_SPACES = (
    SearchSpace("flowkv", "flowkv", "FlowKV", "disaggregated", knobs=(
        Knob("cluster.reserve", (0, 1),
             "an instance held back: serves only when the load is extreme (Alg. 1)"),),
        chunk_sizes=(2048, 8192)),
)
