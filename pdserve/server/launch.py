"""Assemble a live server from the config tree (`pdserve.config.Config`): tokenizer,
performance model, the policy from the same presets the simulator uses, the driver and the
HTTP app. Logs each start-up step (`pdserve.server` logger): model, profile, workers (from
the app's start), listening, and where the served tokenizer is kept in the Hugging Face format
(`engine/tokenizer.py: hf_tokenizer_dir`, for clients such as guidellm).

The performance model is `--perf-model`'s file, else the quick start-up profile of the
engine (as Arrow profiles its instances) kept in the cache, else the server starts at once
on a provisional model (`engine/provisional_model.py`: conservative) while the start-up
profile is measured in the background (`engine/background_profile.py`, started once the
workers are up); when it is ready the driver switches the policy and the workers to it
(`LiveDriver.use_perf_model`), and `/health` says which model is in use."""

from __future__ import annotations

import logging
import time
from functools import partial

from fastapi import FastAPI

from pdserve.config import Config, EngineConfig
from pdserve.engine.background_profile import BackgroundProfile, Measure
from pdserve.engine.chat_template import ChatTemplate
from pdserve.engine.checkpoint import resolve_model
from pdserve.engine.config import ModelConfig
from pdserve.engine.device import resolve_device
from pdserve.engine.loader import prepare_weights
from pdserve.engine.profile_cache import background_start_up_profile, cached_profile
from pdserve.engine.provisional_model import provisional_model
from pdserve.engine.tokenizer import hf_tokenizer_dir
from pdserve.live.driver import LiveDriver
from pdserve.live.processes import WorkerSettings
from pdserve.live.status import PROFILED, PROVISIONAL, PerfModelState
from pdserve.perf.fitted import PerfModel
from pdserve.policies.presets import build_policy
from pdserve.policies.setup import PolicySetup
from pdserve.server.app import ServerSettings, create_app
from pdserve.types import KV_BLOCK_TOKENS
from pdserve.worker.forecast import check_live_predictor


def check_serve(config: Config) -> None:
    """What serving needs of a config beyond its sections' own checks."""
    cluster = config.cluster
    if not isinstance(cluster.instances, int):
        raise ValueError(f"config field 'cluster.instances' must be a count of worker "
                         f"processes to serve, got {cluster.instances!r}")
    if cluster.reserve and config.policy.name != "flowkv":
        raise ValueError(f"config field 'cluster.reserve' ({cluster.reserve}) needs policy "
                         f"flowkv")
    if config.instance.prefix_block_tokens < 0:
        raise ValueError(f"config field 'instance.prefix_block_tokens' must be a multiple of "
                         f"16 (0: no prefix cache) to serve, got "
                         f"{config.instance.prefix_block_tokens}")
    check_live_predictor(config.policy.ares.forecast.predictor)


log = logging.getLogger("pdserve.server")
MAX_AUTO_KV_BLOCKS = 2048


def kv_blocks_for(engine: EngineConfig, model: ModelConfig, element_bytes: int = 4) -> int:
    """The configured KV blocks per worker, or as many as fit in `kv_cache_mib` with KV
    elements of `element_bytes` (the engines' dtype: 2 for bfloat16, 4 for float32)."""
    if engine.kv_blocks:
        return engine.kv_blocks
    block_bytes = model.kv_elements_per_token * element_bytes * KV_BLOCK_TOKENS
    return max(1, min(MAX_AUTO_KV_BLOCKS, (engine.kv_cache_mib << 20) // block_bytes))


def build_app(config: Config, measure: Measure = background_start_up_profile) -> FastAPI:
    """The server `config` describes. `measure(model_spec, weights_identity, kv_blocks,
    progress=...)` is the start-up profile the background runs when it has to (tests give a
    slow or failing one)."""
    check_serve(config)
    engine, server, instance = config.engine, config.server, config.instance
    started = time.monotonic()
    served = resolve_model(engine.weights)
    served.require_tokenizer()
    context = served.config.max_position_embeddings
    if server.max_model_len:
        if server.max_model_len > context:
            raise ValueError(f"--max-model-len {server.max_model_len} exceeds the model's "
                             f"context of {context} tokens")
        context = server.max_model_len
    template = served.chat_template
    if server.chat_template:
        template = ChatTemplate.from_file(server.chat_template, template.bos_token,
                                          template.eos_token)
    log.info("model %s (%s): context %d tokens, vocabulary %d, chat template %s, stop "
             "tokens %s", served.name, served.location, context, served.config.vocab_size,
             template.origin, list(served.config.eos_token_ids))
    try:
        tokenizer_dir = hf_tokenizer_dir(served.require_tokenizer().raw, template.bos_token,
                                         template.eos_token, context, template.source)
        log.info("tokenizer in the Hugging Face format, for clients that count tokens with "
                 "one (guidellm --processor): %s", tokenizer_dir)
    except OSError as err:
        log.warning("could not write the tokenizer in the Hugging Face format: %s", err)
    weights_identity = engine.weights or served.name
    if served.kind != "named":
        weights = prepare_weights(served)
        weights_identity = weights.stem
        log.info("weights: %s (shared by every worker, %.0f MB)", weights,
                 weights.stat().st_size / 1e6)
    element_bytes = resolve_device(engine.device, engine.dtype).element_bytes
    kv_blocks = kv_blocks_for(engine, served.config, element_bytes)
    log.info("KV cache: %d blocks of %d tokens per worker (%.0f MiB)", kv_blocks, KV_BLOCK_TOKENS,
             kv_blocks * KV_BLOCK_TOKENS * served.config.kv_elements_per_token
             * element_bytes / (1 << 20))
    cached = None if config.perf.profile else cached_profile(weights_identity, kv_blocks)
    if config.perf.profile:
        perf = PerfModel.load(config.perf.profile)
        state = PerfModelState(PROFILED, f"loaded from {config.perf.profile}")
        log.info("performance model loaded from %s", config.perf.profile)
    elif cached is not None:
        perf, origin = cached
        state = PerfModelState(PROFILED, origin)
        log.info("performance model: the start-up profile, %s", origin)
    else:
        perf, origin = provisional_model(engine.weights, weights_identity, kv_blocks)
        state = PerfModelState(PROVISIONAL, origin)
        log.info("performance model: provisional until the quick start-up profile, measured "
                 "in the background, is ready (--perf-model skips it): %s (%.1fs since start)",
                 origin, time.monotonic() - started)
    cluster = config.cluster
    policy, count = build_policy(PolicySetup(
        perf, config.slo.targets(), config.policy, instances=int(cluster.instances),
        prefill=cluster.prefill, decode=cluster.decode, reserve=cluster.reserve,
        chunk_size_tokens=instance.chunk_size_tokens, max_batch_size=instance.max_batch_size,
        monitor_window_s=config.monitor.window_s,
        # flowkv hashes prompts per cache block (one KV block when the cache is off)
        prefix_block_tokens=instance.prefix_block_tokens or KV_BLOCK_TOKENS, seed=config.seed,
        output_lengths_known=False))  # a request's output_tokens is its max_tokens here
    ray = server.ray
    sharing = count if ray is None else max(1, round(1 / (ray.gpus_per_worker
                                                          or 1)))  # workers per GPU
    where = resolve_device(engine.device, engine.dtype, workers_per_gpu=sharing,
                           attention=engine.attention,
                           fused_elementwise=engine.fused_elementwise)
    log.info("engines on %s in %s%s", where.device, where.dtype,
             f", {where.memory_fraction:.0%} of the GPU each" if where.memory_fraction else "")
    driver = LiveDriver(policy, count, served.require_tokenizer(), WorkerSettings(
        engine.weights, config.seed, kv_blocks, instance.chunk_size_tokens,
        instance.max_batch_size, policy.phase_priority.value, instance.prefix_block_tokens,
        queue_order=policy.queue_order, perf=perf, decode_forecast=policy.decode_forecast,
        device=where, kv_block_bytes=KV_BLOCK_TOKENS * served.config.kv_elements_per_token
        * where.element_bytes), config.monitor.interval_s, server.max_outstanding, ray, state,
        model_name=server.served_model_name or served.name)
    background = [] if state.state == PROFILED else [BackgroundProfile(
        partial(measure, engine.weights, weights_identity, kv_blocks), driver.use_perf_model,
        driver.perf_model_failed).run]
    return create_app(driver, ServerSettings(
        server.served_model_name or served.name, context, served.config.vocab_size,
        server.max_body_bytes, server.api_key or None, template,
        f"http://{server.host}:{server.port}", config.slo.targets()), background=background)
