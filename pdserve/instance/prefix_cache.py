"""An instance's prefix cache: KV blocks kept after their request is done, keyed by chained
block hashes, reused by later prompts that start the same way (FlowKV sec. 3.2, "global
cache prefix matches"; the mechanism of vLLM's automatic prefix caching).

A hash covers `block_tokens` prompt tokens (Mooncake's `hash_ids`: 512; the live engine
hashes its own token blocks) and so `block_tokens / 16` KV blocks of the local scheduler.
Hash i of a prompt depends on every token before it (a chain), so equal hashes mean equal
prefixes.

Counting, as the local scheduler counts memory:
  referenced  an entry some request uses: its blocks are in use, once however many share it
  cached      an entry no request uses: its blocks count as free (cache memory competes with
              running requests) but keep their content until memory is needed; `trim` evicts
              least recently used entries whenever the free blocks no longer cover them
A prefill looks its prompt up when it is admitted: the leading hits (at most all but one
token: `usable_hit_blocks`) are referenced and not computed, so the prefill computes only
the suffix. When its prefill completes, the prompt's full blocks join the cache (a block
another request cached meanwhile stops the chain: the first copy stays). A request that
ends, is preempted or hands its KV off releases its entries, tail first, so a chain's tail
is evicted before its head.

What the local scheduler calls: `reuse` (admission), `donate` (prefill done),
`release_entries` (its KV freed), `trim` (after a plan takes memory, and before a lookup).
The cache counts entries, not free memory: `reuse` and `release_entries` return the blocks
that leave or join the free pool, and the local scheduler hands them to its `KVBudget`
(`instance/kv_budget.py`), the only writer of the free-block count.

A multi-step span reserves its later steps' blocks at once, so it evicts when it starts
what a step-by-step run evicts step by step (or, if the span is cut, not at all): the one
place the simulator's fast advance can differ from a step-by-step run.
An owner of real block ids (the engine, the simulator's block table) follows the cache with
`CachedBlockIds` and the events it records (`track_events`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from pdserve.types import KV_BLOCK_TOKENS, Request


def usable_hit_blocks(hit_blocks: int, input_tokens: int, block_tokens: int) -> int:
    """Hash blocks a prefill may reuse: at least one prompt token is always computed (its
    position samples the first output token), so a prompt that hits entirely recomputes
    its last block."""
    return max(0, min(hit_blocks, (input_tokens - 1) // block_tokens))


class PrefixCache:
    def __init__(self, block_tokens: int, track_events: bool = False) -> None:
        if block_tokens < KV_BLOCK_TOKENS or block_tokens % KV_BLOCK_TOKENS:
            raise ValueError(f"prefix block_tokens must be a multiple of {KV_BLOCK_TOKENS}, "
                             f"got {block_tokens}")
        self.block_tokens = block_tokens
        self.kv_blocks_per_entry = block_tokens // KV_BLOCK_TOKENS
        self._refs: dict[int, int] = {}  # hash -> requests using it
        self._cached: OrderedDict[int, None] = OrderedDict()  # unused entries, LRU first
        self.track_events = track_events  # for an owner of block ids (engine, sim table)
        self.evicted: list[int] = []  # hashes evicted since the owner last took them
        self.donated: list[tuple[int, int, int]] = []  # (request id, hash index, hash)
        self.hit_tokens_total = 0
        self.lookup_tokens_total = 0
        self.evictions_total = 0

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._refs

    def __len__(self) -> int:
        return len(self._refs)

    @property
    def cached_blocks(self) -> int:
        """KV blocks of unused entries (counted as free by the local scheduler)."""
        return len(self._cached) * self.kv_blocks_per_entry

    def lookup(self, hash_ids: Sequence[int]) -> int:
        count = 0
        for block_hash in hash_ids:
            if block_hash not in self._refs:
                break
            count += 1
        return count

    def acquire(self, hash_ids: Sequence[int]) -> int:
        """Reference entries; returns the KV blocks that leave the free pool (entries that
        were unused)."""
        revived = 0
        for block_hash in hash_ids:
            if self._refs[block_hash] == 0:
                del self._cached[block_hash]
                revived += 1
            self._refs[block_hash] += 1
        return revived * self.kv_blocks_per_entry

    def release(self, hash_ids: Sequence[int]) -> int:
        """Drop one reference from each entry, tail first; returns the KV blocks that
        become free (entries now unused, still cached)."""
        freed = 0
        for block_hash in reversed(hash_ids):
            self._refs[block_hash] -= 1
            if self._refs[block_hash] == 0:
                self._cached[block_hash] = None
                freed += 1
        return freed * self.kv_blocks_per_entry

    def insert(self, block_hash: int) -> bool:
        """A new entry used by the request that computed it; False if one exists."""
        if block_hash in self._refs:
            return False
        self._refs[block_hash] = 1
        return True

    def trim(self, free_blocks: int) -> None:
        """Evict unused entries, least recently used first, until the free blocks cover
        the ones still cached."""
        per_entry = self.kv_blocks_per_entry
        while self._cached and len(self._cached) * per_entry > free_blocks:
            block_hash, _ = self._cached.popitem(last=False)
            del self._refs[block_hash]
            self.evictions_total += 1
            if self.track_events:
                self.evicted.append(block_hash)

    def take_events(self) -> tuple[list[int], list[tuple[int, int, int]]]:
        """(evicted hashes, donated (request id, hash index, hash)) since the last call."""
        events = self.evicted, self.donated
        self.evicted, self.donated = [], []
        return events

    # ---- a request's entries (the local scheduler's calls) ----
    def reuse(self, request: Request, free_blocks: int) -> tuple[int, int]:
        """At admission: reference the cached entries the prompt starts with (after
        trimming to `free_blocks`), recorded in `request.cached_blocks`. Returns (entries
        hit, KV blocks that leave the free pool); the prefill skips the hit entries' tokens.
        Only for a request with `hash_ids` that references nothing yet and has computed
        nothing."""
        self.trim(free_blocks)
        self.lookup_tokens_total += request.prefill_target_tokens
        hits = usable_hit_blocks(self.lookup(request.hash_ids), request.prefill_target_tokens,
                                 self.block_tokens)
        if not hits:
            return 0, 0
        taken = self.acquire(request.hash_ids[:hits])
        request.cached_blocks = hits
        self.hit_tokens_total += hits * self.block_tokens
        return hits, taken

    def donate(self, request: Request) -> None:
        """Prefill done: the prompt's full blocks join the cache, still used by `request`."""
        if not request.hash_ids:
            return
        full = min(len(request.hash_ids), request.input_tokens // self.block_tokens)
        while request.cached_blocks < full and self.insert(request.hash_ids[request.cached_blocks]):
            if self.track_events:
                self.donated.append((request.request_id, request.cached_blocks,
                                     request.hash_ids[request.cached_blocks]))
            request.cached_blocks += 1

    def release_entries(self, request: Request) -> int:
        """The request's KV is freed, all its `kv_blocks` counted as free: the cached ones
        are not its own, so they are taken back and its references released instead.
        Returns that change to the free blocks: minus its entries' blocks, plus those of
        the entries no request uses now."""
        cached = request.cached_blocks
        request.cached_blocks = 0
        return self.release(request.hash_ids[:cached]) - cached * self.kv_blocks_per_entry


def chain_hashes(token_ids: Sequence[int], block_tokens: int) -> tuple[int, ...]:
    """Chained hashes of a prompt's full blocks of `block_tokens` tokens (Python's hash of
    ints and tuples is not salted, so every process agrees)."""
    hashes: list[int] = []
    previous = 0
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        previous = hash((previous, tuple(token_ids[start:start + block_tokens])))
        hashes.append(previous)
    return tuple(hashes)


class CachedBlockIds:
    """Which block ids each cached entry holds, for an owner of ids that follows a
    `PrefixCache`: entries take a request's ids when it donates them, hand them to a
    request that hits, and give them back to the allocator when evicted."""

    def __init__(self, kv_blocks_per_entry: int) -> None:
        self.per_entry = kv_blocks_per_entry
        self.ids: dict[int, list[int]] = {}

    def donate(self, block_hash: int, request_blocks: list[int], index: int) -> None:
        self.ids[block_hash] = request_blocks[index * self.per_entry:(index + 1) * self.per_entry]

    def hit(self, hash_ids: Sequence[int]) -> list[int]:
        try:
            return [block for h in hash_ids for block in self.ids[h]]
        except KeyError as err:
            raise RuntimeError(f"prefix hash {err} is cached but holds no block ids") from None

    def evict(self, hashes: Sequence[int]) -> list[list[int]]:
        """Ids of evicted entries, to free (one list per entry)."""
        return [self.ids.pop(h) for h in hashes if h in self.ids]
