"""FlowKV decode routing (Alg. 1 lines 21-23): the decode instance with the lowest KV
transfer latency from the prefill instance chosen.

Latency is the topology's uncontended estimate for the request's KV bytes (0 in place, when
the prefill instance takes decodes itself; 0 for every pair when the driver knows no
topology). Guards pdserve adds, since the paper's rule alone would send every decode to the
nearest instance however loaded: candidates whose decode score is past eps_d_high or whose
free KV cannot hold the request are skipped while any other remains; among equal latencies
the instance with the fewest running plus incoming decode tokens wins (the scores change
only per tick, the tokens with every dispatch).
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel
from pdserve.policies.flowkv.context import FlowKVContext
from pdserve.types import Request


class FlowKVDecodeRouter:
    def __init__(self, context: FlowKVContext) -> None:
        self.context = context

    def use_perf_model(self, perf: PerfModel) -> None:
        self.context.use_perf_model(perf)

    def transfer_s(self, source: int, target: int, request: Request, view: ClusterView) -> float:
        if source == target or view.topology is None:
            return 0.0
        num_bytes = self.context.kv_bytes(source, request.sequence_tokens - 1)
        return view.topology.transfer_time_s(source, target, num_bytes)

    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        context = self.context
        high = context.settings.high_decode
        candidates = board.decode_candidates
        fit = [i for i in candidates if context.decode_scores[i] <= high
               and context.free_tokens(view, i) >= request.sequence_tokens + 16]
        best, best_key = -1, (0.0, 0)
        for i in fit or candidates:
            load = view.instances[i]
            key = (self.transfer_s(prefill_instance, i, request, view),
                   load.running_tokens + load.decode_queue_tokens)
            if best < 0 or key < best_key:
                best, best_key = i, key
        return best
