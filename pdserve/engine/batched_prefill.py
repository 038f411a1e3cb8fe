"""All of a step's prefill chunks in one attention call (the GPU's path; issue 15 part 4).

Eagerly, each prefill chunk attends in its own call, so a step with m chunks launches m
attention kernels (plus their gathers and masks) per layer: on a GPU that is host time, not
GPU work. Here the chunks are padded to the longest chunk's queries and the longest context's
blocks, and attend in one masked call per layer:

  queries   [m, heads, n_max, dim]   chunk c's i-th new token at row c * n_max + i (`slots`)
  keys      [m, kv_heads, blocks_max * block_size, dim]   gathered from the pool's tables
  mask      key j visible to query i of chunk c  iff  j <= prior_c + i
            (prior_c = context_c - new_c: causal, offset by the chunk's prior context)

Padding queries see keys up to their own (out-of-range) position, all finite (padding
blocks point at block 0), and their outputs are dropped (`slots`). On the CPU one call per
chunk stays faster (torch's fused causal kernel without a mask, no padding), so the engine
batches only on a GPU and only with two chunks or more (`wanted`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pdserve.engine.kv_pool import PagedKVPool


@dataclass
class PrefillPadding:
    """Index tensors of a step's prefill chunks, built on the host (`pad`)."""

    tables: torch.Tensor  # [m, blocks_max] block ids, zero-padded
    prior: torch.Tensor  # [m] tokens before each chunk
    context: torch.Tensor  # [m] tokens with KV once the chunk is in: prior + new
    slots: torch.Tensor  # [sum of new] padded row of each packed prefill token
    longest: int  # n_max

    def to(self, device: torch.device) -> PrefillPadding:
        return PrefillPadding(self.tables.to(device, non_blocking=True),
                              self.prior.to(device, non_blocking=True),
                              self.context.to(device, non_blocking=True),
                              self.slots.to(device, non_blocking=True), self.longest)


def wanted(device: torch.device, chunks: int) -> bool:
    return device.type != "cpu" and chunks >= 2


def pad(new_tokens: list[int], contexts: list[int], tables: list[torch.Tensor]) -> PrefillPadding:
    longest, width = max(new_tokens), max(len(table) for table in tables)
    padded = torch.zeros(len(tables), width, dtype=torch.long)
    for row, table in enumerate(tables):
        padded[row, :len(table)] = table
    slots = torch.cat([row * longest + torch.arange(new)
                       for row, new in enumerate(new_tokens)])
    prior = torch.tensor([context - new for new, context in zip(new_tokens, contexts,
                                                                strict=True)])
    return PrefillPadding(padded, prior, torch.tensor(contexts), slots, longest)


def pad_queries(q: torch.Tensor, padding: PrefillPadding) -> torch.Tensor:
    """The chunks' packed queries [sum of new, heads, dim] in padded rows:
    [m, heads, n_max, dim] (padding queries are zero)."""
    chunks, heads, dim = padding.tables.shape[0], q.shape[1], q.shape[2]
    queries = q.new_zeros(chunks * padding.longest, heads, dim)
    queries[padding.slots] = q
    return queries.view(chunks, padding.longest, heads, dim).transpose(1, 2)


def unpad_outputs(out: torch.Tensor, padding: PrefillPadding) -> torch.Tensor:
    """Attention outputs [m, heads, n_max, dim] back to the packed tokens:
    [sum of new, heads * dim]."""
    chunks, heads, _, dim = out.shape
    return out.transpose(1, 2).reshape(chunks * padding.longest, heads * dim)[padding.slots]


def attention(q: torch.Tensor, padding: PrefillPadding, pool: PagedKVPool,
              layer: int) -> torch.Tensor:
    """q: [sum of new, heads, dim] (the chunks' queries, packed) -> [sum of new, heads * dim]."""
    chunks, dim = padding.tables.shape[0], q.shape[2]
    kv_heads = pool.shape[-2]
    keys, values = pool.gather(layer, padding.tables)  # [m, blocks, block, kv_heads, dim]
    keys = keys.view(chunks, -1, kv_heads, dim).transpose(1, 2)
    values = values.view(chunks, -1, kv_heads, dim).transpose(1, 2)
    queries = pad_queries(q, padding)
    query_pos = padding.prior.unsqueeze(1) + torch.arange(padding.longest, device=q.device)
    key_pos = torch.arange(keys.shape[2], device=q.device)
    mask = key_pos.view(1, 1, -1) <= query_pos.unsqueeze(2)  # [m, n_max, keys]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask.unsqueeze(1),
                                         enable_gqa=True)  # [m, heads, n_max, dim]
    return unpad_outputs(out, padding)
