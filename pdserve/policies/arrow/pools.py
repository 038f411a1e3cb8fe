"""Arrow's elastic instance pools: the transition diagram (Figure 5) and Alg. 3-4.

Moving an instance is immediate (no restart, no waiting): toward prefill it enters D->P if it
still has decode work, else P; toward decode it enters P->D if it still has prefill work,
else D. `settle` completes a transition once the old work is done (the black edges of
Figure 5). A D->P instance finishes its decodes while taking prefills, a P->D instance its
prefills while taking decodes; the local scheduler runs whatever it holds.

A move between sides (a flip) records its time in the `ArrowContext` (the dwell time Alg. 3
and 4 respect) and carries the caller's reason on its `SetRole`; settling carries its own.
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.profiling import TtftPredictor
from pdserve.types import Role


def has_decode_work(load: InstanceLoad) -> bool:
    return load.running_decodes > 0 or load.decode_queue_len > 0


def has_prefill_work(load: InstanceLoad) -> bool:
    return load.prefill_queue_len > 0


def move_to_prefill(instance_id: int, view: ClusterView, board: RoleBoard,
                    context: ArrowContext, reason: str) -> None:
    busy = has_decode_work(view.instances[instance_id])
    board.set_role(instance_id, Role.D_TO_P if busy else Role.PREFILL, reason)
    context.record_flip(instance_id, view.now_s)


def move_to_decode(instance_id: int, view: ClusterView, board: RoleBoard,
                   context: ArrowContext, reason: str) -> None:
    busy = has_prefill_work(view.instances[instance_id])
    board.set_role(instance_id, Role.P_TO_D if busy else Role.DECODE, reason)
    context.record_flip(instance_id, view.now_s)


def settle(instance_id: int, view: ClusterView, board: RoleBoard) -> None:
    role, load = board.roles[instance_id], view.instances[instance_id]
    if role is Role.P_TO_D and not has_prefill_work(load):
        board.set_role(instance_id, Role.DECODE, "settle: its prefills are done")
    elif role is Role.D_TO_P and not has_decode_work(load):
        board.set_role(instance_id, Role.PREFILL, "settle: its decodes are done")


def least_delay(pool: list[int], view: ClusterView,
                predictor: TtftPredictor) -> tuple[int, float]:
    """The instance of `pool` with the least predicted prefill queueing delay, and that delay
    (-1 for an empty pool). `TtftPredictor.queue_delay_s`, inlined: this loop runs on every
    dispatch."""
    coeffs, instances = predictor.coeffs, view.instances
    a, b, c = coeffs.intercept_s, coeffs.per_token_s, coeffs.per_attn_unit_s
    best, best_delay = -1, 0.0
    for i in pool:
        load = instances[i]
        delay = (load.prefill_queue_len * a + load.prefill_queue_tokens * b
                 + load.prefill_queue_attn_units * c)
        if best < 0 or delay < best_delay:
            best, best_delay = i, delay
    return best, best_delay


def least_decode_tokens(pool: list[int], view: ClusterView) -> int:
    """Fewest running plus incoming decode tokens (Alg. 2's load measure); -1 if empty."""
    instances = view.instances
    best, best_tokens = -1, 0
    for i in pool:
        load = instances[i]
        tokens = load.running_tokens + load.decode_queue_tokens
        if best < 0 or tokens < best_tokens:
            best, best_tokens = i, tokens
    return best


def _movable(pool: list[int], view: ClusterView, context: ArrowContext) -> list[int]:
    return [i for i in pool if context.may_flip(i, view.now_s)]


def decode_to_prefill_candidate(view: ClusterView, board: RoleBoard,
                                context: ArrowContext) -> int | None:
    """Alg. 3's choice without the move: keep at least one decode-capable instance; the
    P->D instance, else the decode instance, with the fewest running plus incoming tokens,
    among those past their dwell time."""
    p_to_d, decode = board.pools[Role.P_TO_D], board.pools[Role.DECODE]
    if len(decode) + len(p_to_d) <= 1:
        return None
    for pool in (p_to_d, decode):
        chosen = least_decode_tokens(_movable(pool, view, context), view)
        if chosen >= 0:
            return chosen
    return None


def try_move_decode_to_prefill(view: ClusterView, board: RoleBoard, context: ArrowContext,
                               reason: str) -> int | None:
    """Alg. 3: move `decode_to_prefill_candidate` toward prefill."""
    chosen = decode_to_prefill_candidate(view, board, context)
    if chosen is not None:
        move_to_prefill(chosen, view, board, context, reason)
    return chosen


def try_move_prefill_to_decode(view: ClusterView, board: RoleBoard, context: ArrowContext,
                               reason: str) -> int | None:
    """Alg. 4: keep at least one prefill-capable instance; take the D->P instance, else the
    prefill instance, with the smallest predicted prefill queueing delay, among those past
    their dwell time."""
    d_to_p, prefill = board.pools[Role.D_TO_P], board.pools[Role.PREFILL]
    if len(prefill) + len(d_to_p) <= 1:
        return None
    for pool in (d_to_p, prefill):
        chosen, _ = least_delay(_movable(pool, view, context), view, context.predictor)
        if chosen >= 0:
            move_to_decode(chosen, view, board, context, reason)
            return chosen
    return None
