"""Model shapes: Hugging Face `config.json` (Llama and Qwen2 families) or a named preset.

Named presets are randomly initialised and use the byte-level BPE tokenizer shipped with
pdserve, so nothing is downloaded:
  tiny   hidden 256, 4 layers, 4 heads, 2 KV heads
  small  hidden 1024, 8 layers, 16 heads, 4 KV heads
  llama-3.1-8b  Llama-3.1-8B's shape (for profiling a GPU; initialised on the device)
Rotary scaling: "default", "linear" and "llama3" are supported, read from either
`rope_scaling` + `rope_theta` (transformers 4) or `rope_parameters` (transformers 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
SUPPORTED_ROPE = {"default", "linear", "llama3"}


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # empty: default rope
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    family: str = "llama"

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        kind = self.rope_scaling.get("rope_type", "default")
        if kind not in SUPPORTED_ROPE:
            raise ValueError(f"rope scaling {kind!r} is not supported (supported: "
                             f"{', '.join(sorted(SUPPORTED_ROPE))})")

    @property
    def kv_elements_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim  # K and V

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_elements_per_token * 4  # float32, the CPU engine's dtype

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        architectures = raw.get("architectures") or []
        family = next((SUPPORTED_ARCHITECTURES[a] for a in architectures
                       if a in SUPPORTED_ARCHITECTURES), raw.get("model_type"))
        if family not in ("llama", "qwen2"):
            raise ValueError(f"unsupported model: architectures {architectures}, model_type "
                             f"{raw.get('model_type')!r}; pdserve runs Llama and Qwen2 models")
        rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", raw.get("rope_theta", 10000.0)))
        if "type" in rope and "rope_type" not in rope:
            rope["rope_type"] = rope.pop("type")
        if rope.get("rope_type") == "default":
            rope = {}
        heads = int(raw["num_attention_heads"])
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]), num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=theta,
            rope_scaling=rope,
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", family == "qwen2")),
            bos_token_id=raw.get("bos_token_id"), eos_token_ids=eos_ids, family=family)


def named_config(name: str, vocab_size: int, eos_token_ids: tuple[int, ...]) -> ModelConfig:
    shapes = {
        "tiny": dict(hidden_size=256, intermediate_size=688, num_layers=4, num_heads=4,
                     num_kv_heads=2),
        "small": dict(hidden_size=1024, intermediate_size=2816, num_layers=8, num_heads=16,
                      num_kv_heads=4),
        # the papers' shape, for profiling a GPU (random weights: initialise on the device)
        "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_layers=32,
                             num_heads=32, num_kv_heads=8, rope_theta=500000.0,
                             vocab_size=128256),
    }
    if name not in shapes:
        raise ValueError(f"unknown model {name!r}: a named model ({', '.join(shapes)}) or a "
                         f"Hugging Face checkpoint directory")
    shape: dict[str, Any] = {"vocab_size": vocab_size, **shapes[name]}
    return ModelConfig(head_dim=shape["hidden_size"] // shape["num_heads"],
                       max_position_embeddings=8192, eos_token_ids=eos_token_ids, **shape)
