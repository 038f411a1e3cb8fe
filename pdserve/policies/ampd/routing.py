"""AMPD's adaptive routing of prefill tasks (Algorithm 1) and the bound decode.

Algorithm 1, for a prefill task whose session is bound to decode worker d:
  lines 1-3  for each prefill worker i in random order: if its windowed TTFT is at most
             alpha * TTFT SLO, run the task there (remote)
  lines 4-5  else if d's windowed ITL is at most beta * ITL SLO, run it on d (local)
  lines 6-9  else the cheapest of local (Eq. 1) and each remote (Eq. 2)
A local prefill shares d's steps with its decodes (the local scheduler runs decodes and a
prefill chunk in one step), which stalls the decode batch for that step as the paper's
prefill-first rule does. `adaptive=False` always runs remote, on the prefill worker with the
shortest predicted queue: the Dynamo-like baseline and the "w/o AR" ablation.

The decode router keeps every decode on the bound worker, and records the TTFT of each
finished prefill for the windowed statistics.
"""

from __future__ import annotations

import random

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel
from pdserve.policies.ampd.binding import bound_decode_instance
from pdserve.policies.ampd.context import AmpdContext
from pdserve.policies.ampd.cost_model import PrefillTask, local_cost_s, remote_cost_s
from pdserve.policies.min_load import predicted_prefill_queue_s
from pdserve.types import Request


class AmpdPrefillRouter:
    def __init__(self, context: AmpdContext, adaptive: bool = True, seed: int = 0) -> None:
        self.context = context
        self.adaptive = adaptive
        self._random = random.Random(seed)

    def use_perf_model(self, perf: PerfModel) -> None:
        self.context.use_perf_model(perf)

    def route(self, request: Request, view: ClusterView, board: RoleBoard) -> int:
        ctx, now = self.context, view.now_s
        decode, bound = bound_decode_instance(request, view, board)
        remotes = [i for i in board.prefill_candidates if i != decode]
        rid = request.request_id
        if decode < 0 or not remotes:
            target = decode if decode >= 0 else board.prefill_candidates[0]
            return ctx.log(rid, target, "local", f"{bound}; no prefill worker")
        if not self.adaptive:
            target = min(remotes, key=lambda i: (predicted_prefill_queue_s(
                view.instances[i], ctx.perf(i).prefill), i))
            return ctx.log(rid, target, "remote", f"{bound}; always remote, shortest queue")
        ttft_limit = ctx.alpha * ctx.ttft_slo_s
        order = remotes[:]
        self._random.shuffle(order)
        for i in order:  # Alg. 1 lines 1-3
            ttft = ctx.windowed_ttft_s(i, now)
            if ttft <= ttft_limit:
                return ctx.log(rid, i, "remote", f"{bound}; alg1 line 2: prefill {i} "
                               f"TTFT {ttft * 1e3:.0f} ms <= alpha*SLO {ttft_limit * 1e3:.0f} ms")
        itl, itl_limit = ctx.windowed_itl_s(decode), ctx.beta * ctx.itl_slo_s
        if itl <= itl_limit:  # Alg. 1 lines 4-5
            return ctx.log(rid, decode, "local", f"{bound}; alg1 line 4: every prefill TTFT "
                           f"> alpha*SLO, decode ITL {itl * 1e3:.1f} ms <= beta*SLO "
                           f"{itl_limit * 1e3:.1f} ms")
        task = PrefillTask.of(request)  # Alg. 1 lines 6-9
        best, best_cost = decode, local_cost_s(view, ctx.perf(decode), decode, task)
        local_cost = best_cost
        for i in remotes:
            cost = remote_cost_s(view, ctx.perf(i), i, decode, task)
            if cost < best_cost:
                best, best_cost = i, cost
        kind = "cost-local" if best == decode else "cost-remote"
        return ctx.log(rid, best, kind, f"{bound}; alg1 line 9: no slack (decode ITL "
                       f"{itl * 1e3:.1f} ms), Eq.1 local {local_cost * 1e3:.0f} ms, best "
                       f"{'local' if best == decode else f'remote {best}'} "
                       f"{best_cost * 1e3:.0f} ms")


class AmpdDecodeRouter:
    def __init__(self, context: AmpdContext) -> None:
        self.context = context

    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        self.context.record_ttft(prefill_instance, view.now_s, view.now_s - request.arrival_s)
        decode, _ = bound_decode_instance(request, view, board)
        return decode
