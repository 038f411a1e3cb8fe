"""Assemble a live server from a flat `ServeConfig`: tokenizer, performance model (a file,
or a quick profile of the engine at start, as Arrow profiles its instances), the policy from
the same presets the simulator uses, the driver and the HTTP app."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI

from pdserve.engine.config import ModelConfig
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.live.driver import LiveDriver
from pdserve.live.processes import WorkerSettings
from pdserve.perf.fitted import PerfModel
from pdserve.policies.presets import PolicySetup, build_policy
from pdserve.server.app import create_app
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

    def __post_init__(self) -> None:
        for name in ("instances", "prefill", "decode", "kv_blocks", "chunk_size_tokens",
                     "max_batch_size", "max_outstanding", "ttft_slo_s", "tpot_slo_s",
                     "monitor_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"serve option {name!r} must be positive, got "
                                 f"{getattr(self, name)!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"serve option 'port' must be a TCP port, got {self.port}")


def tokenizer_and_context(model: str) -> tuple[TextTokenizer, int, str]:
    """The tokenizer, context length and served name of a named model or checkpoint."""
    path = Path(model)
    if path.is_dir():
        config = ModelConfig.from_hf(json.loads((path / "config.json").read_text()))
        if not (path / "tokenizer.json").is_file():
            raise ValueError(f"{path} has no tokenizer.json; the server needs one")
        return (TextTokenizer.from_file(path / "tokenizer.json", config.eos_token_ids),
                config.max_position_embeddings, path.name)
    from pdserve.engine.config import named_config

    tokenizer = TextTokenizer.shipped()
    config = named_config(model, tokenizer.vocab_size, tokenizer.eos_token_ids)
    return tokenizer, config.max_position_embeddings, model


def build_app(config: ServeConfig) -> FastAPI:
    tokenizer, context, name = tokenizer_and_context(config.model)
    if config.perf_model:
        perf = PerfModel.load(config.perf_model)
    else:
        from pdserve.engine.profile import QUICK_GRID, profile_engine

        perf = profile_engine(config.model, config.kv_blocks, QUICK_GRID)
    policy, count = build_policy(config.policy, PolicySetup(
        perf, SLO(config.ttft_slo_s, config.tpot_slo_s), instances=config.instances,
        prefill=config.prefill, decode=config.decode,
        chunk_size_tokens=config.chunk_size_tokens, max_batch_size=config.max_batch_size))
    driver = LiveDriver(policy, count, tokenizer, WorkerSettings(
        config.model, config.seed, config.kv_blocks, config.chunk_size_tokens,
        config.max_batch_size), config.monitor_interval_s, config.max_outstanding)
    return create_app(driver, name, context, config.api_key or None)
