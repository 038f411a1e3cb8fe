"""Write small GGUF files the way llama.cpp's converter does (metadata keys, tensor names,
the Llama Q/K row permutation), from a random Hugging Face model and pdserve's shipped
byte-level tokenizer, for loader tests that need no download."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import torch

CHAT_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + "
                 "'<|end_of_text|>\\n' }}{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
_HF_TO_GGUF = {"input_layernorm.weight": "attn_norm.weight",
               "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight",
               "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.q_proj.bias": "attn_q.bias",
               "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
               "self_attn.o_proj.weight": "attn_output.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{_HF_TO_GGUF[rest]}"


def permute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation: rotate-half rows (2, pair) -> interleaved (pair, 2)."""
    half = weight.shape[0] // heads // 2
    return (weight.reshape(heads, 2, half, *weight.shape[1:]).swapaxes(1, 2)
            .reshape(weight.shape))


def shipped_vocabulary() -> tuple[list[str], list[str], list[int]]:
    raw = json.loads((resources.files("pdserve.data") / "tokenizer" / "tokenizer.json")
                     .read_text())
    vocab: dict[str, int] = raw["model"]["vocab"]
    tokens = [""] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in raw["model"]["merges"]]
    special = {t["content"] for t in raw["added_tokens"]}
    return tokens, merges, [3 if t in special else 1 for t in tokens]


def write_gguf(path: Path, model: torch.nn.Module, family: str, quant: str = "F32",
               architecture: str | None = None) -> Path:
    """`model` (a transformers Llama/Qwen2) as a GGUF file whose 2-D weights are `quant`."""
    import gguf
    from gguf import GGMLQuantizationType, quants

    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture or family)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    tokens, merges, types = shipped_vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_bos_token_id(tokens.index("<|begin_of_text|>"))
    writer.add_eos_token_id(tokens.index("<|end_of_text|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    kind = GGMLQuantizationType[quant]
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        values = tensor.float().numpy()
        if family == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = (config.num_attention_heads if "q_proj" in name
                     else config.num_key_value_heads)
            values = permute_rotary_rows(values, heads)
        if values.ndim == 2 and kind != GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), quants.quantize(values, kind), raw_dtype=kind)
        else:
            writer.add_tensor(gguf_name(name), values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
