"""What building a policy takes: the config's policy section (`PolicyConfig`: the preset,
component overrides and each paper's settings) and `PolicySetup`, which adds what the run
around the policy decides (the performance model, SLOs, the cluster shape, the instances'
limits). Every preset builder (`policies/<paper>/preset.py`, `policies/presets.py`) takes a
`PolicySetup`; `pdserve.config` holds a `PolicyConfig` as its `policy` section."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field, replace

from pdserve.perf.fitted import PerfModel
from pdserve.policies.ampd.settings import AmpdSettings
from pdserve.policies.ares.preset import REBALANCERS
from pdserve.policies.ares.settings import AresSettings
from pdserve.policies.arrow.settings import ArrowSettings
from pdserve.policies.flowkv.settings import FlowKVSettings
from pdserve.policies.taichi.settings import TaiChiSettings
from pdserve.types import SLO, Role

PHASE_PRIORITIES = ("decode-first", "prefill-first")


@dataclass(frozen=True)
class PolicyConfig:
    """A preset by name, optionally with components replaced, and each paper's settings
    (read only by the presets that use them; `rebalancer: ares` reads `ares` for any)."""

    name: str = "static-pd"  # a preset of `policies/presets.py`
    prefill_router: str = ""  # "" keeps the preset's component
    decode_router: str = ""
    phase_priority: str = ""  # "" keeps the policy's; decode-first | prefill-first
    rebalancer: str = ""  # "" keeps the preset's; ares | reschedule-current | none
    arrow: ArrowSettings = field(default_factory=ArrowSettings)
    taichi: TaiChiSettings = field(default_factory=TaiChiSettings)
    ares: AresSettings = field(default_factory=AresSettings)
    flowkv: FlowKVSettings = field(default_factory=FlowKVSettings)
    ampd: AmpdSettings = field(default_factory=AmpdSettings)

    def __post_init__(self) -> None:
        if self.phase_priority not in ("", *PHASE_PRIORITIES):
            raise ValueError(f"config field 'policy.phase_priority' must be decode-first or "
                             f"prefill-first (or empty: the policy's), got "
                             f"{self.phase_priority!r}")
        if self.rebalancer not in ("", *REBALANCERS):
            raise ValueError(f"config field 'policy.rebalancer' must be "
                             f"{', '.join(REBALANCERS[:-1])} or {REBALANCERS[-1]} (or empty: "
                             f"the policy's), got {self.rebalancer!r}")


@dataclass(frozen=True)
class PolicySetup:
    """The policy section plus what building a policy needs from the run: the performance
    model (the profile in the live world), SLOs, the cluster shape and the instances'
    limits. `seed` and `prefix_block_tokens` reach the papers' settings that use them
    (`taichi`, `ares`, `flowkv` below): they are the run's, not a policy's own."""

    perf: PerfModel
    slo: SLO
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    _: KW_ONLY
    # the run's, built from its config (`pdserve.sim.runner.policy_setup`, the server's
    # `build_app`): the config states their defaults (path beside each), so none here
    instances: int  # cluster.instances: colocated presets
    prefill: int  # cluster.prefill: disaggregated presets' initial prefill / decode split
    decode: int  # cluster.decode
    chunk_size_tokens: int  # instance.chunk_size_tokens
    max_batch_size: int  # instance.max_batch_size
    monitor_window_s: float  # monitor.window_s
    seed: int  # seed
    reserve: int = 0  # cluster.reserve: flowkv's instances held back for elastic scaling
    # per instance, when the cluster is heterogeneous or its roles are given (flowkv)
    perfs: tuple[PerfModel, ...] = ()
    roles: tuple[Role, ...] = ()
    # instance.prefix_block_tokens, resolved: the instances' prefix-cache block (0: flowkv's
    # own)
    prefix_block_tokens: int = 0
    # a request's `output_tokens` is its true length (simulation); live it is `max_tokens`
    output_lengths_known: bool = True

    @property
    def taichi(self) -> TaiChiSettings:
        return replace(self.policy.taichi, seed=self.seed)

    @property
    def ares(self) -> AresSettings:
        return replace(self.policy.ares, forecast=replace(self.policy.ares.forecast,
                                                          seed=self.seed))

    @property
    def flowkv(self) -> FlowKVSettings:
        if not self.prefix_block_tokens:
            return self.policy.flowkv
        return replace(self.policy.flowkv, prefix_block_tokens=self.prefix_block_tokens)
