"""TaiChi's low-interference decode start (TaiChi sec. 3.3 stage 1, the entry of Algorithm 1).

After its prefill a request starts decoding on a D-heavy instance: in place when the prefill
ran on one (no KV transfer), else on the D-heavy instance with the lowest decode load, its
KV in use: running plus incoming decode tokens (the same measure as
`MinRunningTokensDecodeRouter`, so pure disaggregation is `static-pd`). With no D-heavy
instance to take it, or with flowing decode switched off (TaiChi Fig. 18 before "+Flowing
Decode"), it decodes in place. Every placed decode is registered for Alg. 1.
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.policies.taichi.context import TaiChiContext
from pdserve.types import Request


class TaiChiDecodeRouter:
    def __init__(self, context: TaiChiContext) -> None:
        self.context = context

    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        context = self.context
        layout = context.layout
        target = prefill_instance
        if context.settings.flowing_decode and layout.is_p_heavy(prefill_instance) \
                or not board.roles[prefill_instance].takes_decode:
            best, best_tokens = -1, 0
            for i in board.decode_candidates:
                if layout.is_p_heavy(i):
                    continue
                load = view.instances[i]
                tokens = load.running_tokens + load.decode_queue_tokens
                if best < 0 or tokens < best_tokens:
                    best, best_tokens = i, tokens
            if best >= 0:
                target = best
        if context.settings.flowing_decode:
            context.track(request)
        return target
