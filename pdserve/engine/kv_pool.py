"""The paged KV pool, in FlowKV's layout: one tensor per instance,
[blocks, layers, 2 (K, V), block_size, kv_heads, head_dim], so a block holds every layer's
K and V contiguously and a run of consecutive blocks is one contiguous byte range (one copy
moves it). The tensor can live in named shared memory, set up once, so that another process
on the host maps it and copies blocks out without pickling anything.
"""

from __future__ import annotations

from multiprocessing import resource_tracker, shared_memory

import torch

from pdserve.types import KV_BLOCK_TOKENS


def _attach_untracked(name: str) -> shared_memory.SharedMemory:
    """Map an existing segment without registering it with this process's resource tracker.

    The creator owns (and unlinks) the segment. On Python < 3.13 attaching registers it too,
    and a tracker would then unlink it when the attaching process exits, or (when spawned
    processes share one tracker) fail when the creator unregisters it. 3.13's `track=False`
    does what this does."""
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register  # type: ignore[assignment]


class PagedKVPool:
    def __init__(self, num_blocks: int, num_layers: int, kv_heads: int, head_dim: int,
                 block_size: int = KV_BLOCK_TOKENS, shared_name: str | None = None,
                 attach: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.shape = (num_blocks, num_layers, 2, block_size, kv_heads, head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks
        numel = num_blocks * num_layers * 2 * block_size * kv_heads * head_dim
        self._shm: shared_memory.SharedMemory | None = None
        self._owner = False
        if shared_name is None:
            self.data = torch.zeros(self.shape, dtype=torch.float32)
            return
        if attach:
            self._shm = _attach_untracked(shared_name)
        else:
            self._shm = shared_memory.SharedMemory(name=shared_name, create=True, size=numel * 4)
            self._owner = True
        self.data = torch.frombuffer(self._shm.buf, dtype=torch.float32,
                                     count=numel).view(self.shape)

    @property
    def shared_name(self) -> str | None:
        return self._shm.name if self._shm is not None else None

    @property
    def block_bytes(self) -> int:
        return self.data[0].numel() * 4

    def write(self, layer: int, blocks: torch.Tensor, offsets: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor) -> None:
        self.data[blocks, layer, 0, offsets] = keys
        self.data[blocks, layer, 1, offsets] = values

    def read(self, layer: int, table: torch.Tensor, context_tokens: int) -> tuple[torch.Tensor,
                                                                                 torch.Tensor]:
        """(keys, values) of the first `context_tokens` positions: [context, kv_heads, dim]."""
        kv_heads, dim = self.shape[-2:]
        keys, values = self.gather(layer, table)
        return (keys.view(-1, kv_heads, dim)[:context_tokens],
                values.view(-1, kv_heads, dim)[:context_tokens])

    def gather(self, layer: int, table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of the blocks in `table` (any shape), each contiguous:
        [*table.shape, block_size, kv_heads, dim]. `index_select` over the flattened table
        (a quarter of the time of advanced indexing with mixed index types)."""
        flat = table.reshape(-1)
        shape = (*table.shape, *self.shape[3:])
        keys = torch.index_select(self.data[:, layer, 0], 0, flat).view(shape)
        values = torch.index_select(self.data[:, layer, 1], 0, flat).view(shape)
        return keys, values

    def run(self, start: int, count: int) -> torch.Tensor:
        """Blocks [start, start + count) as one contiguous tensor view."""
        return self.data[start:start + count]

    def close(self) -> None:
        """Drop this process's mapping; the creator also removes the segment."""
        if self._shm is None:
            return
        del self.data
        self._shm.close()
        if self._owner:
            self._shm.unlink()
        self._shm = None
