"""Session binding (AMPD sec. 3, step 1).

When a session's first request arrives it is bound to a decode worker by memory use (as
Dynamo's KV router does): the live decode candidate with the smallest share of its KV
memory in use or already promised to incoming hand-offs. That worker keeps the session's
history KV and runs all its decodes; later rounds stay bound to it while it is live (the
driver sets `Request.home_instance` to the instance that decoded the previous round).
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.types import KV_BLOCK_TOKENS, Request


def memory_use(view: ClusterView, instance_id: int) -> float:
    load = view.instances[instance_id]
    incoming = load.decode_queue_tokens / KV_BLOCK_TOKENS
    return (load.used_blocks + incoming) / load.total_blocks if load.total_blocks else 1.0


def bound_decode_instance(request: Request, view: ClusterView, board: RoleBoard) -> tuple[int, str]:
    """The request's decode worker, binding it now if it has none (or its worker left
    the decode pool); returns the instance and why."""
    home = request.home_instance
    if home >= 0 and home in board.decode_candidates:
        return home, f"bound to decode {home}"
    candidates = board.decode_candidates
    if not candidates:
        return -1, "no decode candidate"
    best = min(candidates, key=lambda i: (memory_use(view, i), i))
    request.home_instance = best
    return best, f"bound to decode {best} (least memory use {memory_use(view, best):.0%})"
