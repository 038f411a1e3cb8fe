"""Moving a sequence's KV between instances.

Same host: every instance's pool is shared under its name, set up once (host shared memory,
or a GPU pool's CUDA IPC handle); the receiver maps the sender's pool (`attach_pool`) and
copies runs of blocks straight from it. Before
copying, the two block lists are aligned (FlowKV's bidirectional segment alignment) so one
run that is consecutive on both sides is one copy. `copy_per_block` is the unaligned
baseline (one copy per block) the benchmark compares against.

Across hosts: `send_blocks` / `recv_blocks` stream the blocks' bytes over a TCP socket, one
send per source run and one receive loop per target run, with a small header that checks
both sides agree on the shape.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

import torch

from pdserve.engine import cuda_ipc
from pdserve.engine.allocator import align, runs
from pdserve.engine.kv_pool import PagedKVPool, attach_untracked
from pdserve.engine.sampling_params import SamplingParams

_HEADER = struct.Struct("!II")  # number of blocks, bytes per block


@dataclass(frozen=True)
class KVHandoff:
    """What a receiver needs to continue a sequence (small: no tensors)."""

    request_id: int
    token_ids: tuple[int, ...]
    prompt_tokens: int
    computed_tokens: int
    params: SamplingParams
    blocks: tuple[int, ...]  # on the sender, covering computed_tokens
    pool_name: str | None  # the sender's shared pool (sampling needs no state: it is a
    # pure function of the seed, the output index and the logits)


def attach_pool(name: str, like: PagedKVPool) -> PagedKVPool:
    """Map another process's shared pool of the same shape and dtype: a GPU pool's blocks
    through CUDA IPC, else the pool (or a GPU pool's staging mirror) on the host."""
    segment = attach_untracked(name)
    if cuda_ipc.is_handle(segment):
        peer = PagedKVPool.from_cuda_ipc(name, segment)
        if peer.shape != like.shape or peer.dtype != like.dtype:
            raise ValueError(f"peer pool {name} is {peer.shape} {peer.dtype}, this one is "
                             f"{like.shape} {like.dtype}")
        return peer
    segment.close()
    blocks, layers, _, block_size, kv_heads, head_dim = like.shape
    peer = PagedKVPool(blocks, layers, kv_heads, head_dim, block_size, shared_name=name,
                       attach=True, dtype=like.dtype)
    if like.data.is_cuda:  # a staged GPU peer: copy to this GPU from page-locked memory
        peer.pin_host_mapping()
    return peer


def copy_aligned(source: PagedKVPool, target: PagedKVPool, source_blocks: list[int],
                 target_blocks: list[int]) -> int:
    """Copy block i of the source list to block i of the target list; returns the number
    of copy operations (aligned runs)."""
    alignment = align(source_blocks, target_blocks)
    for src, dst, count in alignment:
        target.run(dst, count).copy_(source.run(src, count))
    if target.data.is_cuda:  # done before the sender may reuse the blocks
        torch.cuda.current_stream(target.data.device).synchronize()
    return len(alignment)


def copy_per_block(source: PagedKVPool, target: PagedKVPool, source_blocks: list[int],
                   target_blocks: list[int]) -> int:
    for src, dst in zip(source_blocks, target_blocks, strict=True):
        target.run(dst, 1).copy_(source.run(src, 1))
    return len(source_blocks)


def _bytes_of(pool: PagedKVPool, start: int, count: int) -> memoryview:
    return memoryview(pool.host_run(start, count).view(torch.uint8).numpy()).cast("B")


def send_blocks(sock: socket.socket, pool: PagedKVPool, blocks: list[int]) -> int:
    sock.sendall(_HEADER.pack(len(blocks), pool.block_bytes))
    source_runs = runs(blocks)
    for start, count in source_runs:
        sock.sendall(_bytes_of(pool, start, count))
    return len(source_runs)


def recv_blocks(sock: socket.socket, pool: PagedKVPool, blocks: list[int]) -> int:
    header = recv_exact(sock, _HEADER.size)
    count, block_bytes = _HEADER.unpack(header)
    if count != len(blocks) or block_bytes != pool.block_bytes:
        raise ValueError(f"KV stream of {count} blocks of {block_bytes} bytes does not match "
                         f"{len(blocks)} blocks of {pool.block_bytes} bytes here")
    target_runs = runs(blocks)
    for start, length in target_runs:
        view = _bytes_of(pool, start, length)
        received = 0
        while received < len(view):
            got = sock.recv_into(view[received:])
            if got == 0:
                raise ConnectionError("KV stream ended early")
            received += got
    return len(target_runs)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Exactly `size` bytes from `sock`; ConnectionError if the peer closes first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("KV stream ended early")
        data += chunk
    return data
