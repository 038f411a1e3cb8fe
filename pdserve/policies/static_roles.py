"""Fixed roles: xPyD disaggregation, or every instance colocated. No flips.

`StaticRoles(prefill=x, decode=y)` makes instances 0..x-1 prefill and the next y decode (the
fixed ratio of DistServe/Splitwise-style PD and of Arrow's ablation baselines).
`ColocatedRoles()` makes every instance run both phases (vLLM-like aggregation).
"""

from __future__ import annotations

from pdserve.cluster.actions import Action
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.types import Role


class StaticRoles:
    def __init__(self, prefill: int, decode: int) -> None:
        if prefill < 1 or decode < 1:
            raise ValueError(f"static PD needs at least one prefill and one decode instance, "
                             f"got prefill={prefill}, decode={decode}")
        self.prefill, self.decode = prefill, decode

    def initial_roles(self, num_instances: int) -> list[Role]:
        if num_instances != self.prefill + self.decode:
            raise ValueError(f"static PD with {self.prefill}P{self.decode}D needs "
                             f"{self.prefill + self.decode} instances, got {num_instances}")
        return [Role.PREFILL] * self.prefill + [Role.DECODE] * self.decode

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        return []

    def on_progress(self, instance_id: int, view: ClusterView, board: RoleBoard) -> None:
        return None


class ColocatedRoles:
    def initial_roles(self, num_instances: int) -> list[Role]:
        return [Role.MIXED] * num_instances

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        return []

    def on_progress(self, instance_id: int, view: ClusterView, board: RoleBoard) -> None:
        return None
