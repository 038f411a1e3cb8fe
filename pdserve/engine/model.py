"""A Llama/Qwen2-family decoder whose attention reads and writes a paged KV pool.

RMSNorm, rotary embeddings (Hugging Face rotate-half convention; default, linear and llama3
scaling), grouped-query attention, SwiGLU, optional q/k/v biases (Qwen2), tied or untied
embeddings. Module names equal the Hugging Face parameter names, so a checkpoint's state dict
loads as is.

One forward runs a packed batch: the new tokens of every sequence (prefill chunks after any
prior context, and single decode tokens) go through the linear layers together; attention
reads each sequence's blocks in the pool: in place (`paged_attention.py`, when the batch
carries the engine's `PagedAttention`), or gathered per sequence, the decodes in one padded
call and, on a GPU, the chunks in another (`batched_prefill.py`). It returns the last
position's logits and final hidden state (after the last norm) of every sequence, then those
of any extra rows asked for (prompt logprobs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pdserve.engine import batched_prefill
from pdserve.engine.batched_prefill import PrefillPadding
from pdserve.engine.config import ModelConfig
from pdserve.engine.elementwise import EAGER, Elementwise
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.paged_attention import PagedAttention, PagedStep


@dataclass
class ForwardBatch:
    """The first `num_decodes` sequences are single-token decodes; their attention runs as
    one padded call over `decode_tables` ([decodes, blocks], padding masked by context)."""

    token_ids: torch.Tensor  # [T] new tokens of all sequences, concatenated
    positions: torch.Tensor  # [T] their positions in their sequences
    new_tokens: list[int]  # per sequence
    context_tokens: list[int]  # per sequence: prior + new
    block_tables: list[torch.Tensor]  # per sequence: blocks holding its context, in order
    slot_blocks: torch.Tensor  # [T] block of each new token
    slot_offsets: torch.Tensor  # [T] offset in that block
    num_decodes: int = 0
    decode_tables: torch.Tensor | None = None  # [decodes, max blocks], zero-padded
    decode_context: torch.Tensor | None = None  # [decodes]
    extra_rows: torch.Tensor | None = None  # packed rows whose logits are also wanted
    last_rows: torch.Tensor | None = None  # each sequence's last packed row, when known on
    # the device (a captured decode graph: no host list may be read while capturing)
    prefill_padding: PrefillPadding | None = None  # the chunks attend in one call (a GPU's,
    # and always with `paged`)
    paged: PagedAttention | None = None  # attention reads the pool in place (the engine's)


def on_device(batch: ForwardBatch, device: torch.device) -> ForwardBatch:
    """The batch's index tensors on the model's device (built on the host)."""
    def move(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return None if tensor is None else tensor.to(device, non_blocking=True)

    return ForwardBatch(
        move(batch.token_ids), move(batch.positions), batch.new_tokens,  # type: ignore[arg-type]
        batch.context_tokens, [move(t) for t in batch.block_tables],  # type: ignore[misc]
        move(batch.slot_blocks), move(batch.slot_offsets),  # type: ignore[arg-type]
        batch.num_decodes, move(batch.decode_tables), move(batch.decode_context),
        move(batch.extra_rows), move(batch.last_rows),
        None if batch.prefill_padding is None else batch.prefill_padding.to(device),
        batch.paged)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64)
                                            .float() / dim))
    scaling = config.rope_scaling
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_context = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


@dataclass
class LayerContext:
    """What every layer of one forward reads besides its hidden states."""

    cos: torch.Tensor  # [T, 1, head_dim] rotary angles of the batch's positions
    sin: torch.Tensor
    batch: ForwardBatch
    pool: PagedKVPool
    paged: PagedStep | None  # attention in place over the pool, or None: gathered
    ops: Elementwise  # eager or fused (`elementwise.py`)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, ops: Elementwise = EAGER) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor,
            ops: Elementwise = EAGER) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual)."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = (config.num_heads, config.num_kv_heads,
                                                    config.head_dim)
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, context: LayerContext) -> torch.Tensor:
        tokens, batch, pool = x.shape[0], context.batch, context.pool
        q = self.q_proj(x).view(tokens, self.heads, self.head_dim)
        k = self.k_proj(x).view(tokens, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(tokens, self.kv_heads, self.head_dim)
        q, k = context.ops.rotary(q, k, context.cos, context.sin)
        pool.write(self.layer, batch.slot_blocks, batch.slot_offsets, k, v)
        if context.paged is not None:
            return self.o_proj(context.paged.attend(q, self.layer))
        outputs = []
        decodes = batch.num_decodes
        if decodes:
            outputs.append(self._decode_attention(q[:decodes], batch, pool))
        start = decodes
        if batch.prefill_padding is not None:
            outputs.append(batched_prefill.attention(q[decodes:], batch.prefill_padding, pool,
                                                     self.layer))
            return self.o_proj(torch.cat(outputs))
        for new, context, table in zip(batch.new_tokens[decodes:],
                                       batch.context_tokens[decodes:],
                                       batch.block_tables[decodes:], strict=True):
            keys, values = pool.read(self.layer, table, context)  # [context, kv_heads, dim]
            # 4-D [1, heads, tokens, dim] inputs take torch's fused CPU kernel (5x the 3-D
            # path); enable_gqa shares each KV head across its query heads without copies
            query = q[start:start + new].transpose(0, 1).unsqueeze(0)
            keys = keys.transpose(0, 1).unsqueeze(0)
            values = values.transpose(0, 1).unsqueeze(0)
            if new == context:  # a prefill with no prior context
                out = F.scaled_dot_product_attention(query, keys, values, is_causal=True,
                                                     enable_gqa=True)
            else:  # causal, offset by the prior context
                query_pos = torch.arange(context - new, context, device=q.device).unsqueeze(1)
                mask = torch.arange(context, device=q.device).unsqueeze(0) <= query_pos
                out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask,
                                                     enable_gqa=True)
            outputs.append(out[0].transpose(0, 1).reshape(new, self.heads * self.head_dim))
            start += new
        return self.o_proj(torch.cat(outputs))


    def _decode_attention(self, q: torch.Tensor, batch: ForwardBatch,
                          pool: PagedKVPool) -> torch.Tensor:
        """One query per sequence against its padded context, in a single call."""
        assert batch.decode_tables is not None and batch.decode_context is not None
        decodes, tables = q.shape[0], batch.decode_tables
        # one gather each for K and V ([d, n, block, kv_heads, dim], contiguous) and views
        keys, values = pool.gather(self.layer, tables)
        keys = keys.view(decodes, -1, self.kv_heads, self.head_dim)
        values = values.view(decodes, -1, self.kv_heads, self.head_dim)
        width = keys.shape[1]
        mask = torch.arange(width, device=q.device).unsqueeze(0) < \
            batch.decode_context.unsqueeze(1)
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=mask[:, None, None, :], enable_gqa=True)  # [d, heads, 1, dim]
        return out.reshape(decodes, self.heads * self.head_dim)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: Elementwise = EAGER) -> torch.Tensor:
        return self.down_proj(ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None,
                context: LayerContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it): the residual adds
        are fused into the next norm (`x + sublayer(norm(x))` as vLLM runs it)."""
        ops = context.ops
        if residual is None:  # the first layer: x is the embedding
            residual, h = x, self.input_layernorm(x, ops)
        else:
            h, residual = self.input_layernorm.add(x, residual, ops)
        h = self.self_attn(h, context)
        h, residual = self.post_attention_layernorm.add(h, residual, ops)
        return self.mlp(h, ops), residual


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = DecoderModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)
        self.elementwise = EAGER  # `use_elementwise`: eager or fused

    def use_elementwise(self, ops: Elementwise) -> None:
        """Run the elementwise work eagerly (`elementwise.EAGER`) or fused
        (`elementwise.fused()`)."""
        self.elementwise = ops

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, pool: PagedKVPool) -> tuple[torch.Tensor,
                                                                        torch.Tensor]:
        """(logits, hidden) at each sequence's last position, then at `extra_rows`."""
        freqs = batch.positions.float().unsqueeze(1) * self.inv_freq.unsqueeze(0)
        angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # [T, 1, head_dim]
        x = self.model.embed_tokens(batch.token_ids)
        paged = None if batch.paged is None else PagedStep.build(
            batch.paged, batch.num_decodes, batch.decode_tables, batch.decode_context,
            batch.prefill_padding)
        context = LayerContext(angles.cos().to(x.dtype), angles.sin().to(x.dtype), batch, pool,
                               paged, self.elementwise)
        residual = None
        for layer in self.model.layers:
            x, residual = layer(x, residual, context)
        rows = (batch.last_rows if batch.last_rows is not None
                else torch.tensor(batch.new_tokens, device=x.device).cumsum(0) - 1)
        if batch.extra_rows is not None:
            rows = torch.cat((rows, batch.extra_rows))
        x = x[rows] if residual is None else x[rows] + residual[rows]  # None: no layers (a
        # probe of the model's cost outside them)
        hidden = self.model.norm(x, self.elementwise)
        return self.lm_head(hidden), hidden
