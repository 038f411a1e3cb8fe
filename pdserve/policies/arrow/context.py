"""What Arrow's components share: SLOs, the TTFT predictor, the monitor, the load tests, and
when each instance last changed side.

Decode load measures (Arrow sec. 5.3 and 5.5; the paper names them, pdserve defines them):
  an instance can take a decode      its running plus incoming decode tokens are within Max
                                     Running Tokens, its recent token interval within the
                                     TPOT SLO (Alg. 2) and it has a free batch slot (the
                                     batch-size cap the paper's profiling implies; added)
  decode load is low (Alg. 1 gate)   without the instance Alg. 3 would take, Alg. 2's own
                                     choice (t1, else t2) could still take a decode within
                                     LOW_FRACTION of those limits
  decode is busy (idle-prefill rule) the pool holds BUSY_FRACTION of its Max Running Tokens,
                                     or its token interval is BUSY_FRACTION of the TPOT SLO

Why the Alg. 1 gate is per instance: the paper's decode load is an instance's running tokens
and token interval (sec. 5.3, Alg. 2), and its overload rule (sec. 5.5) "checks the load on
the decode instance" before a flip, to keep instance allocation from oscillating. A gate on
the pool's sum can pass while Alg. 2's least-loaded instance is past its limits, and then
the next decode dispatch flips an instance straight back (Alg. 4 prefers the D->P instance
just made). Stated in Alg. 2's terms, a flip Alg. 1 makes leaves Alg. 2 an instance it
accepts, so Alg. 2 does not undo it on the same view.

Flip damping (pdserve's, not the paper's): an instance stays at least `min_dwell_s` on the
side it was moved to (Alg. 3 and 4 skip it), and the monitor's own flips (sec. 5.5 rules 2
and 3) wait `monitor_cooldown_s` after the last one, because the windowed token interval
they read still holds pre-flip steps for one window.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pdserve.cluster.events import ClusterView
from pdserve.cluster.monitor import InstanceMonitor
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.perf.fitted import PerfModel
from pdserve.policies.arrow.profiling import TtftPredictor
from pdserve.policies.arrow.settings import ArrowSettings
from pdserve.types import Role


@dataclass
class ArrowContext:
    ttft_slo_s: float
    tpot_slo_s: float
    predictor: TtftPredictor
    monitor: InstanceMonitor
    max_running_tokens: int
    max_batch_size: int
    low_fraction: float = 0.8
    busy_fraction: float = 0.5
    # flip damping: `ArrowSettings` (the config's `policy.arrow`) states the defaults
    min_dwell_s: float = ArrowSettings.min_dwell_s
    monitor_cooldown_s: float = ArrowSettings.monitor_cooldown_s
    flipped_at_s: dict[int, float] = field(default_factory=dict)  # last side change
    monitor_flipped_at_s: float = float("-inf")
    # how the predictor and Max Running Tokens follow from a performance model
    # (`arrow_context`: `profiled_terms` at the run's chunk size, TPOT SLO and batch cap),
    # and the model they came from, for `use_perf_model`; None: they stay as given
    derive_terms: Callable[[PerfModel], tuple[TtftPredictor, int]] | None = None
    perf: PerfModel | None = None

    def __post_init__(self) -> None:
        if not 0 < self.busy_fraction <= 1 or not 0 < self.low_fraction <= 1:
            raise ValueError("arrow low_fraction and busy_fraction must be in (0, 1]")
        if self.min_dwell_s < 0 or self.monitor_cooldown_s < 0:
            raise ValueError("arrow min_dwell_s and monitor_cooldown_s must not be negative")

    def use_perf_model(self, perf: PerfModel) -> None:
        """Profile the TTFT predictor and Max Running Tokens on `perf` (once, however many
        of the components sharing this context pass it on); the monitor, the flip times and
        the pools are kept."""
        if perf is self.perf:
            return
        if self.derive_terms is None:
            raise ValueError("this Arrow context was built with fixed terms (no "
                             "derive_terms): it cannot take another performance model")
        self.perf = perf
        self.predictor, self.max_running_tokens = self.derive_terms(perf)

    @staticmethod
    def decode_tokens(load: InstanceLoad) -> int:
        return load.running_tokens + load.decode_queue_tokens

    # ---- flip damping ----
    def may_flip(self, instance_id: int, now_s: float) -> bool:
        last = self.flipped_at_s.get(instance_id)
        return last is None or now_s - last >= self.min_dwell_s

    def record_flip(self, instance_id: int, now_s: float) -> None:
        self.flipped_at_s[instance_id] = now_s

    # ---- decode load (Alg. 2's measure) ----
    def decode_target(self, pool: Sequence[int], view: ClusterView, excluding: int = -1) -> int:
        """Alg. 2's t1/t2: fewest running + incoming tokens, among instances with a free
        batch slot if any; -1 for an empty pool."""
        cap, instances = self.max_batch_size, view.instances
        best, best_key = -1, (True, 0)
        for i in pool:
            if i == excluding:
                continue
            load = instances[i]
            key = (load.running_decodes + load.decode_queue_len >= cap,
                   load.running_tokens + load.decode_queue_tokens)
            if best < 0 or key < best_key:
                best, best_key = i, key
        return best

    def can_take_decode(self, instance_id: int, view: ClusterView,
                        fraction: float = 1.0) -> bool:
        """Alg. 2's test, with the token and interval limits scaled by `fraction`."""
        load = view.instances[instance_id]
        return (self.decode_tokens(load) <= fraction * self.max_running_tokens
                and load.running_decodes + load.decode_queue_len < self.max_batch_size
                and self.monitor.token_interval_s([instance_id])
                <= fraction * self.tpot_slo_s)

    @staticmethod
    def decode_pool(board: RoleBoard) -> list[int]:
        return board.pools[Role.DECODE] + board.pools[Role.P_TO_D]

    def decode_load_is_low(self, view: ClusterView, board: RoleBoard, leaving: int) -> bool:
        """Alg. 1's overload gate: with `leaving` gone to prefill, Alg. 2's t1 (else t2)
        would still take a decode within `low_fraction` of its limits."""
        for pool in (board.pools[Role.DECODE], board.pools[Role.P_TO_D]):
            target = self.decode_target(pool, view, excluding=leaving)
            if target >= 0 and self.can_take_decode(target, view, self.low_fraction):
                return True
        return False

    def _pool_tokens(self, pool: Sequence[int], view: ClusterView) -> int:
        return sum(self.decode_tokens(view.instances[i]) for i in pool)

    def decode_is_busy(self, view: ClusterView, board: RoleBoard) -> bool:
        pool = self.decode_pool(board)
        if not pool:
            return True
        capacity = len(pool) * self.max_running_tokens * self.busy_fraction
        return (self._pool_tokens(pool, view) >= capacity or self.monitor.token_interval_s(pool)
                >= self.busy_fraction * self.tpot_slo_s)
