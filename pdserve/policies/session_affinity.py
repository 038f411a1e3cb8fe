"""Session affinity on colocated instances: a stand-in for vLLM-Continuum (Li et al., 2025,
as AMPD sec. 7.1 describes it).

A session's later rounds go to the instance that served its previous round, where its
history KV is kept (`SessionAffinityPrefillRouter`; first rounds and single requests go to
the least-loaded instance), and its queue puts continuing rounds of sessions ahead of new
requests (`SessionFirstOrder`), since they reuse cached KV and need less computation.
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel, PrefillCoeffs
from pdserve.policies.min_load import MinLoadPrefillRouter
from pdserve.types import Request


class SessionAffinityPrefillRouter:
    def __init__(self, prefill: PrefillCoeffs) -> None:
        self.fallback = MinLoadPrefillRouter(prefill)

    def use_perf_model(self, perf: PerfModel) -> None:
        self.fallback.use_perf_model(perf)

    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        home = request.home_instance
        if home >= 0 and home in board.prefill_candidates:
            return home
        return self.fallback.route(request, view, board)


class SessionFirstOrder:
    """Continuing rounds (with history) queue ahead of first rounds, FCFS within each."""

    def insert(self, queue: list[Request], request: Request) -> None:
        if request.history_tokens <= 0:
            queue.append(request)
            return
        index = len(queue)
        while index > 0 and queue[index - 1].history_tokens <= 0:
            index -= 1
        queue.insert(index, request)
