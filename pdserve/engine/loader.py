"""Load a model: a Hugging Face checkpoint directory, or a named random-initialised one.

A checkpoint directory has `config.json`, weights in `model.safetensors` or shards listed in
`model.safetensors.index.json`, and usually `tokenizer.json`. Named models (`tiny`, `small`)
are initialised from a seed (normal, std 0.02, as Hugging Face does), so two processes with
the same seed hold the same weights. Weights are float32 (the CPU engine's dtype).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from pdserve.engine.config import ModelConfig, named_config
from pdserve.engine.model import CausalLM
from pdserve.engine.tokenizer import TextTokenizer


def load_model(name_or_path: str, seed: int = 0) -> tuple[CausalLM, TextTokenizer | None]:
    path = Path(name_or_path)
    if path.is_dir():
        return _load_checkpoint(path)
    tokenizer = TextTokenizer.shipped()
    config = named_config(name_or_path, tokenizer.vocab_size, tokenizer.eos_token_ids)
    generator = torch.Generator().manual_seed(seed)
    model = CausalLM(config)
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            with torch.no_grad():
                module.weight.normal_(0.0, 0.02, generator=generator)
    return model.eval(), tokenizer


def _load_checkpoint(path: Path) -> tuple[CausalLM, TextTokenizer | None]:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a Hugging Face checkpoint: no config.json")
    config = ModelConfig.from_hf(json.loads(config_file.read_text()))
    state: dict[str, torch.Tensor] = {}
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for shard in shards:
            state.update(load_file(str(path / shard)))
    elif (path / "model.safetensors").is_file():
        state = load_file(str(path / "model.safetensors"))
    else:
        raise ValueError(f"{path}: no model.safetensors or model.safetensors.index.json")
    model = CausalLM(config)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {name: tensor.float() for name, tensor in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not match the config: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    tokenizer_file = path / "tokenizer.json"
    tokenizer = (TextTokenizer.from_file(tokenizer_file, config.eos_token_ids)
                 if tokenizer_file.is_file() else None)
    return model.eval(), tokenizer
