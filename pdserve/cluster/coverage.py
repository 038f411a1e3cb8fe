"""Keep both phases served while instances fail and come back (a rule of every policy).

A policy's role manager balances pools by load; it never has to see a pool emptied by a
failure. After an instance fails, if no live instance takes prefills (or none takes
decodes) while some instance is live, `PhaseCoverage` moves one: with two or more live
instances of the other phase the least-loaded one (toward the missing phase, through the
transitional role when it still has work of its old phase, as Arrow's Figure 5 does); with
one live instance, that instance becomes `MIXED` and serves both phases. Each move carries a
reason string. When a failed instance recovers, moves that are no longer needed are undone
(back toward the role the instance had before), keeping both phases covered.
"""

from __future__ import annotations

from collections.abc import Callable

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.types import Role


def toward(role: Role, load: InstanceLoad) -> Role:
    """The role an instance enters on its way to `role`, given the work it holds."""
    if role in (Role.PREFILL, Role.D_TO_P):
        busy = load.running_decodes > 0 or load.decode_queue_len > 0
        return Role.D_TO_P if busy else Role.PREFILL
    if role in (Role.DECODE, Role.P_TO_D):
        return Role.P_TO_D if load.prefill_queue_len > 0 else Role.DECODE
    return role


class PhaseCoverage:
    def __init__(self) -> None:
        self.moved: dict[int, Role] = {}  # instance -> its role before a coverage move

    def on_failed(self, instance_id: int, board: RoleBoard) -> None:
        """Before `mark_failed`: a moved instance that fails comes back in its old role."""
        original = self.moved.pop(instance_id, None)
        if original is not None:
            board.set_role(instance_id, original, "failed; back to its role before a "
                                                  "coverage move")

    def ensure(self, view: ClusterView, board: RoleBoard, cause: str) -> None:
        if not board.prefill_candidates and board.decode_candidates:
            self._cover(board.decode_candidates, Role.PREFILL, view, board, cause,
                        lambda i: view.instances[i].running_tokens
                        + view.instances[i].decode_queue_tokens)
        if not board.decode_candidates and board.prefill_candidates:
            self._cover(board.prefill_candidates, Role.DECODE, view, board, cause,
                        lambda i: view.instances[i].prefill_queue_tokens)

    def _cover(self, donors: list[int], phase: Role, view: ClusterView, board: RoleBoard,
               cause: str, load_of: Callable[[int], int]) -> None:
        if len(donors) == 1:
            chosen, role = donors[0], Role.MIXED
        else:
            chosen = min(donors, key=load_of)
            role = toward(phase, view.instances[chosen])
        self.moved.setdefault(chosen, board.roles[chosen])
        board.set_role(chosen, role, f"{cause}: no live instance took {phase.value} "
                                     f"requests")

    def on_recovered(self, instance_id: int, view: ClusterView, board: RoleBoard) -> None:
        """After `mark_recovered`: undo the moves both phases no longer need."""
        for moved, original in list(self.moved.items()):
            if moved in board.failed:
                continue
            role = toward(original, view.instances[moved])
            if self._covered_without(moved, role, board):
                del self.moved[moved]
                board.set_role(moved, role, f"instance {instance_id} recovered; back "
                                            f"toward {original.value}")

    @staticmethod
    def _covered_without(instance_id: int, role: Role, board: RoleBoard) -> bool:
        """Would both phases stay covered with `instance_id` in `role`?"""
        others = [r for i, r in enumerate(board.roles)
                  if i != instance_id and i not in board.failed]
        return (any(r.takes_prefill for r in others) or role.takes_prefill) and \
            (any(r.takes_decode for r in others) or role.takes_decode)
