"""A sequence and its KV moving between instances (a mixin of `Engine`): `export` describes
a sequence's KV for a hand-off; `adopt` creates the sequence on the receiving engine with
blocks for it; `import_from` adopts and copies the KV from the sender's mapped pool (aligned
runs, `transfer.copy_aligned`), taking over a session's history kept here and copying only
what is new; `import_history` keeps a session's history read from another worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.sessions import HistoryRef, SessionKVStore
from pdserve.engine.transfer import KVHandoff, copy_aligned
from pdserve.instance.segments import SegmentAllocator
from pdserve.types import blocks_for

if TYPE_CHECKING:
    from pdserve.engine.engine import Sequence


class EngineHandoffs:
    # the engine's
    sequences: dict[int, Sequence]
    pool: PagedKVPool
    allocator: SegmentAllocator
    sessions: SessionKVStore
    add: Callable[..., int]
    _grow: Callable[[Sequence, int], None]
    _reuse_history: Callable[..., tuple[int, list[int]]]

    def export(self, request_id: int) -> KVHandoff:
        sequence = self.sequences[request_id]
        self.pool.stage(sequence.blocks[:blocks_for(sequence.computed_tokens)])  # a GPU's
        return KVHandoff(request_id, tuple(sequence.token_ids), sequence.prompt_tokens,
                         sequence.computed_tokens, sequence.params,
                         tuple(sequence.blocks[:blocks_for(sequence.computed_tokens)]),
                         self.pool.shared_name)

    def adopt(self, handoff: KVHandoff) -> list[int]:
        """Create the sequence of a hand-off with blocks for its KV (not yet filled);
        returns those blocks, in order, for the copy."""
        prompt = handoff.token_ids[:handoff.prompt_tokens]
        self.add(handoff.request_id, list(prompt), handoff.params,
                 handoff.token_ids[handoff.prompt_tokens:])
        sequence = self.sequences[handoff.request_id]
        self._grow(sequence, handoff.computed_tokens)
        sequence.computed_tokens = handoff.computed_tokens
        return sequence.blocks

    def import_history(self, ref: HistoryRef, source: PagedKVPool) -> int:
        """Copy a session's history from another worker's pool and keep it here, so the
        session's request prefilled here next computes only its new tokens; returns the
        copy operations."""
        blocks = self.allocator.allocate(len(ref.blocks))
        copies = copy_aligned(source, self.pool, list(ref.blocks), blocks)
        self.sessions.adopt(ref, blocks)
        return copies

    def import_from(self, handoff: KVHandoff, source: PagedKVPool,
                    session_id: int = -1) -> int:
        """Adopt a sequence and copy its KV from a mapped source pool; returns copies.
        With a session whose history is kept here, the history's blocks are taken over and
        only the blocks from the first new token on are copied."""
        if session_id < 0 or session_id not in self.sessions:
            blocks = self.adopt(handoff)
            return copy_aligned(source, self.pool, list(handoff.blocks), blocks)
        prompt = handoff.token_ids[:handoff.prompt_tokens]
        self.add(handoff.request_id, list(prompt), handoff.params,
                 handoff.token_ids[handoff.prompt_tokens:])
        sequence = self.sequences[handoff.request_id]
        tokens, sequence.blocks = self._reuse_history(session_id, handoff.token_ids,
                                                      handoff.computed_tokens)
        self._grow(sequence, handoff.computed_tokens)
        sequence.computed_tokens = handoff.computed_tokens
        first = tokens // self.pool.block_size  # a partial block is copied whole
        return copy_aligned(source, self.pool, list(handoff.blocks)[first:],
                            sequence.blocks[first:])
