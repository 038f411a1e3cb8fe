"""Arrow's elastic instance pools: the transition diagram (Figure 5) and Alg. 3-4.

Moving an instance is immediate (no restart, no waiting): toward prefill it enters D->P if it
still has decode work, else P; toward decode it enters P->D if it still has prefill work,
else D. `settle` completes a transition once the old work is done (the black edges of
Figure 5). A D->P instance finishes its decodes while taking prefills, a P->D instance its
prefills while taking decodes; the local scheduler runs whatever it holds.
"""

from __future__ import annotations

from pdserve.cluster.messages import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.policies.arrow.profiling import TtftPredictor
from pdserve.types import Role


def has_decode_work(load: InstanceLoad) -> bool:
    return load.running_decodes > 0 or load.decode_queue_len > 0


def has_prefill_work(load: InstanceLoad) -> bool:
    return load.prefill_queue_len > 0


def move_to_prefill(instance_id: int, view: ClusterView, board: RoleBoard) -> None:
    busy = has_decode_work(view.instances[instance_id])
    board.set_role(instance_id, Role.D_TO_P if busy else Role.PREFILL)


def move_to_decode(instance_id: int, view: ClusterView, board: RoleBoard) -> None:
    busy = has_prefill_work(view.instances[instance_id])
    board.set_role(instance_id, Role.P_TO_D if busy else Role.DECODE)


def settle(instance_id: int, view: ClusterView, board: RoleBoard) -> None:
    role, load = board.roles[instance_id], view.instances[instance_id]
    if role is Role.P_TO_D and not has_prefill_work(load):
        board.set_role(instance_id, Role.DECODE)
    elif role is Role.D_TO_P and not has_decode_work(load):
        board.set_role(instance_id, Role.PREFILL)


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


def least_running_tokens(pool: list[int], view: ClusterView) -> int:
    instances = view.instances
    best, best_tokens = -1, 0
    for i in pool:
        tokens = instances[i].running_tokens
        if best < 0 or tokens < best_tokens:
            best, best_tokens = i, tokens
    return best


def try_move_decode_to_prefill(view: ClusterView, board: RoleBoard) -> int | None:
    """Alg. 3: keep at least one decode-capable instance; take the least-loaded P->D
    instance, else the least-loaded decode instance (by running tokens)."""
    p_to_d, decode = board.pools[Role.P_TO_D], board.pools[Role.DECODE]
    if len(decode) + len(p_to_d) <= 1:
        return None
    chosen = least_running_tokens(p_to_d or decode, view)
    move_to_prefill(chosen, view, board)
    return chosen


def try_move_prefill_to_decode(view: ClusterView, board: RoleBoard,
                               predictor: TtftPredictor) -> int | None:
    """Alg. 4: keep at least one prefill-capable instance; take the D->P instance, else the
    prefill instance, with the smallest predicted prefill queueing delay."""
    d_to_p, prefill = board.pools[Role.D_TO_P], board.pools[Role.PREFILL]
    if len(prefill) + len(d_to_p) <= 1:
        return None
    chosen, _ = least_delay(d_to_p or prefill, view, predictor)
    move_to_decode(chosen, view, board)
    return chosen
