"""FlowKV's global controller loop on each monitor tick (Alg. 1 lines 3-31).

  1. update every instance's status, scores, C^p, C^d and the scenario (`context.observe`)
  2. imbalanced load: lend idle instances to the overloaded phase (`balance.py`)
  3. extreme load: scale a side up or down from the reserve (`scaling.py`)
Normal load needs nothing here: the routers apply lines 18-23 on every dispatch. Initial
roles are the configured ones: prefill, decode, and reserve instances for scaling.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.cluster.actions import Action
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.phase_priority import PhasePriority
from pdserve.policies.flowkv.balance import PhaseBalancer
from pdserve.policies.flowkv.context import FlowKVContext
from pdserve.policies.flowkv.scaling import ElasticScaler
from pdserve.types import Role


class FlowKVRoleManager:
    def __init__(self, context: FlowKVContext, roles: Sequence[Role],
                 default_priority: PhasePriority = PhasePriority.PREFILL_FIRST) -> None:
        if Role.PREFILL not in roles or Role.DECODE not in roles:
            raise ValueError("flowkv needs at least one prefill and one decode instance, got "
                             f"roles {[r.value for r in roles]}")
        self.context = context
        self.roles = list(roles)
        self.balancer = PhaseBalancer(context, default_priority)
        self.scaler = ElasticScaler(context)

    def initial_roles(self, num_instances: int) -> list[Role]:
        if num_instances != len(self.roles):
            raise ValueError(f"flowkv is set up for {len(self.roles)} instances, got "
                             f"{num_instances}")
        return list(self.roles)

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        scenario = self.context.observe(view, board)
        actions = self.balancer.on_tick(scenario, view, board)
        self.scaler.on_tick(view, board)
        return actions

    def on_progress(self, instance_id: int, view: ClusterView, board: RoleBoard) -> None:
        """After an instance's progress or its start (`InstanceStarted`)."""
        self.scaler.on_started(instance_id, view, board)
