"""Minimal-load routing: prefill to the shortest predicted queue, decode to the fewest tokens.

Prefill: the instance whose queued prefill work has the smallest predicted time under the
fitted prefill model, sum over queued requests of a + b*n + c*n*(n + 2p) (each request
charged as its own batch); ties go to the instance with fewer decodes. This is the
"Minimal Load" strategy of Arrow (section 7.3, Figure 8) and the least-loaded instance of a
colocated (vLLM-like) cluster.
Decode: the instance with the fewest running plus incoming decode tokens (Arrow Alg. 2's
load measure, without its SLO check).
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.perf.fitted import PerfModel, PrefillCoeffs
from pdserve.types import Request


def predicted_prefill_queue_s(load: InstanceLoad, prefill: PrefillCoeffs) -> float:
    """Predicted time to run the prefill work queued on an instance (0 for an empty queue,
    which has no tokens or attention work left either: most reads at low load)."""
    queued = load.prefill_queue_len
    if not queued:
        return 0.0
    return (queued * prefill.intercept_s
            + load.prefill_queue_tokens * prefill.per_token_s
            + load.prefill_queue_attn_units * prefill.per_attn_unit_s)


class MinLoadPrefillRouter:
    def __init__(self, prefill: PrefillCoeffs) -> None:
        self.prefill = prefill

    def use_perf_model(self, perf: PerfModel) -> None:
        self.prefill = perf.prefill

    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        instances, prefill = view.instances, self.prefill
        best, best_s, best_decodes = -1, 0.0, 0
        for i in board.prefill_candidates:
            load = instances[i]
            queue_s = predicted_prefill_queue_s(load, prefill)
            if best >= 0 and (queue_s > best_s or (queue_s == best_s and not best_decodes)):
                continue  # not better: no count of decodes is below 0 (so not read)
            decodes = load.running_decodes + load.decode_queue_len
            if best < 0 or queue_s < best_s or (queue_s == best_s and decodes < best_decodes):
                best, best_s, best_decodes = i, queue_s, decodes
        return best


class MinRunningTokensDecodeRouter:
    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        instances = view.instances
        best, best_tokens = -1, 0
        for i in board.decode_candidates:
            load = instances[i]
            tokens = load.running_tokens
            if best >= 0 and tokens >= best_tokens:
                continue  # not fewer, whatever is coming in (not read)
            tokens += load.decode_queue_tokens
            if best < 0 or tokens < best_tokens:
                best, best_tokens = i, tokens
        return best
