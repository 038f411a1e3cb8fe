"""Arrow Algorithm 1: SLO-aware prefill scheduling.

  t1 <- prefill instance with minimal predicted prefill queueing delay
  t2 <- D->P instance with minimal predicted prefill queueing delay
  if t1.delay + TTFT(r) <= TTFT SLO: return t1
  elif t2.delay + TTFT(r) <= TTFT SLO: return t2
  elif decode load is low and (t3 <- try_move_decode_to_prefill()) != None: return t3
  return t1
The "decode load is low" check is the overload rule of sec. 5.5 (decode keeps priority; see
`ArrowContext`). When the P pool is empty, t2 stands in for t1 in the fallback.
"""

from __future__ import annotations

from pdserve.cluster.messages import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.pools import least_delay, try_move_decode_to_prefill
from pdserve.types import Request, Role


class ArrowPrefillRouter:
    def __init__(self, context: ArrowContext) -> None:
        self.context = context

    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        context = self.context
        prefill_s = context.predictor.ttft_s(request.input_tokens)
        t1, t1_delay = least_delay(board.pools[Role.PREFILL], view, context.predictor)
        if t1 >= 0 and t1_delay + prefill_s <= context.ttft_slo_s:
            return t1
        t2, t2_delay = least_delay(board.pools[Role.D_TO_P], view, context.predictor)
        if t2 >= 0 and t2_delay + prefill_s <= context.ttft_slo_s:
            return t2
        if context.decode_load_is_low(view, board):
            t3 = try_move_decode_to_prefill(view, board)
            if t3 is not None:
                return t3
        return t1 if t1 >= 0 else t2
