"""Read a GGUF checkpoint (llama.cpp's format): the model's shape from its metadata, and its
tensors dequantized to float32 under Hugging Face parameter names.

Architectures: `llama` and `qwen2` (the families the engine runs). Tensor types: F32, F16,
BF16, and the block quantisations the `gguf` library dequantizes in numpy (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0 and the K-quants Q2_K..Q6_K); anything else is refused with the tensor's name.

llama.cpp's converter permutes the rows of a Llama model's Q and K projections so that
rotary pairs are adjacent (GPT-J style); the engine rotates halves (Hugging Face style), so
those rows are permuted back here. Qwen2 files are written without that permutation. A file
without `output.weight` ties the LM head to the embeddings.

Not supported, refused with a clear error: a `rope_freqs` tensor (Llama 3.1's frequency
factors) and rope scaling other than none or linear.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pdserve.engine.config import ModelConfig

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2")
SUPPORTED_GGUF_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K",
                        "Q3_K", "Q4_K", "Q5_K", "Q6_K")

_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
                   "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def hf_tensor_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no place in a Llama/Qwen2 model")


def unpermute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: within each head, rows come as (pair, 2)
    interleaved; the rotate-half layout wants (2, pair)."""
    rows = weight.shape[0]
    half = rows // heads // 2
    return (weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


class GGUFCheckpoint:
    """One `.gguf` file, memory-mapped; tensors are dequantized one at a time on demand."""

    def __init__(self, path: str | Path) -> None:
        try:
            import gguf
        except ImportError as err:  # a declared dependency; only a broken install lacks it
            raise ValueError("reading .gguf files needs the `gguf` package "
                             "(pip install gguf)") from err
        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(f"no such GGUF file: {self.path}")
        try:
            self._reader = gguf.GGUFReader(str(self.path))
        except Exception as err:  # a truncated or foreign file
            raise ValueError(f"{self.path} is not a readable GGUF file: {err}") from err
        self.metadata: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue
            self.metadata[key] = field.contents()
        self.architecture = str(self.metadata.get("general.architecture", ""))
        if self.architecture not in SUPPORTED_GGUF_ARCHITECTURES:
            raise ValueError(f"{self.path.name}: architecture {self.architecture!r} is not "
                             f"supported (pdserve runs "
                             f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)})")
        self._tensors = {t.name: t for t in self._reader.tensors}
        if "rope_freqs.weight" in self._tensors:
            raise ValueError(f"{self.path.name}: rope frequency factors (rope_freqs, as in "
                             f"Llama 3.1) are not supported")
        for tensor in self._tensors.values():
            kind = tensor.tensor_type.name
            if kind not in SUPPORTED_GGUF_TYPES:
                raise ValueError(f"{self.path.name}: tensor {tensor.name} is {kind}, which "
                                 f"pdserve cannot dequantize (supported: "
                                 f"{', '.join(SUPPORTED_GGUF_TYPES)})")

    def _field(self, name: str, default: Any = None) -> Any:
        value = self.metadata.get(f"{self.architecture}.{name}", default)
        if value is None:
            raise ValueError(f"{self.path.name}: metadata {self.architecture}.{name} is missing")
        return value

    def model_config(self) -> ModelConfig:
        heads = int(self._field("attention.head_count"))
        hidden = int(self._field("embedding_length"))
        tokens = self.metadata.get("tokenizer.ggml.tokens") or []
        rope: dict[str, Any] = {}
        scaling = self.metadata.get(f"{self.architecture}.rope.scaling.type", "none")
        if scaling == "linear":
            rope = {"rope_type": "linear",
                    "factor": float(self._field("rope.scaling.factor"))}
        elif scaling not in ("none", ""):
            raise ValueError(f"{self.path.name}: rope scaling {scaling!r} is not supported")
        eos = self.metadata.get("tokenizer.ggml.eos_token_id")
        bos = self.metadata.get("tokenizer.ggml.bos_token_id")
        return ModelConfig(
            vocab_size=int(self.metadata.get(f"{self.architecture}.vocab_size", len(tokens))),
            hidden_size=hidden, intermediate_size=int(self._field("feed_forward_length")),
            num_layers=int(self._field("block_count")), num_heads=heads,
            num_kv_heads=int(self._field("attention.head_count_kv", heads)),
            head_dim=int(self._field("attention.key_length",
                                     self._field("rope.dimension_count", hidden // heads))),
            rms_norm_eps=float(self._field("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(self._field("rope.freq_base", 10000.0)), rope_scaling=rope,
            max_position_embeddings=int(self._field("context_length", 4096)),
            tie_word_embeddings="output.weight" not in self._tensors,
            attention_bias="blk.0.attn_q.bias" in self._tensors,
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=() if eos is None else (int(eos),), family=self.architecture)

    def tensor_names(self) -> list[str]:
        return [hf_tensor_name(name) for name in self._tensors]

    def tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(Hugging Face name, float32 array) for every tensor, in file order."""
        from gguf import quants

        config = self.model_config()
        for name, tensor in self._tensors.items():
            values = np.asarray(quants.dequantize(tensor.data, tensor.tensor_type),
                                dtype=np.float32)
            if self.architecture == "llama" and name.endswith(("attn_q.weight",
                                                                "attn_k.weight")):
                heads = config.num_heads if "attn_q" in name else config.num_kv_heads
                values = unpermute_rotary_rows(values, heads)
            yield hf_tensor_name(name), values
