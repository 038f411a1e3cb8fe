"""Arrow Algorithm 1: SLO-aware prefill scheduling.

  t1 <- prefill instance with minimal predicted prefill queueing delay
  t2 <- D->P instance with minimal predicted prefill queueing delay
  if t1.delay + TTFT(r) <= TTFT SLO: return t1
  elif t2.delay + TTFT(r) <= TTFT SLO: return t2
  elif decode load is low and (t3 <- try_move_decode_to_prefill()) != None: return t3
  return t1
"Decode load is low" is the overload rule of sec. 5.5, asked about the instance Alg. 3 would
move: the flip goes ahead only if Alg. 2 would still find a decode instance it accepts
without it (`ArrowContext.decode_load_is_low`), so the next decode dispatch does not flip it
back. When the P pool is empty, t2 stands in for t1 in the fallback.
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.pools import (
    decode_to_prefill_candidate,
    least_delay,
    move_to_prefill,
)
from pdserve.types import Request, Role


class ArrowPrefillRouter:
    def __init__(self, context: ArrowContext) -> None:
        self.context = context

    def use_perf_model(self, perf: PerfModel) -> None:
        self.context.use_perf_model(perf)

    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        context = self.context
        prefill_s = context.predictor.ttft_s(request.input_tokens)
        t1, t1_delay = least_delay(board.pools[Role.PREFILL], view, context.predictor)
        if t1 >= 0 and t1_delay + prefill_s <= context.ttft_slo_s:
            return t1
        t2, t2_delay = least_delay(board.pools[Role.D_TO_P], view, context.predictor)
        if t2 >= 0 and t2_delay + prefill_s <= context.ttft_slo_s:
            return t2
        t3 = decode_to_prefill_candidate(view, board, context)
        if t3 is not None and context.decode_load_is_low(view, board, leaving=t3):
            waits_s = [d for i, d in ((t1, t1_delay), (t2, t2_delay)) if i >= 0]
            move_to_prefill(t3, view, board, context,
                            f"alg1: request {request.request_id} predicted TTFT "
                            f"{min(waits_s, default=0.0) + prefill_s:.2f}s > SLO "
                            f"{context.ttft_slo_s:g}s on every prefill instance; decode "
                            "load low")
            return t3
        return t1 if t1 >= 0 else t2
