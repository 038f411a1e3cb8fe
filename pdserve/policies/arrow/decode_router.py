"""Arrow Algorithm 2: SLO-aware decode scheduling.

  if r.prefill_instance in D or P->D: return it (decode in place, no KV transfer)
  t1 <- decode instance with minimal running tokens
  t2 <- P->D instance with minimal running tokens
  if t1 can take it (running tokens <= Max Running Tokens, token interval <= TPOT SLO):
      return t1
  elif t2 can take it: return t2
  elif (t3 <- try_move_prefill_to_decode()) != None: return t3
  return whichever of t1, t2 has fewer running tokens
Deviations: running tokens include decodes already routed to the instance and waiting for
their KV (otherwise a burst all lands on one instance before its counters move); the
batch-size cap is a hard limit the paper's load measure does not see, so t1 and t2 are
chosen among instances with a free batch slot when there are any, and "can take it" needs
one (`ArrowContext.decode_target`, `can_take_decode`).
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.pools import try_move_prefill_to_decode
from pdserve.types import Request, Role


class ArrowDecodeRouter:
    def __init__(self, context: ArrowContext) -> None:
        self.context = context

    def use_perf_model(self, perf: PerfModel) -> None:
        self.context.use_perf_model(perf)

    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        context = self.context
        if board.roles[prefill_instance] in (Role.DECODE, Role.P_TO_D):
            return prefill_instance
        t1 = context.decode_target(board.pools[Role.DECODE], view)
        if t1 >= 0 and context.can_take_decode(t1, view):
            return t1
        t2 = context.decode_target(board.pools[Role.P_TO_D], view)
        if t2 >= 0 and context.can_take_decode(t2, view):
            return t2
        t3 = try_move_prefill_to_decode(
            view, board, context,
            f"alg2: no decode instance can take request {request.request_id} (tokens, batch "
            f"slots or token interval past Max Running Tokens {context.max_running_tokens}, "
            f"TPOT SLO {context.tpot_slo_s:g}s)")
        if t3 is not None:
            return t3
        if t1 < 0 or (t2 >= 0 and context.decode_tokens(view.instances[t2])
                      < context.decode_tokens(view.instances[t1])):
            return t2
        return t1
