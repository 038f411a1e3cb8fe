"""Plain data of a simulated run: its settings (`SimSettings`) and what it produced
(`SimResult`: every request, monitor samples and the decision log (`cluster/history.py`),
transfer calls, session statistics)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.cluster.history import Decision, DecisionKind, LoadSample
from pdserve.sim.blocks import TRANSFER_MODES
from pdserve.types import KV_BLOCK_TOKENS, Request, Role


@dataclass
class SessionStats:
    rounds: int = 0  # rounds after the first that arrived
    history_evicted: int = 0  # their history KV had been evicted: re-prefilled
    history_recomputed: int = 0  # prefilled away from the history: recomputed
    history_read_bytes: float = 0.0  # read by remote prefills
    local_prefills: int = 0  # rounds prefilled on their home (decode) instance
    remote_prefills: int = 0  # rounds with a home prefilled elsewhere


@dataclass
class SimResult:
    requests: list[Request]
    samples: list[LoadSample] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)  # the decision log, in order
    end_s: float = 0.0
    events: int = 0
    initial_roles: list[Role] = field(default_factory=list)
    transfer_calls: dict[int, int] = field(default_factory=dict)  # request id -> calls (sum)
    prefix_hit_tokens: int = 0  # prompt tokens the instances' prefix caches saved computing
    sessions: SessionStats = field(default_factory=SessionStats)
    instance_s_total: float = 0.0  # instance-seconds run (stopped instances not counted)
    migrations: int = 0  # decode-to-decode moves that left their source (rebalancers)
    decided_early: bool = False  # stopped once its SLO attainment was decided (a goodput
    # step, `metrics/attainment_watch.py`): requests not done then are unfinished

    @property
    def role_changes(self) -> list[Decision]:
        """The flips of the decision log (`time_s`, `instance_id`, `role`, `reason`)."""
        return [d for d in self.decisions if d.kind is DecisionKind.FLIP]

    @property
    def scaling_events(self) -> list[tuple[float, int, str, str]]:
        """Elastic scaling: (time, instance, "stop" | "start" | "started", reason)."""
        return [(d.time_s, d.instance_id, d.kind.value, d.reason) for d in self.decisions
                if d.kind in _SCALING]

    @property
    def flips(self) -> int:
        """Role changes that move an instance between the prefill side (P, D->P) and the
        decode side (D, P->D); settling within a side is not a flip."""
        sides = [role.takes_prefill for role in self.initial_roles]
        count = 0
        for change in self.role_changes:
            side = change.role.takes_prefill
            count += side != sides[change.instance_id]
            sides[change.instance_id] = side
        return count


_SCALING = frozenset({DecisionKind.STOP, DecisionKind.START, DecisionKind.STARTED})
MAX_SPAN_STEPS = 1 << 20  # steps a simulated batch may span between events (1: step by step)


@dataclass(kw_only=True)
class SimSettings:
    """What the simulator takes from a run's config. `pdserve.sim.runner.sim_settings`
    builds it; the fields are the config's values (its path named beside each), so only
    the driver's own `max_span_steps` has a default here."""

    chunk_size_tokens: int  # instance.chunk_size_tokens
    max_batch_size: int  # instance.max_batch_size
    transfer_calls: int  # sim.transfer_calls: per hand-off, in the "fixed" transfer mode
    monitor_interval_s: float  # monitor.interval_s
    transfer_mode: str  # sim.transfer_mode, resolved: how a transfer's calls are counted
    kv_layers: int  # the model's layers (perf.model), for the per-block-per-layer mode
    prefix_block_tokens: int  # instance.prefix_block_tokens, resolved; 0: no prefix cache
    instance_startup_s: float  # sim.instance_startup_s: a started instance serves after this
    seed: int  # of the batch-time spread of models that carry one (`sim/step_noise.py`)
    max_span_steps: int = MAX_SPAN_STEPS

    def __post_init__(self) -> None:
        for name in ("chunk_size_tokens", "max_batch_size", "transfer_calls", "max_span_steps",
                     "kv_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.prefix_block_tokens < 0 or self.prefix_block_tokens % KV_BLOCK_TOKENS:
            raise ValueError(f"prefix_block_tokens must be a multiple of {KV_BLOCK_TOKENS} "
                             f"(0: no prefix cache), got {self.prefix_block_tokens}")
        if self.transfer_mode not in TRANSFER_MODES:
            raise ValueError(f"transfer_mode must be one of {', '.join(TRANSFER_MODES)}, got "
                             f"{self.transfer_mode!r}")
        if self.instance_startup_s < 0:
            raise ValueError(f"instance_startup_s must not be negative, got "
                             f"{self.instance_startup_s}")
        if not self.monitor_interval_s > 0:
            raise ValueError(f"monitor_interval_s must be positive, got {self.monitor_interval_s}")
