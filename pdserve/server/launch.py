"""Assemble a live server from a flat `ServeConfig`: tokenizer, performance model (a file,
or a quick profile of the engine at start, as Arrow profiles its instances), the policy from
the same presets the simulator uses, the driver and the HTTP app. Logs each start-up step
(`pdserve.server` logger): model, profile, workers (from the app's start), listening."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI

from pdserve.engine.config import ModelConfig
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.live.driver import LiveDriver
from pdserve.live.processes import WorkerSettings
from pdserve.perf.fitted import PerfModel
from pdserve.policies.presets import PolicySetup, build_policy
from pdserve.policies.taichi.settings import TaiChiSettings
from pdserve.server.app import DEFAULT_MAX_BODY_BYTES, ServerSettings, create_app
from pdserve.server.chat_template import ChatTemplate
from pdserve.types import SLO


@dataclass
class ServeConfig:
    model: str = "tiny"
    instances: int = 4
    policy: str = "colocated"
    prefill: int = 2  # disaggregated presets
    decode: int = 2
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str = ""
    kv_blocks: int = 2048
    chunk_size_tokens: int = 512
    max_batch_size: int = 64
    max_outstanding: int = 256
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.2
    perf_model: str = ""  # a `pdserve profile` file; "" profiles quickly at start
    monitor_interval_s: float = 0.5
    seed: int = 0
    served_model_name: str = ""  # "" : the model's name (a checkpoint: its directory name)
    max_model_len: int = 0  # 0: the model's context
    chat_template: str = ""  # a Jinja file; "": the generic layout
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    taichi: TaiChiSettings = field(default_factory=TaiChiSettings)  # --policy taichi

    def __post_init__(self) -> None:
        for name in ("instances", "prefill", "decode", "kv_blocks", "chunk_size_tokens",
                     "max_batch_size", "max_outstanding", "ttft_slo_s", "tpot_slo_s",
                     "monitor_interval_s", "max_body_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"serve option {name!r} must be positive, got "
                                 f"{getattr(self, name)!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"serve option 'port' must be a TCP port, got {self.port}")
        if self.max_model_len < 0:
            raise ValueError(f"serve option 'max_model_len' must not be negative, got "
                             f"{self.max_model_len}")


log = logging.getLogger("pdserve.server")


@dataclass(frozen=True)
class ServedModel:
    tokenizer: TextTokenizer
    context_tokens: int
    vocab_size: int
    name: str
    bos_token: str = ""
    eos_token: str = ""


def served_model(model: str) -> ServedModel:
    """The tokenizer, context length, vocabulary and served name of a named model or a
    checkpoint directory (its `config.json`)."""
    path = Path(model)
    if path.is_dir():
        config = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"{path} has no tokenizer.json; the server needs one")
        tokenizer = TextTokenizer.from_file(path / "tokenizer.json", config.eos_token_ids)
        special = _special_tokens(path)
        return ServedModel(tokenizer, config.max_position_embeddings, config.vocab_size,
                           path.name, special.get("bos_token", ""), special.get("eos_token", ""))
    from pdserve.engine.config import named_config

    tokenizer = TextTokenizer.shipped()
    config = named_config(model, tokenizer.vocab_size, tokenizer.eos_token_ids)
    return ServedModel(tokenizer, config.max_position_embeddings, config.vocab_size, model,
                       "<|begin_of_text|>", "<|end_of_text|>")


def _special_tokens(path: Path) -> dict[str, str]:
    """bos/eos token text from a checkpoint's tokenizer_config.json (for chat templates)."""
    file = path / "tokenizer_config.json"
    if not file.is_file():
        return {}
    raw = json.loads(file.read_text())
    found = {}
    for key in ("bos_token", "eos_token"):
        value = raw.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            found[key] = value
    return found


def build_app(config: ServeConfig) -> FastAPI:
    started = time.monotonic()
    served = served_model(config.model)
    context = served.context_tokens
    if config.max_model_len:
        if config.max_model_len > context:
            raise ValueError(f"--max-model-len {config.max_model_len} exceeds the model's "
                             f"context of {context} tokens")
        context = config.max_model_len
    template = (ChatTemplate.from_file(config.chat_template, served.bos_token, served.eos_token)
                if config.chat_template else ChatTemplate())
    log.info("model %s: context %d tokens, vocabulary %d, chat template %s", config.model,
             context, served.vocab_size, config.chat_template or "generic")
    if config.perf_model:
        perf = PerfModel.load(config.perf_model)
        log.info("performance model loaded from %s", config.perf_model)
    else:
        from pdserve.engine.profile import QUICK_GRID, profile_engine

        log.info("profiling the engine (quick grid; --perf-model skips this)")
        perf = profile_engine(config.model, config.kv_blocks, QUICK_GRID,
                              lambda message: log.info("  profile: %s", message))
        log.info("profile done in %.1fs", time.monotonic() - started)
    policy, count = build_policy(config.policy, PolicySetup(
        perf, SLO(config.ttft_slo_s, config.tpot_slo_s), instances=config.instances,
        prefill=config.prefill, decode=config.decode,
        chunk_size_tokens=config.chunk_size_tokens, max_batch_size=config.max_batch_size,
        taichi=config.taichi))
    driver = LiveDriver(policy, count, served.tokenizer, WorkerSettings(
        config.model, config.seed, config.kv_blocks, config.chunk_size_tokens,
        config.max_batch_size), config.monitor_interval_s, config.max_outstanding)
    return create_app(driver, ServerSettings(
        config.served_model_name or served.name, context, served.vocab_size,
        config.api_key or None, config.max_body_bytes, template,
        f"http://{config.host}:{config.port}"))
