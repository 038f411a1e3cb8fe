"""ARES decode rescheduling, the scheduler side: Alg. 1 lines 1-10
(`../shared/papers/ares.md`, sec. 5.2).

Every `interval_s` (line 3; the global scheduler acts on monitor ticks, so rounds fall on
the first tick at least that long after the previous one) the rebalancer collects the
decode instances' pre-computed forecasts (line 4; `InstanceLoad.decode_forecast`, which the
simulated instance computes on demand and a live worker sends with its stats), classifies
them (line 5, `classification.py`), enumerates candidates if any instance is overloaded
(lines 6-7, `candidates.py`), picks the single migration that most reduces the
time-weighted load variance (line 8, `selection.py`; both run vectorised over the targets
in `fast_round.py`, which picks what they pick) and executes it (line 10) as a
`Migrate` action: both drivers move the KV on the cluster's links while the source keeps
decoding its other requests (sec. 5.4), and the request continues on the target with no
repeated token. Each `Migrate` carries its reason ("ares alg1: ...").

The rebalancer composes with any preset: it only needs the decodes' `Request` objects,
which it learns from the scheduler's decode dispatches (`on_decode`), and the forecasts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.cluster.actions import Action, Migrate
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel
from pdserve.policies.ares.classification import InstanceState, classify
from pdserve.policies.ares.fast_round import LinkCosts, best_move
from pdserve.policies.ares.settings import AresSettings
from pdserve.types import KV_BLOCK_TOKENS, Request


@dataclass(slots=True)
class RoundRecord:
    """What one round decided (for benches and tests)."""

    time_s: float
    overloaded: int
    underloaded: int
    candidates: int
    migrated: bool
    wall_s: float  # the round's compute time at the scheduler (lines 4-10)
    forecast_wall_s: float = 0.0  # of which reading the workers' reports (in the simulator
    # the forecasts are computed when read: the workers' side, run in parallel in reality)
    moved_request: int = -1  # the migrated request, and its output length then
    moved_at_tokens: int = 0


class AresRebalancer:
    def __init__(self, settings: AresSettings, perf: PerfModel,
                 instance_perfs: Sequence[PerfModel] = ()) -> None:
        """`instance_perfs`: each instance's model when the cluster is heterogeneous (a
        degree per pool): an instance's step time T_exec is priced by its own."""
        self.settings = settings
        self.instance_perfs = tuple(instance_perfs)
        self.forecast_settings = settings.effective_forecast()
        self.offsets = self.forecast_settings.step_offsets()
        self.weights = self.forecast_settings.weights()
        self.perf = perf
        self.decodes: dict[int, Request] = {}  # by request id, from decode dispatches
        self._moved_round: dict[int, int] = {}  # request id -> round it was last moved in
        self._last_round_s = -float("inf")
        self._links: LinkCosts | None = None
        self._links_key: tuple[int, int] = (0, 0)
        self.rounds = 0
        self.migrations = 0
        self.records: list[RoundRecord] = []

    def use_perf_model(self, perf: PerfModel) -> None:
        self.perf, self.instance_perfs = perf, ()
        self._links = None  # priced by the model's transfer cost when there is no topology

    # ---- what the scheduler tells it ----
    def on_decode(self, request: Request, instance_id: int) -> None:
        self.decodes[request.request_id] = request

    # ---- Alg. 1 lines 1-10 ----
    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        if view.now_s - self._last_round_s < self.settings.interval_s - 1e-9:
            return []
        self._last_round_s = view.now_s
        self._prune()
        started = time.perf_counter()
        action = self.round(view, board)
        self.records[-1].wall_s = time.perf_counter() - started
        return [action] if action is not None else []

    def states(self, view: ClusterView, board: RoleBoard) -> dict[int, InstanceState]:
        """Line 4: the decode instances' reports."""
        states: dict[int, InstanceState] = {}
        for i in board.decode_candidates:
            load = view.instances[i]
            forecast = getattr(load, "decode_forecast", None)
            if forecast is None:
                continue  # no report yet (a live worker that has not stepped)
            perf = self.instance_perfs[i] if i < len(self.instance_perfs) else self.perf
            states[i] = InstanceState(
                i, forecast, load.running_tokens + load.decode_queue_tokens,
                load.total_blocks * KV_BLOCK_TOKENS,
                perf.decode.step_s(max(1, load.running_decodes), max(1, load.running_tokens)))
        return states

    def link_costs(self, view: ClusterView) -> LinkCosts:
        """C_mig's terms per instance pair (built once per topology)."""
        key = (id(view.topology), len(view.instances))
        if self._links is None or self._links_key != key:
            self._links = LinkCosts.of(view.topology, self.perf, len(view.instances))
            self._links_key = key
        return self._links

    def round(self, view: ClusterView, board: RoleBoard) -> Migrate | None:
        self.rounds += 1
        record = RoundRecord(view.now_s, 0, 0, 0, False, 0.0)
        self.records.append(record)
        started = time.perf_counter()
        states = self.states(view, board)
        record.forecast_wall_s = time.perf_counter() - started
        classes = classify(states, self.settings.theta, self.settings.memory_guard)  # line 5
        record.overloaded, record.underloaded = len(classes.overloaded), \
            len(classes.underloaded)
        if not classes.overloaded or len(states) < 2:  # line 6
            return None
        recent = {rid for rid, r in self._moved_round.items()
                  if self.rounds - r < self.settings.cooldown_rounds}
        best, change, before, record.candidates = best_move(  # lines 7-8
            states, classes, self.link_costs(view), self.perf.kv_bytes_per_token,
            self.offsets, self.weights, self.settings.min_gain, recent)
        if best is None:  # line 9
            return None
        request = self.decodes.get(best.request.request_id)
        if request is None or request.decode_instance != best.source:
            return None  # not a decode this scheduler dispatched (or it moved meanwhile)
        record.migrated = True
        record.moved_request, record.moved_at_tokens = request.request_id, \
            request.generated_tokens
        self.migrations += 1
        self._moved_round[request.request_id] = self.rounds
        src, dst = states[best.source], states[best.target]
        remaining = best.request.remaining_tokens
        mode = "predicted" if self.settings.predictive else "current"
        reason = (f"ares alg1: {mode} load w={src.weighted_load:.0f} on {best.source} > "
                  f"(1+{self.settings.theta:g}) x mean {classes.mean_load:.0f}; target "
                  f"{best.target} holds {dst.current_tokens} tokens now; request "
                  f"{request.request_id} ({best.request.tokens} tokens, "
                  f"{'?' if remaining == float('inf') else f'{remaining:.0f}'} predicted to "
                  f"go, migration {best.migration_s * 1e3:.1f} ms) cuts load variance "
                  f"{before:.3g} by {-change:.3g}")
        return Migrate(request, best.source, best.target, reason)  # line 10

    def _prune(self) -> None:
        ended = [rid for rid, r in self.decodes.items() if r.finished or r.rejected_reason]
        for rid in ended:
            del self.decodes[rid]
            self._moved_round.pop(rid, None)
