"""Arrow's instance scheduling outside request dispatch (sec. 5.5), and pool settling.

Initial roles are xPyD. On every monitor tick:
  1. settle transitional instances whose old work is done (P->D to D, D->P to P);
  2. if the decode pool's mean token interval over the window exceeds the TPOT SLO, move a
     prefill instance to decode (Alg. 4);
  3. else, if decode is busy and a prefill-side instance is idle, move that idle instance to
     decode (the "idle prefill instances join decode" rule), keeping one prefill-capable
     instance.
Steps 2 and 3 wait `ArrowContext.monitor_cooldown_s` after the last flip either made (the
window still holds token intervals from before it), and skip instances inside their dwell
time. Settling also runs whenever an instance reports progress (a prefill done, a request
finished), so a drained instance changes pool at once rather than at the next tick.
"""

from __future__ import annotations

from pdserve.cluster.actions import Action
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.pools import (
    has_prefill_work,
    move_to_decode,
    settle,
    try_move_prefill_to_decode,
)
from pdserve.policies.static_roles import StaticRoles
from pdserve.types import Role


class ArrowRoleManager:
    def __init__(self, context: ArrowContext, prefill: int, decode: int) -> None:
        self.context = context
        self._initial = StaticRoles(prefill, decode)

    def use_perf_model(self, perf: PerfModel) -> None:
        self.context.use_perf_model(perf)

    def initial_roles(self, num_instances: int) -> list[Role]:
        return self._initial.initial_roles(num_instances)

    def on_progress(self, instance_id: int, view: ClusterView, board: RoleBoard) -> None:
        settle(instance_id, view, board)

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        context = self.context
        context.monitor.observe(view)
        for i in range(len(board.roles)):
            if i not in board.failed:
                settle(i, view, board)
        if view.now_s - context.monitor_flipped_at_s < context.monitor_cooldown_s:
            return []
        if self._flip(view, board) is not None:
            context.monitor_flipped_at_s = view.now_s
        return []  # role changes reach the driver through the board

    def _flip(self, view: ClusterView, board: RoleBoard) -> int | None:
        context = self.context
        interval_s = context.monitor.token_interval_s(context.decode_pool(board))
        if interval_s > context.tpot_slo_s:
            return try_move_prefill_to_decode(
                view, board, context,
                f"monitor: decode token interval {interval_s * 1e3:.1f} ms > TPOT SLO "
                f"{context.tpot_slo_s * 1e3:g} ms over {context.monitor.window_s:g}s")
        if not context.decode_is_busy(view, board):
            return None
        prefill_side = board.pools[Role.D_TO_P] + board.pools[Role.PREFILL]
        idle = [i for i in prefill_side if not has_prefill_work(view.instances[i])
                and context.may_flip(i, view.now_s)]
        if not idle or len(prefill_side) <= 1:
            return None
        move_to_decode(idle[0], view, board, context,
                       "monitor: decode busy and this prefill-side instance idle")
        return idle[0]
