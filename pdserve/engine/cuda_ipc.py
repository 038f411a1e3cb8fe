"""A GPU KV pool shared with the other processes on its node through CUDA IPC (issue 15
part 4): the pool's owner publishes an IPC handle of its block tensor in a small named
shared-memory segment (the pool's name, so peers find it as they find a host pool); a peer
opens the handle once and then copies blocks GPU to GPU, with no host copy on either side.

The handle is the one torch's own multiprocessing passes for a CUDA tensor
(`torch.multiprocessing.reductions.reduce_tensor`), pickled. It is published once per pool,
so torch keeps the owner's storage alive for the pool's (the process's) lifetime, which it
has anyway. Engines in one process (tests) cannot open their own handle: a pool published
here is found in `_PUBLISHED` instead. A peer's copies run on its own stream;
`copy_aligned` waits for them before the peer reports the hand-off done, so the owner never
reuses blocks a copy still reads.
`bench/gpu_check.py handoff` measures this against pinned host staging (docs/results/gpu.md).
"""

from __future__ import annotations

import pickle
import struct
from multiprocessing import shared_memory

import torch
from torch.multiprocessing.reductions import reduce_tensor

MAGIC = b"PDSERVE-CUDA-IPC"  # a segment holding a handle, not host blocks
_LENGTH = struct.Struct("!I")
SEGMENT_BYTES = 4096
_PUBLISHED: dict[str, torch.Tensor] = {}  # name -> this process's published tensor


def publish(tensor: torch.Tensor, name: str) -> shared_memory.SharedMemory:
    """Create segment `name` holding `tensor`'s IPC handle; the caller owns (unlinks) it."""
    if not tensor.is_cuda:
        raise ValueError("only a CUDA tensor has an IPC handle")
    rebuild, args = reduce_tensor(tensor)
    record = pickle.dumps((rebuild, args))
    if len(MAGIC) + _LENGTH.size + len(record) > SEGMENT_BYTES:
        raise ValueError(f"CUDA IPC handle of {len(record)} bytes does not fit its segment")
    segment = shared_memory.SharedMemory(name=name, create=True, size=SEGMENT_BYTES)
    segment.buf[:len(MAGIC)] = MAGIC
    start = len(MAGIC) + _LENGTH.size
    segment.buf[len(MAGIC):start] = _LENGTH.pack(len(record))
    segment.buf[start:start + len(record)] = record
    _PUBLISHED[name] = tensor
    return segment


def withdraw(name: str) -> None:
    """The owner closes the pool published as `name`."""
    _PUBLISHED.pop(name, None)


def is_handle(segment: shared_memory.SharedMemory) -> bool:
    return segment.size >= len(MAGIC) and bytes(segment.buf[:len(MAGIC)]) == MAGIC


def open_handle(name: str, segment: shared_memory.SharedMemory) -> torch.Tensor:
    """The owner's tensor, mapped into this process (on the owner's GPU)."""
    if name in _PUBLISHED:
        return _PUBLISHED[name]
    start = len(MAGIC) + _LENGTH.size
    (length,) = _LENGTH.unpack(bytes(segment.buf[len(MAGIC):start]))
    rebuild, args = pickle.loads(bytes(segment.buf[start:start + length]))
    return rebuild(*args)


def register_pinned(tensor: torch.Tensor) -> bool:
    """Page-lock a host tensor (a shared-memory mirror) so copies to and from a GPU run at
    full PCIe speed; False where there is no GPU or the driver refuses."""
    if not torch.cuda.is_available() or tensor.is_cuda:
        return False
    result = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(),
                                                  tensor.numel() * tensor.element_size(), 0)
    return int(result) == 0
