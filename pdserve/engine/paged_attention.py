"""Attention that reads the paged KV pool where it is, with no gather (issue 29 part 2).

The gather paths (`model.py`'s decode attention, `batched_prefill.py`) first copy each
sequence's blocks into contiguous K and V tensors, then run a masked SDPA; on an H100 that
costs 2.6-13x a paged kernel's time (docs/results/gpu.md). Here PyTorch's FlexAttention
(`torch.nn.attention.flex_attention`) reads the pool in place, steered by a block mask.

**The pool as one strided sequence per layer.** The pool is FlowKV's layout, [blocks, layers,
2 (K, V), block_size, kv_heads, dim]. Seen as rows of kv_heads x dim elements, block b's keys
of layer l are rows b * R + 2 * l * bs + [0, bs) and its values the next bs rows (bs: tokens
per block; R = 2 * layers * bs rows per block). So layer l's keys are one strided view
[1, kv_heads, N, dim] that starts at row 2 * l * bs, its values the same view bs rows later,
and block b's keys are the view's rows [b * R, b * R + bs): its (b * 2 * layers)-th tile of
bs rows. The other rows (other layers, values) are never attended to:

- the block mask (`BlockMask`, KV tiles of bs rows, query tiles of `QUERY_TILE`) lists, per
  sequence and query tile, the tiles of the sequence's blocks that every query of the tile
  sees whole (`full_kv_*`) and those at the causal edge (`kv_*`), where `mask_mod` decides
  key by key (`tiles`);
- `mask_mod` is exact on its own (eager FlexAttention evaluates it on every key of the view):
  a key is visible iff its row holds this layer's keys (offset < bs), its block is the
  sequence's j-th (`logical[block] == j` and `tables[row, j] == block`), and its position
  j * bs + offset is at most the query's.

`logical` is one tensor per pool, [blocks + 1]: each block's index in the sequences of the
step that hold it, scattered at every forward (the last entry takes the padding of the
tables). A block shared by several sequences (a prefix-cache entry, a session's history)
holds the same positions in each, since what is shared is a prefix; an entry left from an
earlier step is harmless, because `tables` must agree with it.

Two calls per layer, as the gather paths make: the decodes as a batch of one-query rows, and
the prefill chunks padded to the longest chunk (`batched_prefill.py`'s rows). Everything is
built on the device from the batch's tables inside the forward, so a captured decode graph
(`decode_graphs.py`) replays it. On the CPU FlexAttention runs eagerly (dense over the whole
view: tests and small pools only; the engine's CPU default stays the gather path); on a GPU
it is compiled, and the block mask's sparsity makes it paged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from pdserve.engine.batched_prefill import PrefillPadding, pad_queries, unpad_outputs
from pdserve.engine.kv_pool import PagedKVPool

QUERY_TILE = 128  # queries per tile of the block mask (FlexAttention's default)


def wanted(path: str) -> bool:
    """Whether an engine reads the pool in place (`EngineDevice.attention`): `flex` does,
    `gather` never. `auto` keeps the gather path for now on every device: on the CPU it is
    faster (eager FlexAttention is dense over the pool), and on a GPU the compiled path has
    not been measured yet (docs/results/gpu.md says what to run)."""
    return path == "flex"


@dataclass
class Tiles:
    """A call's block-mask tiles in `BlockMask.from_kv_blocks`' shapes ([rows, 1, tiles,
    ...]), KV tiles numbered in the layer view's tiles of bs rows."""

    partial_count: torch.Tensor  # [rows, 1, tiles]
    partial: torch.Tensor  # [rows, 1, tiles, width]
    full_count: torch.Tensor
    full: torch.Tensor


def tiles(tables: torch.Tensor, blocks: torch.Tensor, first_position: torch.Tensor,
          query_len: int, block_size: int, tiles_per_block: int, width: int = 0) -> Tiles:
    """Each row's blocks (`tables[row, :blocks[row]]`, in order) sorted, per query tile, into
    those the tile's every query sees whole (the block ends at or before the tile's first
    position) and those at its causal edge (the rest up to the tile's last position).
    Padding queries past a row's own count see up to their position like real ones.
    `width`: the index tensors' last size, at least the tables' (the CPU's compiled kernel
    wants one entry per KV tile of the view)."""
    tables = F.pad(tables, (0, max(0, width - tables.shape[1])))
    rows, width = tables.shape
    count = (query_len + QUERY_TILE - 1) // QUERY_TILE
    device = tables.device
    start = first_position.unsqueeze(1) + QUERY_TILE * torch.arange(count, device=device)
    end = start + QUERY_TILE - 1  # [rows, tiles]: the tile's first and last positions
    held = blocks.unsqueeze(1)
    full = torch.minimum((start + 1) // block_size, held)
    edge = torch.minimum(end // block_size + 1, held) - full
    kv = tables * tiles_per_block  # a block's first tile in the view
    full_ids = kv.unsqueeze(1).expand(rows, count, width)
    at = (full.unsqueeze(2) + torch.arange(width, device=device)).clamp(max=width - 1)
    edge_ids = torch.gather(kv.unsqueeze(1).expand(rows, count, width), 2, at)
    return Tiles(edge.unsqueeze(1).int(), edge_ids.unsqueeze(1).int(),
                 full.unsqueeze(1).int(), full_ids.unsqueeze(1).int())


MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def mask_mod(logical: torch.Tensor, tables: torch.Tensor, blocks: torch.Tensor,
             first_position: torch.Tensor, block_size: int, rows_per_block: int) -> MaskMod:
    """Key `kv` visible to query `q` of row `b` (see the module's docstring)."""
    last = tables.shape[1] - 1

    def visible(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                kv: torch.Tensor) -> torch.Tensor:
        block, offset = kv // rows_per_block, kv % rows_per_block
        j = logical[block]
        held = ((offset < block_size) & (j >= 0) & (j < blocks[b])
                & (tables[b, j.clamp(0, last)] == block))
        return held & (j * block_size + offset <= first_position[b] + q)

    return visible


class PagedAttention:
    """One engine's in-place attention over its pool: the per-layer views, the pool's
    `logical` index (this object its only writer) and the attention function, compiled on
    a GPU (`compile=None`: compile off the CPU)."""

    def __init__(self, pool: PagedKVPool, compile: bool | None = None) -> None:
        data = pool.data
        blocks, layers, _, block_size, kv_heads, dim = pool.shape
        self.block_size = block_size
        self.tiles_per_block = 2 * layers  # tiles of bs rows per block in a layer's view
        self.rows_per_block = self.tiles_per_block * block_size
        row = kv_heads * dim
        length = ((blocks - 1) * self.tiles_per_block + 1) * block_size  # N
        size, stride = (1, kv_heads, length, dim), (length * row, dim, row, 1)

        def view(first_row: int) -> torch.Tensor:
            return data.as_strided(size, stride, data.storage_offset() + first_row * row)

        self.views = [(view(2 * layer * block_size), view((2 * layer + 1) * block_size))
                      for layer in range(layers)]
        self.logical = torch.full((blocks + 1,), -1, dtype=torch.long, device=data.device)
        on_cpu = data.device.type == "cpu"
        compile = not on_cpu if compile is None else compile
        # the CPU's compiled kernel (tests) fails to build with dynamic shapes (torch 2.13)
        # and wants the index tensors as wide as the view's KV tiles
        self.attend_fn = (torch.compile(flex_attention, dynamic=not on_cpu, fullgraph=True)
                          if compile else flex_attention)
        self.index_width = length // block_size if compile and on_cpu else 0

    def step(self, tables: list[torch.Tensor], contexts: list[torch.Tensor]) -> None:
        """Scatter the step's block indices into `logical` (padding entries of a table,
        past its context, go to the spare last entry)."""
        spare = self.logical.shape[0] - 1
        for table, context in zip(tables, contexts, strict=True):
            position = torch.arange(table.shape[1], device=table.device)
            held = position < self.blocks_of(context).unsqueeze(1)
            at = torch.where(held, table, spare)
            self.logical.scatter_(0, at.reshape(-1),
                                  position.expand_as(table).reshape(-1))

    def blocks_of(self, context: torch.Tensor) -> torch.Tensor:
        return (context + self.block_size - 1) // self.block_size

    def call(self, tables: torch.Tensor, context: torch.Tensor, first_position: torch.Tensor,
             query_len: int) -> BlockMask:
        """The block mask of one call: rows with their tables and context, queries from
        `first_position` on."""
        blocks = self.blocks_of(context)
        cut = tiles(tables, blocks, first_position, query_len, self.block_size,
                    self.tiles_per_block, self.index_width)
        length = self.views[0][0].shape[2]
        return BlockMask.from_kv_blocks(
            cut.partial_count, cut.partial, cut.full_count, cut.full,
            BLOCK_SIZE=(QUERY_TILE, self.block_size),
            mask_mod=mask_mod(self.logical, tables, blocks, first_position, self.block_size,
                              self.rows_per_block),
            seq_lengths=(query_len, length), compute_q_blocks=False)

    def attend(self, query: torch.Tensor, mask: BlockMask, layer: int) -> torch.Tensor:
        """query [rows, heads, queries, dim] -> the same shape."""
        keys, values = self.views[layer]
        return self.attend_fn(query, keys, values, block_mask=mask, enable_gqa=True)


@dataclass
class PagedStep:
    """A forward's masks (built once, used by every layer) over the engine's attention."""

    attention: PagedAttention
    decodes: int
    decode_mask: BlockMask | None
    prefill: PrefillPadding | None
    prefill_mask: BlockMask | None

    @classmethod
    def build(cls, attention: PagedAttention, decodes: int,
              decode_tables: torch.Tensor | None, decode_context: torch.Tensor | None,
              prefill: PrefillPadding | None) -> PagedStep:
        tables, contexts = [], []
        decode_mask = prefill_mask = None
        if decodes:
            assert decode_tables is not None and decode_context is not None
            tables.append(decode_tables)
            contexts.append(decode_context)
        if prefill is not None:
            tables.append(prefill.tables)
            contexts.append(prefill.context)
        attention.step(tables, contexts)
        if decodes:
            decode_mask = attention.call(decode_tables, decode_context, decode_context - 1, 1)
        if prefill is not None:
            prefill_mask = attention.call(prefill.tables, prefill.context, prefill.prior,
                                          prefill.longest)
        return cls(attention, decodes, decode_mask, prefill, prefill_mask)

    def attend(self, q: torch.Tensor, layer: int) -> torch.Tensor:
        """q: [tokens, heads, dim], the decodes' first -> [tokens, heads * dim]."""
        outputs = []
        heads, dim = q.shape[1], q.shape[2]
        if self.decode_mask is not None:
            query = q[:self.decodes].unsqueeze(2)  # [decodes, heads, 1, dim]
            out = self.attention.attend(query, self.decode_mask, layer)
            outputs.append(out.reshape(self.decodes, heads * dim))
        if self.prefill is not None:
            assert self.prefill_mask is not None
            query = pad_queries(q[self.decodes:], self.prefill)
            out = self.attention.attend(query, self.prefill_mask, layer)
            outputs.append(unpad_outputs(out, self.prefill))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)
