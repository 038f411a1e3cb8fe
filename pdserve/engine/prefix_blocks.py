"""The block ids behind the local scheduler's prefix cache, for a live engine.

The scheduler's `PrefixCache` decides what is cached and evicted (block counts); the engine
follows its events with a `PrefixBlocks`: an entry takes the block ids a finished prefill
donates (`donate`), hands them to a prefill that hits it (`hit`, counting the tokens
reused), and gives them back for the allocator to free when evicted (`evict`). The ids are
kept by `instance.prefix_cache.CachedBlockIds`, the code the simulator runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from pdserve.instance.prefix_cache import CachedBlockIds


class PrefixBlocks:
    def __init__(self, block_tokens: int, kv_block_size: int) -> None:
        """`block_tokens`: tokens per cache entry (a multiple of the pool's
        `kv_block_size` tokens per KV block)."""
        self.ids = CachedBlockIds(block_tokens // kv_block_size)
        self.kv_block_size = kv_block_size
        self.hit_tokens_total = 0  # prompt tokens taken from the cache

    def evict(self, hashes: Sequence[int]) -> list[list[int]]:
        """Forget evicted entries; returns their block ids (one list per entry) to free."""
        return self.ids.evict(hashes)

    def donate(self, block_hash: int, sequence_blocks: list[int], index: int) -> int:
        """Entry `block_hash` takes the blocks of hash index `index` of a sequence's blocks;
        returns how many leading blocks of the sequence the cache owns from now on."""
        self.ids.donate(block_hash, sequence_blocks, index)
        return (index + 1) * self.ids.per_entry

    def hit(self, hash_ids: Sequence[int]) -> list[int]:
        """The cached blocks of a prefix hit, in order (the cache keeps owning them)."""
        blocks = self.ids.hit(hash_ids)
        self.hit_tokens_total += len(blocks) * self.kv_block_size
        return blocks
