"""Load a model for the engine: a checkpoint (a `.gguf` file, the default model, or a Hugging
Face directory with `config.json` and safetensors weights), or a named random-initialised
shape.

A checkpoint's weights go through the shared weight file (`weight_cache.py`): the first
process to load a checkpoint dequantizes it to float32 (the CPU engine's dtype) into one
file; every process maps that file, so workers share one copy. The model is built on the
meta device and the mapped tensors assigned to it, so no process allocates weights of its
own. Named models (`tiny`, `small`) are initialised from a seed (normal, std 0.02, as Hugging
Face does), so two processes with the same seed hold the same weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from pdserve.engine.checkpoint import ModelSource, resolve_model
from pdserve.engine.device import EngineDevice
from pdserve.engine.model import CausalLM, rope_inv_freq
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.engine.weight_cache import cache_dir, map_weights, source_key, write_weights


def load_model(name_or_path: str, seed: int = 0, where: EngineDevice | None = None
               ) -> tuple[CausalLM, TextTokenizer | None]:
    """`where`: build a named random model directly on that device in that dtype (an 8B
    shape does not fit a float32 host copy comfortably); its weights then come from the
    device's generator, so they equal the CPU's only on the CPU. Checkpoints load on the
    host and the engine places them (`device.place`)."""
    source = resolve_model(name_or_path)
    if source.kind == "named":
        return _random_model(source, seed, where or EngineDevice()), source.tokenizer
    state = map_weights(prepare_weights(source))
    model = _assemble(source, state)
    return model, source.tokenizer


def prepare_weights(source: ModelSource) -> Path:
    """The shared float32 weight file of a checkpoint, written on first use."""
    files = _weight_files(source)
    try:
        return write_weights(source_key(files), _source_tensors(source, files))
    except OSError as err:
        raise ValueError(f"cannot write the shared weight file under {cache_dir()}: {err}; "
                         f"set PDSERVE_CACHE_DIR to a writable directory") from err


def _random_model(source: ModelSource, seed: int, where: EngineDevice) -> CausalLM:
    generator = torch.Generator(where.torch_device).manual_seed(seed)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(where.torch_dtype)
    try:
        with torch.device(where.torch_device):
            model = CausalLM(source.config)
    finally:
        torch.set_default_dtype(default_dtype)
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Embedding):
            with torch.no_grad():
                module.weight.normal_(0.0, 0.02, generator=generator)
    model.inv_freq = rope_inv_freq(source.config).to(where.torch_device)
    return model.eval()


def _assemble(source: ModelSource, state: dict[str, torch.Tensor]) -> CausalLM:
    config = source.config
    with torch.device("meta"):
        model = CausalLM(config)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = set(model.state_dict()) - ({"lm_head.weight"} if config.tie_word_embeddings
                                          else set())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"{source.location}: weights do not match the model's shape: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(model.get_parameter(name).shape):
            raise ValueError(f"{source.location}: {name} has shape {tuple(tensor.shape)}, the "
                             f"config implies {tuple(model.get_parameter(name).shape)}")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(config)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model.eval()


def _weight_files(source: ModelSource) -> list[Path]:
    if source.kind == "gguf":
        return [Path(source.location)]
    path = Path(source.location)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [path / shard for shard in shards]
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    raise ValueError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _source_tensors(source: ModelSource, files: list[Path]) -> Iterator[tuple[str,
                                                                               np.ndarray]]:
    if source.kind == "gguf":
        from pdserve.engine.gguf_file import GGUFCheckpoint

        yield from GGUFCheckpoint(files[0]).tensors()
        return
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="pt") as shard:
            for name in shard.keys():  # noqa: SIM118 (safe_open is not a mapping)
                yield name, shard.get_tensor(name).float().numpy()
