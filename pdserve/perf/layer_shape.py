"""One decoder layer's shape on one GPU of a TP group, and the ops it is priced by.

The profiles (`profiles.py`) time one decoder layer op by op: four GEMMs (`GEMM_OPS`: fused
QKV, attention output, gated up-projection, down-projection) and the elementwise ops
(`STREAM_OPS`: norms, RoPE, activation, residual add, embedding). `LayerShape` gives each
op's dimensions on one GPU's shard, which the operator curves (`operators.py`) price and by
which the per-shape corrections (`residuals.py`) are keyed (`shape_key`). Attention was
profiled for one layout (Llama-70B at TP 2: 32 query heads and 4 KV heads per GPU, head dim
128); `LayerShape.q_head_scale` relates a layer to it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the profiled attention layout: Llama-70B shape at TP 2
PROFILED_Q_HEADS_PER_GPU = 32
PROFILED_KV_HEADS_PER_GPU = 4
PROFILED_HEAD_DIM = 128
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
STREAM_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add",
              "emb")

Number = float | np.ndarray


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One decoder layer's shape on one GPU of a TP group (arrays allowed, for profile rows)."""
    hidden: Number
    heads: Number
    kv_heads: Number
    head_dim: Number
    ffn: Number
    tp: Number

    def gemm_dims(self, op: str) -> tuple[Number, Number]:
        """(K, N) of the op's weight on one GPU; QKV and the gated up-projection are fused."""
        q = self.heads * self.head_dim / self.tp
        kv = self.kv_heads * self.head_dim / self.tp
        return {"attn_pre_proj": (self.hidden, q + 2 * kv), "attn_post_proj": (q, self.hidden),
                "mlp_up_proj": (self.hidden, 2 * self.ffn / self.tp),
                "mlp_down_proj": (self.ffn / self.tp, self.hidden)}[op]

    def stream_width(self, op: str) -> Number:
        return {"input_layernorm": self.hidden, "post_attention_layernorm": self.hidden,
                "attn_rope": (self.heads + self.kv_heads) * self.head_dim / self.tp,
                "mlp_act": 2 * self.ffn / self.tp, "add": self.hidden, "emb": self.hidden}[op]

    @property
    def q_head_scale(self) -> Number:
        return (self.heads / self.tp) * self.head_dim / (PROFILED_Q_HEADS_PER_GPU
                                                         * PROFILED_HEAD_DIM)

    @property
    def kv_bytes_per_token(self) -> Number:
        """K and V of one token in one layer on one GPU (16-bit)."""
        return 2 * (self.kv_heads / self.tp) * self.head_dim * 2


def shape_key(op: str, shape: LayerShape) -> np.ndarray:
    """The profiled layer shape an op ran in: hidden/heads/kv_heads/ffn/tp (an array of keys
    for arrays of profile rows). Whole-layer keys rather than the op's own dimensions: rows
    of equal op dimensions from different profiled models differ by a few per cent run to
    run, and each model's own rows describe it best."""
    parts = [np.round(np.asarray(value, dtype=float)).astype(int).astype(str)
             for value in (shape.hidden, shape.heads, shape.kv_heads, shape.ffn, shape.tp)]
    key = parts[0]
    for part in parts[1:]:
        key = np.char.add(np.char.add(key, "/"), part)
    return key
