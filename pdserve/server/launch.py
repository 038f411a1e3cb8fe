"""Assemble a live server from a flat `ServeConfig`: tokenizer, performance model (a file,
or a quick profile of the engine at start, as Arrow profiles its instances), the policy from
the same presets the simulator uses, the driver and the HTTP app. Logs each start-up step
(`pdserve.server` logger): model, profile, workers (from the app's start), listening."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace

from fastapi import FastAPI

from pdserve.engine.chat_template import ChatTemplate
from pdserve.engine.checkpoint import resolve_model
from pdserve.engine.config import ModelConfig
from pdserve.engine.device import resolve_device
from pdserve.engine.loader import prepare_weights
from pdserve.instance.decode_forecast import ForecastSettings
from pdserve.live.driver import LiveDriver
from pdserve.live.processes import WorkerSettings
from pdserve.live.ray_cluster import RaySettings
from pdserve.perf.fitted import PerfModel
from pdserve.policies.ares.settings import AresSettings
from pdserve.policies.flowkv.settings import FlowKVSettings
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicySetup
from pdserve.policies.taichi.settings import TaiChiSettings
from pdserve.server.app import DEFAULT_MAX_BODY_BYTES, ServerSettings, create_app
from pdserve.types import KV_BLOCK_TOKENS, SLO
from pdserve.worker.forecast import check_live_predictor


@dataclass
class ServeConfig:
    model: str = ""  # "": SmolLM2-135M-Instruct (engine/checkpoint.py); tiny; .gguf; a dir
    instances: int = 4
    policy: str = "colocated"
    prefill: int = 2  # disaggregated presets
    decode: int = 2
    reserve: int = 0  # flowkv: instances held back for elastic scaling (workers stopped)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str = ""
    kv_blocks: int = 0  # 0: as many as fit in kv_cache_mib, at most MAX_AUTO_KV_BLOCKS
    kv_cache_mib: int = 512
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
    chat_template: str = ""  # a Jinja file; "": the checkpoint's own (else the generic layout)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    prefix_block_tokens: int = 16  # tokens per prefix-cache hash in the workers; 0: none
    taichi: TaiChiSettings = field(default_factory=TaiChiSettings)  # --policy taichi
    flowkv: FlowKVSettings = field(default_factory=FlowKVSettings)  # --policy flowkv
    rebalancer: str = ""  # "" keeps the policy's; ares | reschedule-current | none
    ares_predictor: str = "history"  # history | noisy:mae=N | hidden-state:PATH (no oracle)
    ares_interval_s: float = 1.0  # between the ares rebalancer's rounds (Alg. 1 line 3)
    ray: RaySettings | None = None  # --ray: workers in Ray actors (live/ray_workers.py)
    device: str = "auto"  # the engines': auto (CUDA when present), cpu, cuda, cuda:N
    dtype: str = "auto"  # auto: bfloat16 on a GPU, float32 on the CPU

    def __post_init__(self) -> None:
        for name in ("instances", "prefill", "decode", "kv_cache_mib", "chunk_size_tokens",
                     "max_batch_size", "max_outstanding", "ttft_slo_s", "tpot_slo_s",
                     "monitor_interval_s", "max_body_bytes", "ares_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"serve option {name!r} must be positive, got "
                                 f"{getattr(self, name)!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"serve option 'port' must be a TCP port, got {self.port}")
        if self.reserve < 0 or (self.reserve and self.policy != "flowkv"):
            raise ValueError(f"serve option 'reserve' ({self.reserve}) needs --policy flowkv "
                             f"and must not be negative")
        if self.kv_blocks < 0:
            raise ValueError(f"serve option 'kv_blocks' must not be negative, got "
                             f"{self.kv_blocks}")
        if self.prefix_block_tokens < 0 or self.prefix_block_tokens % 16:
            raise ValueError(f"serve option 'prefix_block_tokens' must be a multiple of 16 "
                             f"(0: no prefix cache), got {self.prefix_block_tokens}")
        if self.rebalancer not in ("", "ares", "reschedule-current", "none"):
            raise ValueError(f"serve option 'rebalancer' must be ares, reschedule-current or "
                             f"none, got {self.rebalancer!r}")
        check_live_predictor(self.ares_predictor)
        if self.max_model_len < 0:
            raise ValueError(f"serve option 'max_model_len' must not be negative, got "
                             f"{self.max_model_len}")


log = logging.getLogger("pdserve.server")
MAX_AUTO_KV_BLOCKS = 2048


def kv_blocks_for(config: ServeConfig, model: ModelConfig, element_bytes: int = 4) -> int:
    """The configured KV blocks per worker, or as many as fit in `kv_cache_mib` with KV
    elements of `element_bytes` (the engines' dtype: 2 for bfloat16, 4 for float32)."""
    if config.kv_blocks:
        return config.kv_blocks
    block_bytes = model.kv_elements_per_token * element_bytes * KV_BLOCK_TOKENS
    return max(1, min(MAX_AUTO_KV_BLOCKS, (config.kv_cache_mib << 20) // block_bytes))


def build_app(config: ServeConfig) -> FastAPI:
    started = time.monotonic()
    served = resolve_model(config.model)
    served.require_tokenizer()
    context = served.config.max_position_embeddings
    if config.max_model_len:
        if config.max_model_len > context:
            raise ValueError(f"--max-model-len {config.max_model_len} exceeds the model's "
                             f"context of {context} tokens")
        context = config.max_model_len
    template = served.chat_template
    if config.chat_template:
        template = ChatTemplate.from_file(config.chat_template, template.bos_token,
                                          template.eos_token)
    log.info("model %s (%s): context %d tokens, vocabulary %d, chat template %s, stop "
             "tokens %s", served.name, served.location, context, served.config.vocab_size,
             template.origin, list(served.config.eos_token_ids))
    weights_identity = config.model or served.name
    if served.kind != "named":
        weights = prepare_weights(served)
        weights_identity = weights.stem
        log.info("weights: %s (shared by every worker, %.0f MB)", weights,
                 weights.stat().st_size / 1e6)
    element_bytes = resolve_device(config.device, config.dtype).element_bytes
    kv_blocks = kv_blocks_for(config, served.config, element_bytes)
    log.info("KV cache: %d blocks of %d tokens per worker (%.0f MiB)", kv_blocks, KV_BLOCK_TOKENS,
             kv_blocks * KV_BLOCK_TOKENS * served.config.kv_elements_per_token
             * element_bytes / (1 << 20))
    if config.perf_model:
        perf = PerfModel.load(config.perf_model)
        log.info("performance model loaded from %s", config.perf_model)
    else:
        from pdserve.engine.profile_cache import start_up_profile

        log.info("performance model: the quick start-up profile (--perf-model skips it)")
        perf, origin = start_up_profile(config.model, weights_identity, kv_blocks,
                                        lambda message: log.info("  profile: %s", message))
        log.info("profile %s (%.1fs since start)", origin, time.monotonic() - started)
    policy, count = build_policy(config.policy, PolicySetup(
        perf, SLO(config.ttft_slo_s, config.tpot_slo_s), instances=config.instances,
        prefill=config.prefill, decode=config.decode, reserve=config.reserve,
        chunk_size_tokens=config.chunk_size_tokens, max_batch_size=config.max_batch_size,
        flowkv=replace(config.flowkv, prefix_block_tokens=config.prefix_block_tokens or 16),
        taichi=config.taichi, rebalancer=config.rebalancer,
        ares=AresSettings(interval_s=config.ares_interval_s,
                          forecast=ForecastSettings(predictor=config.ares_predictor,
                                                    seed=config.seed))))
    sharing = count if config.ray is None else max(1, round(1 / (config.ray.gpus_per_worker
                                                                 or 1)))  # workers per GPU
    where = resolve_device(config.device, config.dtype, workers_per_gpu=sharing)
    log.info("engines on %s in %s%s", where.device, where.dtype,
             f", {where.memory_fraction:.0%} of the GPU each" if where.memory_fraction else "")
    driver = LiveDriver(policy, count, served.require_tokenizer(), WorkerSettings(
        config.model, config.seed, kv_blocks, config.chunk_size_tokens,
        config.max_batch_size, policy.phase_priority.value, config.prefix_block_tokens,
        queue_order=policy.queue_order, perf=perf, decode_forecast=policy.decode_forecast,
        device=where), config.monitor_interval_s, config.max_outstanding, config.ray)
    return create_app(driver, ServerSettings(
        config.served_model_name or served.name, context, served.config.vocab_size,
        config.api_key or None, config.max_body_bytes, template,
        f"http://{config.host}:{config.port}"))
