"""FlowKV prefill routing (Alg. 1 lines 18-20, appendix B.1 "normal load"): the prefill
instance with the lowest predicted TTFT, given its prefix-cache hits and its state.

  TTFT_i = queued prefill work on i (its own performance model: sum of a + b n + c n(n+2p))
           + the request's uncached suffix after its hit (n = input - hit, p = hit)
The hit is the leading hash blocks the prefix index thinks i holds, less a block when all
of the prompt hits (one token must be computed to sample; `prefix_cache.usable_hit_blocks`).
Ties go to the instance with fewer decodes. The same rule serves every scenario: in an
imbalanced one the candidates include the decode instances lent to prefill.
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.prefix_cache import usable_hit_blocks
from pdserve.perf.fitted import PerfModel
from pdserve.policies.flowkv.context import FlowKVContext
from pdserve.policies.min_load import predicted_prefill_queue_s
from pdserve.types import Request, attn_units


class FlowKVPrefillRouter:
    def __init__(self, context: FlowKVContext, prefix_aware: bool) -> None:
        self.context = context
        self.prefix_aware = prefix_aware

    def use_perf_model(self, perf: PerfModel) -> None:
        self.context.use_perf_model(perf)

    def predicted_ttft_s(self, instance_id: int, request: Request, view: ClusterView) -> float:
        context = self.context
        prefill = context.perfs[instance_id].prefill
        block_tokens = context.settings.prefix_block_tokens
        hit = 0
        if self.prefix_aware and request.hash_ids:
            hit = usable_hit_blocks(context.index.hit_blocks(instance_id, request.hash_ids),
                                    request.input_tokens, block_tokens) * block_tokens
        new = request.input_tokens - hit
        return (predicted_prefill_queue_s(view.instances[instance_id], prefill)
                + prefill.time_s(new, attn_units(new, hit)))

    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        best, best_key = -1, (0.0, 0)
        for i in board.prefill_candidates:
            load = view.instances[i]
            key = (self.predicted_ttft_s(i, request, view),
                   load.running_decodes + load.decode_queue_len)
            if best < 0 or key < best_key:
                best, best_key = i, key
        if best >= 0 and request.hash_ids:
            self.context.index.record(best, request.hash_ids)
        return best
