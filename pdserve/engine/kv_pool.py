"""The paged KV pool, in FlowKV's layout: one tensor per instance,
[blocks, layers, 2 (K, V), block_size, kv_heads, head_dim], so a block holds every layer's
K and V contiguously and a run of consecutive blocks is one contiguous byte range (one copy
moves it). The tensor can live in named shared memory, set up once, so that another process
on the host maps it and copies blocks out without pickling anything.

A pool on a GPU (`device`) keeps its blocks there, in the engine's dtype. Named, it is
shared in one of two ways:
- CUDA IPC (the default; `cuda_ipc.py`): the segment of its name holds an IPC handle of the
  blocks, and a peer on the node copies from them GPU to GPU;
- staging (`staged=True`): a page-locked host mirror in shared memory (`mirror`): a sender
  copies a sequence's blocks into it (`stage`) before handing them off, and peers read them
  there (`host_run`). A staged pool on the CPU exercises this path without a GPU.
`bench/gpu_check.py handoff` measures the two (docs/results/gpu.md). A peer on another
node reads blocks through `host_run` either way.
"""

from __future__ import annotations

from multiprocessing import resource_tracker, shared_memory

import torch

from pdserve.engine import cuda_ipc
from pdserve.instance.segments import runs
from pdserve.types import KV_BLOCK_TOKENS


def attach_untracked(name: str) -> shared_memory.SharedMemory:
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
                 attach: bool = False, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", staged: bool = False) -> None:
        """`staged`: keep the blocks private and share a host mirror (on a GPU instead of
        CUDA IPC; on the CPU, to exercise the GPU's staging path)."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.shape = (num_blocks, num_layers, 2, block_size, kv_heads, head_dim)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.dtype = dtype
        numel = num_blocks * num_layers * 2 * block_size * kv_heads * head_dim
        self._shm: shared_memory.SharedMemory | None = None
        self._owner = False
        self.mirror: torch.Tensor | None = None  # host copy peers read (a GPU pool's)
        self._pinned_ptr = 0  # a page-locked host mapping to release at close
        on_host = torch.device(device).type == "cpu"
        if attach and not on_host:
            raise ValueError(f"a peer's pool is mapped on the host, not on {device}")
        if shared_name is None or staged or not on_host:
            self.data = torch.zeros(self.shape, dtype=dtype, device=device)
            if shared_name is None:
                return
            if not on_host and not staged:  # peers open the blocks through CUDA IPC
                self._shm = cuda_ipc.publish(self.data, shared_name)
                self._owner = True
                return
        if attach:
            self._shm = attach_untracked(shared_name)
        else:
            size = numel * torch.empty((), dtype=dtype).element_size()
            self._shm = shared_memory.SharedMemory(name=shared_name, create=True, size=size)
            self._owner = True
        host = torch.frombuffer(self._shm.buf, dtype=dtype, count=numel).view(self.shape)
        if staged or not on_host:
            self.mirror = host
            if not on_host:
                self.pin_host_mapping()
        else:
            self.data = host

    @classmethod
    def from_cuda_ipc(cls, name: str, segment: shared_memory.SharedMemory) -> PagedKVPool:
        """A peer's GPU pool opened through the IPC handle in its segment (read only)."""
        pool = cls.__new__(cls)
        pool.data = cuda_ipc.open_handle(name, segment)
        pool.shape = tuple(pool.data.shape)
        pool.num_blocks, pool.block_size = pool.shape[0], pool.shape[3]
        pool.dtype = pool.data.dtype
        pool.mirror, pool._pinned_ptr, pool._owner = None, 0, False
        pool._shm = segment
        return pool

    def pin_host_mapping(self) -> None:
        """Page-lock this process's mapping of the shared host blocks (a GPU pool's mirror,
        or a peer's mirror a GPU receiver maps), so GPU copies from it run at full speed."""
        host = self.mirror if self.mirror is not None else self.data
        if not self._pinned_ptr and not host.is_cuda and cuda_ipc.register_pinned(host):
            self._pinned_ptr = host.data_ptr()

    @property
    def shared_name(self) -> str | None:
        return self._shm.name if self._shm is not None else None

    @property
    def block_bytes(self) -> int:
        return self.data[0].numel() * self.data.element_size()

    def stage(self, blocks: list[int] | tuple[int, ...]) -> None:
        """Copy blocks into the host mirror, where peers read them (nothing to do when the
        pool itself is in shared memory)."""
        if self.mirror is not None:
            for start, count in runs(list(blocks)):
                self.mirror[start:start + count].copy_(self.data[start:start + count])

    def host_run(self, start: int, count: int) -> torch.Tensor:
        """Blocks [start, start + count) on the host: the pool's own, its mirror's, or a
        fresh copy of a GPU pool's (shared through IPC, it has no mirror)."""
        if self.mirror is not None:
            return self.mirror[start:start + count]
        return self.data[start:start + count].cpu()

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
        if self._pinned_ptr:
            torch.cuda.cudart().cudaHostUnregister(self._pinned_ptr)
        self.mirror = None
        self._shm.close()
        if self._owner:
            cuda_ipc.withdraw(self._shm.name)
            self._shm.unlink()
        self._shm = None
