"""One flat, typed configuration for a simulation; loadable from YAML.

Every field can be set in a YAML file (`pdserve simulate --config run.yaml`) and overridden
on the command line. A policy is a preset name (`policy: static-pd`), optionally with its
components replaced (`prefill_router: round-robin`). Errors name the offending field.
"""

from __future__ import annotations

import difflib
import types
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from pdserve.cluster.hardware import parse_instances
from pdserve.cluster.topology import GPU_LINK, network_link
from pdserve.instance.decode_forecast import ForecastSettings
from pdserve.policies.ares.settings import AresSettings
from pdserve.policies.taichi.settings import TaiChiSettings, settings_from_fields


@dataclass
class SimConfig:
    # workload
    trace: str = "azure-conv"  # shipped name, trace path, or "synthetic"
    rate_scale: float = 1.0
    start_s: float = 0.0
    duration_s: float | None = None
    max_requests: int | None = None
    synthetic_requests: int = 1000
    synthetic_rate_rps: float = 10.0
    synthetic_arrival: str = "poisson"
    synthetic_cv: float = 1.0
    synthetic_lengths: str = "fixed:512:128"
    seed: int = 0
    # policy
    policy: str = "static-pd"
    prefill_router: str = ""  # "" keeps the preset's component
    decode_router: str = ""
    instances: int | str = 8  # colocated presets; or groups: 4xl20:prefill,4xh20:decode
    reserve: int = 0  # flowkv: instances held back for elastic scaling
    instance_startup_s: float = 20.0  # a started (scaled-up) instance serves after this
    prefix_aware_routing: bool = True  # flowkv: prefill routing counts prefix-cache hits
    phase_priority: str = ""  # "" keeps the policy's; decode-first | prefill-first
    prefill: int = 4  # disaggregated presets
    decode: int = 4
    # hardware and performance model
    model: str = "llama-3.1-8b"
    gpu: str = "h800"
    tp: int = 0  # 0: the preset setup's degree
    perf_model: str = ""  # a fitted model file (pdserve profile); replaces model x gpu
    # instances
    chunk_size_tokens: int = 2048
    max_batch_size: int = 256
    transfer_calls: int = 1  # per KV hand-off, with transfer_mode "fixed"
    # aligned | per-block-per-layer | fixed (pdserve.sim.blocks); "": aligned for the flowkv
    # preset, fixed otherwise (tracking block ids costs the simulator 2-3x its speed)
    transfer_mode: str = ""
    # cluster network (pdserve.cluster.topology): instances fill nodes in id order
    instances_per_node: int = 0  # 0: as many as fit on an 8-GPU node at the tp degree
    intra_node_link: str = "gpu"  # the GPU's link as the perf model prices it, or a named link
    inter_node_link: str = "rdma-200g"  # rdma-100g/200g/400g, tcp-25g/100g, custom:GBps:us
    # tokens per prefix hash (Mooncake: 512); 0: no prefix cache; -1: 512 for the flowkv
    # preset, off otherwise (the cache changes results on traces with hash ids, and costs speed)
    prefix_block_tokens: int = -1
    # the control plane's latency per request (client -> instance plus token -> client),
    # added to every output time; 0 for GPU clusters, measured live by bench/live_fidelity.py
    control_latency_s: float = 0.0
    # its spread: 0 adds control_latency_s to every request; above it, each request draws
    # its own latency from a lognormal with median control_latency_s and this P90
    control_latency_p90_s: float = 0.0
    monitor_interval_s: float = 1.0
    monitor_window_s: float = 5.0  # windowed statistics (token intervals) span this long
    arrow_min_dwell_s: float = 5.0  # an instance Arrow flips stays on its new side this long
    arrow_monitor_cooldown_s: float = 5.0  # between two flips of Arrow's monitor rules
    # taichi's sliders (R_PD is prefill : decode) and algorithm knobs (policies/taichi/)
    taichi_chunk_p_tokens: int = 2048  # S_P (search-chosen default; R_PD 1:3 suggested)
    taichi_chunk_d_tokens: int = 512  # S_D; 0: D-heavy instances take no prefill tokens
    taichi_watermark: float = 0.95  # M
    taichi_alpha: float = 0.96
    taichi_no_feasible: str = "random"  # random | least-loaded | reject
    taichi_flowing_decode: bool = True  # Alg. 1 (ablation switch)
    taichi_length_aware_prefill: bool = True  # Alg. 2 (ablation switch)
    # ARES's decode rescheduling (policies/ares/): any preset may add it
    rebalancer: str = ""  # "" keeps the preset's; ares | reschedule-current | none
    ares_predictor: str = "history"  # oracle | noisy:mae=N | history | hidden-state:PATH
    ares_theta: float = 0.1
    ares_horizon_steps: int = 2000  # H
    ares_decay: float = 0.8  # beta_t ∝ decay^j over the horizon's points
    ares_refresh_tokens: int = 20  # k
    ares_interval_s: float = 1.0
    ares_memory_guard: float = 0.0  # > 0: instances this full (KV) count as overloaded
    # SLOs and goodput
    ttft_slo_s: float = 2.0
    tpot_slo_s: float = 0.15
    goodput: bool = False
    goodput_target: float = 0.9
    goodput_tolerance: float = 0.02

    def __post_init__(self) -> None:
        positive = ("rate_scale", "synthetic_requests", "synthetic_rate_rps", "synthetic_cv",
                    "prefill", "decode", "chunk_size_tokens", "max_batch_size",
                    "transfer_calls", "monitor_interval_s", "monitor_window_s", "ttft_slo_s",
                    "tpot_slo_s", "goodput_tolerance")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"config field {name!r} must be positive, got "
                                 f"{getattr(self, name)!r}")
        for name in ("duration_s", "max_requests"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"config field {name!r} must be positive, got {value!r}")
        for name in ("arrow_min_dwell_s", "arrow_monitor_cooldown_s", "instance_startup_s",
                     "control_latency_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"config field {name!r} must not be negative, got "
                                 f"{getattr(self, name)!r}")
        if self.control_latency_p90_s and not (
                self.control_latency_p90_s >= self.control_latency_s > 0):
            raise ValueError(f"config field 'control_latency_p90_s' must be 0 or at least "
                             f"control_latency_s > 0, got {self.control_latency_p90_s!r} with "
                             f"control_latency_s {self.control_latency_s!r}")
        if isinstance(self.instances, str):
            try:
                parse_instances(self.instances)
            except ValueError as err:
                raise ValueError(f"config field 'instances': {err}") from None
        elif not self.instances > 0:
            raise ValueError(f"config field 'instances' must be positive, got {self.instances}")
        if self.phase_priority not in ("", "decode-first", "prefill-first"):
            raise ValueError(f"config field 'phase_priority' must be decode-first or "
                             f"prefill-first (or empty: the policy's), got "
                             f"{self.phase_priority!r}")
        if self.reserve < 0:
            raise ValueError(f"config field 'reserve' must not be negative, got {self.reserve}")
        if self.start_s < 0:
            raise ValueError(f"config field 'start_s' must not be negative, got {self.start_s}")
        if self.instances_per_node < 0:
            raise ValueError(f"config field 'instances_per_node' must not be negative, got "
                             f"{self.instances_per_node}")
        for name in ("intra_node_link", "inter_node_link"):
            value = getattr(self, name)
            if name == "intra_node_link" and value == GPU_LINK:
                continue
            try:
                network_link(value)
            except ValueError as err:
                raise ValueError(f"config field {name!r}: {err}") from None
        if self.transfer_mode not in ("", "aligned", "per-block-per-layer", "fixed"):
            raise ValueError(f"config field 'transfer_mode' must be aligned, "
                             f"per-block-per-layer or fixed, got {self.transfer_mode!r}")
        if self.prefix_block_tokens != -1 and (self.prefix_block_tokens < 0
                                               or self.prefix_block_tokens % 16):
            raise ValueError(f"config field 'prefix_block_tokens' must be a multiple of 16 "
                             f"(0: no prefix cache, -1: the preset's), got "
                             f"{self.prefix_block_tokens}")
        if self.tp < 0:
            raise ValueError(f"config field 'tp' must not be negative, got {self.tp}")
        try:
            self.taichi_settings()
        except ValueError as err:
            raise ValueError(f"config field taichi_*: {err}") from None
        if self.rebalancer not in ("", "ares", "reschedule-current", "none"):
            raise ValueError(f"config field 'rebalancer' must be ares, reschedule-current or "
                             f"none (or empty: the policy's), got {self.rebalancer!r}")
        try:
            self.ares_settings()
        except ValueError as err:
            raise ValueError(f"config field ares_*: {err}") from None
        if not 0 < self.goodput_target <= 1:
            raise ValueError(f"config field 'goodput_target' must be in (0, 1], got "
                             f"{self.goodput_target}")

    def taichi_settings(self) -> TaiChiSettings:
        return settings_from_fields(self)

    def ares_settings(self) -> AresSettings:
        return AresSettings(theta=self.ares_theta, interval_s=self.ares_interval_s,
                            memory_guard=self.ares_memory_guard,
                            forecast=ForecastSettings(
                                predictor=self.ares_predictor,
                                refresh_every_tokens=self.ares_refresh_tokens,
                                horizon_steps=self.ares_horizon_steps,
                                decay=self.ares_decay, seed=self.seed))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> SimConfig:
        hints = typing.get_type_hints(cls)
        names = [f.name for f in fields(cls)]
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in hints:
                close = difflib.get_close_matches(str(key), names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{source}: unknown field {key!r}{hint}")
            values[key] = _coerce(key, value, hints[key], source)
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> SimConfig:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ValueError(f"cannot read config {path}: {err}") from err
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a config file must be a mapping of field: value")
        return cls.from_dict(raw, str(path))

    def replaced(self, **changes: Any) -> SimConfig:
        return SimConfig.from_dict({**asdict(self), **changes})


def _coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in allowed:
        return None
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if kind is str and isinstance(value, str):
            return value
    wanted = " or ".join("null" if k is type(None) else k.__name__ for k in allowed)
    raise ValueError(f"{source}: field {key!r} must be {wanted}, got {value!r}")


def effective_transfer_mode(config: SimConfig) -> str:
    """The transfer-call accounting a run uses (the preset's when the config leaves it)."""
    return config.transfer_mode or ("aligned" if config.policy == "flowkv" else "fixed")


def effective_prefix_block_tokens(config: SimConfig) -> int:
    """Tokens per prefix hash a run's instances cache (0: none; the preset's when -1)."""
    if config.prefix_block_tokens >= 0:
        return config.prefix_block_tokens
    return 512 if config.policy == "flowkv" else 0
