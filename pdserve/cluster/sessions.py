"""Where a session round's prefill gets its history KV: one decision for both worlds.

A multi-round session (AMPD sec. 3) keeps the KV of its history on the instance that decoded
its previous round (the round's `home_instance`). When the global scheduler dispatches the
next round's prefill, the history is, by where the prefill lands:

  LOCAL      on the home instance: the prefill takes the history over, computes the new
             tokens only
  READ       on an instance that takes no decodes (a prefill-only instance, AMPD's remote
             execution): it reads the history from home over the links and hands back
             only the new KV, which home merges onto the history
  RECOMPUTE  on another instance that decodes (colocated elsewhere): no history is read;
             the round recomputes it there, and the copy at home is dropped (the session
             moves to where it now decodes)
  GONE       elsewhere, but the history is no longer at home (evicted under memory
             pressure, or home is not serving): the round computes it all
  NONE       not a round with history (a single request, a first round, or a round whose
             earlier rounds never ran here)

The simulator (`sim/sessions.py`) and the live driver (`live/sessions.py`) both call
`history_source` when they apply `DispatchPrefill` (`cluster/actions.py: apply_actions`)
and only carry the answer out: the simulator reads lazily when the round heads its queue,
the live driver asks home for the history at dispatch; both drop the copy at home on
RECOMPUTE.
"""

from __future__ import annotations

import enum

from pdserve.types import Request, Role


class HistorySource(enum.Enum):
    NONE = "none"
    LOCAL = "local"
    READ = "read"
    RECOMPUTE = "recompute"
    GONE = "gone"

    @property
    def remote(self) -> bool:
        """Prefilled away from a home it has (AMPD's remote execution, counted)."""
        return self in _REMOTE


_REMOTE = frozenset({HistorySource.READ, HistorySource.RECOMPUTE, HistorySource.GONE})


def history_source(request: Request, prefill_instance: int, prefill_role: Role,
                   home_serving: bool = True) -> HistorySource:
    """Where `request`'s prefill on `prefill_instance` (now in `prefill_role`) gets its
    history; `home_serving`: the home instance is up (a live worker may have died)."""
    home = request.home_instance
    if request.history_tokens <= 0 or home < 0:
        return HistorySource.NONE
    if prefill_instance == home:
        return HistorySource.LOCAL
    if not request.cached_prefix_tokens or not home_serving:
        return HistorySource.GONE
    if prefill_role.takes_decode:
        return HistorySource.RECOMPUTE
    return HistorySource.READ
