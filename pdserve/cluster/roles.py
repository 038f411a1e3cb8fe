"""The role table: which instance does which phase, and the flips policies ask for.

Routers and role managers change roles through `RoleBoard.set_role`; the global scheduler
turns the changes into `SetRole` actions after each event, so a router may flip an instance
and dispatch to it in one decision (as Arrow's Algorithm 1 does).
"""

from __future__ import annotations

from pdserve.cluster.messages import SetRole
from pdserve.types import Role


class RoleBoard:
    def __init__(self, roles: list[Role]) -> None:
        if not roles:
            raise ValueError("a cluster needs at least one instance")
        self.roles = list(roles)
        self.failed: set[int] = set()
        self._changes: list[SetRole] = []
        self._refresh()

    def _refresh(self) -> None:
        alive = [i for i in range(len(self.roles)) if i not in self.failed]
        self.prefill_candidates = [i for i in alive if self.roles[i].takes_prefill]
        self.decode_candidates = [i for i in alive if self.roles[i].takes_decode]
        self.pools: dict[Role, list[int]] = {role: [] for role in Role}
        for i in alive:
            self.pools[self.roles[i]].append(i)

    def set_role(self, instance_id: int, role: Role) -> None:
        if self.roles[instance_id] is role:
            return
        self.roles[instance_id] = role
        self._changes.append(SetRole(instance_id, role))
        self._refresh()

    def mark_failed(self, instance_id: int) -> None:
        self.failed.add(instance_id)
        self._refresh()

    def take_changes(self) -> list[SetRole]:
        changes, self._changes = self._changes, []
        return changes

    def count(self, role: Role) -> int:
        return len(self.pools[role])
