"""Round-robin routing: each new request goes to the next candidate in turn.

The baseline of Arrow's Figure 8 ("Round Robin", 4P4D) for both phases. The turn is kept
per router; candidates are the board's current prefill (or decode) instances, so a flip or
failure simply changes the cycle.
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.types import Request


class RoundRobinPrefillRouter:
    def __init__(self) -> None:
        self._turn = 0

    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        candidates = board.prefill_candidates
        choice = candidates[self._turn % len(candidates)]
        self._turn += 1
        return choice


class RoundRobinDecodeRouter:
    def __init__(self) -> None:
        self._turn = 0

    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        candidates = board.decode_candidates
        choice = candidates[self._turn % len(candidates)]
        self._turn += 1
        return choice
