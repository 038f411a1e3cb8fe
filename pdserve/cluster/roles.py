"""The role table: which instance does which phase, and the flips policies ask for.

Routers and role managers change roles through `RoleBoard.set_role`; the global scheduler
turns the changes into `SetRole` actions after each event, so a router may flip an instance
and dispatch to it in one decision (as Arrow's Algorithm 1 does).

Stopped instances (`stopped`: held in the reserve, or scaled down) hold no work and take
none; `start_instance` / `stop_instance` queue the `StartInstance` / `StopInstance` actions
with the other changes, and `mark_started` records the driver's `InstanceStarted`.

Member lists (`pools[role]`, `prefill_candidates`, `decode_candidates`) stay sorted by
instance id and are updated in place on a change, so a flip costs a few list operations
rather than a rebuild (it sits on the dispatch path).
"""

from __future__ import annotations

from bisect import insort

from pdserve.cluster.actions import SetRole, StartInstance, StopInstance
from pdserve.types import Role


class RoleBoard:
    def __init__(self, roles: list[Role]) -> None:
        if not roles:
            raise ValueError("a cluster needs at least one instance")
        self.roles = list(roles)
        self.failed: set[int] = set()
        self.stopped: set[int] = set()
        self.starting: set[int] = set()  # asked to start, not yet serving
        self._changes: list[SetRole | StartInstance | StopInstance] = []
        self.pools: dict[Role, list[int]] = {role: [] for role in Role}
        self.prefill_candidates: list[int] = []
        self.decode_candidates: list[int] = []
        for i, role in enumerate(self.roles):
            self._add(i, role)

    def _lists_of(self, role: Role) -> list[list[int]]:
        lists = [self.pools[role]]
        if role.takes_prefill:
            lists.append(self.prefill_candidates)
        if role.takes_decode:
            lists.append(self.decode_candidates)
        return lists

    def _add(self, instance_id: int, role: Role) -> None:
        for members in self._lists_of(role):
            insort(members, instance_id)

    def _remove(self, instance_id: int, role: Role) -> None:
        for members in self._lists_of(role):
            members.remove(instance_id)

    def set_role(self, instance_id: int, role: Role, reason: str = "") -> None:
        """Change a role; `reason` (the rule that decided it) travels on the `SetRole`."""
        old = self.roles[instance_id]
        if old is role:
            return
        self.roles[instance_id] = role
        self._changes.append(SetRole(instance_id, role, reason))
        if instance_id not in self.failed:
            self._remove(instance_id, old)
            self._add(instance_id, role)

    def mark_failed(self, instance_id: int) -> None:
        self.starting.discard(instance_id)  # a start that failed is no longer awaited
        if instance_id not in self.failed:
            self.failed.add(instance_id)
            self._remove(instance_id, self.roles[instance_id])

    def mark_recovered(self, instance_id: int) -> None:
        """A failed instance serves again, in the role the table holds for it."""
        if instance_id in self.failed:
            self.failed.discard(instance_id)
            self._add(instance_id, self.roles[instance_id])

    def is_live(self, instance_id: int) -> bool:
        return instance_id not in self.failed

    def stop_instance(self, instance_id: int, reason: str) -> None:
        """Stop an instance that holds no work (the caller checks); it takes none after."""
        if instance_id not in self.stopped:
            self.stopped.add(instance_id)
            self._changes.append(StopInstance(instance_id, reason))

    def start_instance(self, instance_id: int, reason: str) -> None:
        """Ask for a stopped instance to start; it is stopped until `mark_started`."""
        if instance_id in self.stopped and instance_id not in self.starting:
            self.starting.add(instance_id)
            self._changes.append(StartInstance(instance_id, reason))

    def mark_started(self, instance_id: int) -> None:
        self.stopped.discard(instance_id)
        self.starting.discard(instance_id)

    def take_changes(self) -> list[SetRole | StartInstance | StopInstance]:
        changes = self._changes
        if changes:  # most events change nothing: no new list then
            self._changes = []
        return changes

    def count(self, role: Role) -> int:
        return len(self.pools[role])
