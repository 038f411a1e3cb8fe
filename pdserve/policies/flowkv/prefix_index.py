"""The global controller's prefix index (FlowKV sec. 3.2: it "identifies global cache prefix
matches"; Alg. 1 line 19: prefill routing "subject to a cache prefix hit condition").

Per instance, the chained prefix hashes (`Request.hash_ids`) of the requests routed there,
most recently used last, capped at what the instance's KV memory holds. It approximates the
instances' caches (`pdserve.instance.prefix_cache`) without asking them, the same way in
both worlds; an instance that evicted under memory pressure holds fewer than the index
thinks, so a predicted hit can be smaller in fact.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    def __init__(self, capacity_hash_blocks: Sequence[int]) -> None:
        self.capacity = list(capacity_hash_blocks)
        self._held: list[OrderedDict[int, None]] = [OrderedDict() for _ in self.capacity]

    def hit_blocks(self, instance_id: int, hash_ids: Sequence[int]) -> int:
        """Leading hash blocks of `hash_ids` the instance is thought to hold."""
        held = self._held[instance_id]
        count = 0
        for h in hash_ids:
            if h not in held:
                break
            count += 1
        return count

    def record(self, instance_id: int, hash_ids: Sequence[int]) -> None:
        """A request with these hashes goes to `instance_id`: its blocks will be cached."""
        held = self._held[instance_id]
        for h in hash_ids:
            held[h] = None
            held.move_to_end(h)
        while len(held) > self.capacity[instance_id]:
            held.popitem(last=False)

    def forget(self, instance_id: int) -> None:
        """An instance restarted or left: its cache is gone."""
        self._held[instance_id].clear()
