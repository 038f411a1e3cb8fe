"""AMPD's roles: a fixed xPyD split (the planner chooses it, sec. 5), and the monitor that
feeds the windowed ITL of Algorithm 1, observed on every tick."""

from __future__ import annotations

from pdserve.cluster.actions import Action
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.policies.ampd.context import AmpdContext
from pdserve.policies.static_roles import StaticRoles


class AmpdRoles(StaticRoles):
    def __init__(self, context: AmpdContext, prefill: int, decode: int) -> None:
        super().__init__(prefill, decode)
        self.context = context

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        self.context.monitor.observe(view)
        return []
