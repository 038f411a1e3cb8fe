"""TaiChi's length-aware prefill scheduling (TaiChi sec. 3.4, Algorithm 2).

For each instance that takes prefills, the estimated TTFT of the new request is
  Q  the queued prefill work on the instance (Alg. 2 line 3),
  E  the new request's own prefill (line 4),
  T  for a P-heavy instance, the KV transfer to a D-heavy instance (line 5: bytes over the
     link, from the view's topology, else the perf model's link),
with Q and E from the performance model for the instance's chunk size and its current
batch: each step runs `chunk - decodes` prefill tokens next to the running decodes, so a
prefill of n tokens takes ceil(n / (chunk - decodes)) mixed steps. An instance whose batch
has no sequence slot left for the request (running and incoming decodes plus queued
prefills at the batch-size cap) cannot start it before a decode ends: pdserve counts it
infeasible (the paper's `i.batch` term, made explicit). An instance is feasible
when Q + E + T < the TTFT SLO (line 6); the request goes to the feasible instance with the
fewest queued prefill tokens (line 11), which is typically a slow D-heavy one for a short
request, keeping P-heavy instances for long ones.

No feasible instance (line 14 returns nothing): `random` (the paper's experiments), the
`least-loaded` instance, or `reject` (early rejection: the request is refused, in the live
server with HTTP 429, and the reason names the best estimate).

With one kind of instance among the prefill candidates (pure aggregation or pure
disaggregation) there is no length to be aware of, and the router is the least-loaded one
(`MinLoadPrefillRouter`, as `colocated` and `static-pd`); so it is with the ablation switch
`length_aware_prefill` off (TaiChi Fig. 18 before "+Length-Aware Prefill").
"""

from __future__ import annotations

import math
import random

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.perf.fitted import PerfModel
from pdserve.policies.base import RejectRequest
from pdserve.policies.min_load import MinLoadPrefillRouter
from pdserve.policies.taichi.context import TaiChiContext
from pdserve.types import Request, attn_units


def prefill_time_s(perf: PerfModel, chunk_tokens: int, load: InstanceLoad, tokens: int,
                   units: int) -> float:
    """Predicted time to prefill `tokens` (attention work `units`) on an instance with this
    chunk size and its current decode batch: full chunks of `chunk - decodes` tokens, each
    step priced as the mixed batch it is (`PerfModel.batch_time_s`), the attention once."""
    if tokens <= 0:
        return 0.0
    decodes, context = load.running_decodes, load.running_tokens
    budget = chunk_tokens - decodes
    if budget <= 0:
        return math.inf  # the decodes fill every step: no prefill progress
    full, rest = divmod(tokens, budget)
    time_s = (full * perf.batch_time_s(decodes, context, budget, 0)
              + units * perf.prefill.per_attn_unit_s)
    if rest:
        time_s += perf.batch_time_s(decodes, context, rest, 0)
    return time_s


class TaiChiPrefillRouter:
    def __init__(self, context: TaiChiContext) -> None:
        self.context = context
        self.least_loaded = MinLoadPrefillRouter(context.perf.prefill)
        self.rng = random.Random(context.settings.seed)

    def use_perf_model(self, perf: PerfModel) -> None:
        self.context.use_perf_model(perf)
        self.least_loaded.use_perf_model(perf)

    def estimate_s(self, request: Request, instance_id: int, view: ClusterView,
                   board: RoleBoard) -> tuple[float, float, float]:
        """(Q, E, T) of Alg. 2 lines 3-5 for `request` on `instance_id`."""
        context, load = self.context, view.instances[instance_id]
        chunk = context.layout.chunk_sizes_tokens[instance_id]
        n = request.input_tokens
        if load.running_decodes + load.decode_queue_len + load.prefill_queue_len \
                >= context.max_batch_size:
            return 0.0, math.inf, 0.0  # no batch slot for it
        queued = prefill_time_s(context.perf, chunk, load, load.prefill_queue_tokens,
                                load.prefill_queue_attn_units)
        total = prefill_time_s(context.perf, chunk, load, load.prefill_queue_tokens + n,
                               load.prefill_queue_attn_units + attn_units(n, 0))
        transfer = self._transfer_s(request, instance_id, view, board) \
            if context.layout.is_p_heavy(instance_id) else 0.0
        return queued, total - queued, transfer

    def _transfer_s(self, request: Request, instance_id: int, view: ClusterView,
                    board: RoleBoard) -> float:
        perf, layout = self.context.perf, self.context.layout
        if view.topology is None:
            return perf.transfer_time_s(request.input_tokens)
        num_bytes = request.input_tokens * perf.kv_bytes_per_token
        times = [view.topology.transfer_time_s(instance_id, d, num_bytes)
                 for d in board.decode_candidates if not layout.is_p_heavy(d)]
        return min(times) if times else 0.0

    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        candidates = board.prefill_candidates
        layout = self.context.layout
        if not self.context.settings.length_aware_prefill or \
                len({layout.kinds[i] for i in candidates}) < 2:
            return self.least_loaded.route(request, view, board)
        slo_s = self.context.slo.ttft_s
        best, best_key = -1, (0, 0.0)
        nearest, nearest_s = -1, math.inf
        for i in candidates:
            queued, execution, transfer = self.estimate_s(request, i, view, board)
            ttft = queued + execution + transfer
            if ttft < nearest_s or nearest < 0:
                nearest, nearest_s = i, ttft
            if ttft < slo_s:  # feasible (line 6)
                key = (view.instances[i].prefill_queue_tokens, ttft)
                if best < 0 or key < best_key:
                    best, best_key = i, key
        if best >= 0:
            return best
        return self._no_feasible(request, view, board, nearest, nearest_s)

    def _no_feasible(self, request: Request, view: ClusterView, board: RoleBoard,
                     nearest: int, nearest_s: float) -> int:
        behaviour = self.context.settings.no_feasible
        if behaviour == "random":
            return self.rng.choice(board.prefill_candidates)
        if behaviour == "least-loaded":
            return self.least_loaded.route(request, view, board)
        raise RejectRequest(
            f"taichi alg2: no instance can start this {request.input_tokens}-token prompt "
            f"within the TTFT SLO of {self.context.slo.ttft_s:g}s (best estimate "
            f"{nearest_s:.3f}s on instance {nearest}); retry later")
