"""What building a policy may need (`PolicySetup`): the cluster shape, the performance
model, SLOs, the instances' limits and each paper's settings. Every preset builder
(`policies/<paper>/preset.py`, `policies/presets.py`) takes one."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.perf.fitted import PerfModel
from pdserve.policies.ares.settings import AresSettings
from pdserve.policies.flowkv.settings import FlowKVSettings
from pdserve.policies.taichi.settings import TaiChiSettings
from pdserve.types import SLO, Role


@dataclass(frozen=True)
class PolicySetup:
    """What building a policy may need: the cluster shape, the performance model (the
    profile in the live world), SLOs and the instances' limits."""

    perf: PerfModel
    slo: SLO
    instances: int = 8  # colocated presets
    prefill: int = 4  # disaggregated presets: initial prefill / decode split
    decode: int = 4
    chunk_size_tokens: int = 2048
    max_batch_size: int = 256
    monitor_window_s: float = 5.0
    arrow_min_dwell_s: float = 5.0
    arrow_monitor_cooldown_s: float = 5.0
    prefill_router: str = ""  # "" keeps the preset's
    decode_router: str = ""
    # per instance, when the cluster is heterogeneous or its roles are given (flowkv)
    perfs: tuple[PerfModel, ...] = ()
    roles: tuple[Role, ...] = ()
    reserve: int = 0  # flowkv: instances held back for elastic scaling
    flowkv: FlowKVSettings | None = None
    prefix_aware: bool = True  # flowkv: prefill routing sees prefix-cache hits
    taichi: TaiChiSettings = field(default_factory=TaiChiSettings)
    rebalancer: str = ""  # "" keeps the preset's; ares | reschedule-current | none
    ares: AresSettings = field(default_factory=AresSettings)
