"""What FlowKV's components share (Alg. 1 lines 3-15): the settings, each instance's
performance model (heterogeneous clusters have several), the status window, the latest
scores, the scenario classifier, the prefix index, and each instance's home side.

`observe` runs once per monitor tick (the role manager calls it): it updates the status of
every instance, its C^p_i and C^d_i, and the side averages C^p and C^d.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel
from pdserve.policies.flowkv.prefix_index import PrefixIndex
from pdserve.policies.flowkv.scenario import Scenario, ScenarioClassifier
from pdserve.policies.flowkv.scores import decode_score, normalise, prefill_score, side_average
from pdserve.policies.flowkv.settings import FlowKVSettings
from pdserve.policies.flowkv.status import StatusWindow
from pdserve.types import KV_BLOCK_TOKENS, Role


@dataclass(frozen=True, slots=True)
class TickRecord:
    time_s: float
    scenario: Scenario
    c_prefill: float
    c_decode: float


@dataclass
class FlowKVContext:
    settings: FlowKVSettings
    perfs: Sequence[PerfModel]  # per instance
    homes: list[Role]  # PREFILL, DECODE or RESERVE: the side an instance belongs to
    chunk_size_tokens: int
    max_batch_size: int
    window: StatusWindow = field(init=False)
    classifier: ScenarioClassifier = field(init=False)
    index: PrefixIndex = field(init=False)
    prefill_scores: list[float] = field(init=False)
    decode_scores: list[float] = field(init=False)
    c_prefill: float = 0.0
    c_decode: float = 0.0
    history: list[TickRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.perfs) != len(self.homes):
            raise ValueError(f"flowkv: {len(self.perfs)} performance models for "
                             f"{len(self.homes)} instances")
        s = self.settings
        self.window = StatusWindow(s.window_s, self.chunk_size_tokens)
        self.classifier = ScenarioClassifier(s)
        block_tokens = s.prefix_block_tokens
        self.index = PrefixIndex([max(1, p.kv_capacity_tokens // block_tokens)
                                  for p in self.perfs])
        self.prefill_scores = [0.0] * len(self.homes)
        self.decode_scores = [0.0] * len(self.homes)

    def use_perf_model(self, perf: PerfModel) -> None:
        """Every instance's model is `perf` from now on (a live server has one model); the
        prefix index keeps its capacities (a live server's models share its KV size)."""
        self.perfs = [perf] * len(self.perfs)

    def side(self, home: Role, board: RoleBoard) -> list[int]:
        return [i for i, h in enumerate(self.homes) if h is home and i not in board.failed]

    def observe(self, view: ClusterView, board: RoleBoard) -> Scenario:
        """Alg. 1 lines 4-16: status, scores, averages, scenario."""
        s = self.settings
        self.window.observe(view)
        for i in range(len(self.homes)):
            normalised = normalise(self.window.status(i), s.scales, self.max_batch_size)
            self.prefill_scores[i] = prefill_score(normalised, s.prefill_weights)
            self.decode_scores[i] = decode_score(normalised, s.decode_weights)
        self.c_prefill = side_average(self.prefill_scores, self.side(Role.PREFILL, board))
        self.c_decode = side_average(self.decode_scores, self.side(Role.DECODE, board))
        scenario = self.classifier.update(self.c_prefill, self.c_decode, view.now_s)
        self.history.append(TickRecord(view.now_s, scenario, self.c_prefill, self.c_decode))
        return scenario

    def kv_bytes(self, instance_id: int, tokens: int) -> int:
        return tokens * self.perfs[instance_id].kv_bytes_per_token

    @staticmethod
    def free_tokens(view: ClusterView, instance_id: int) -> int:
        load = view.instances[instance_id]
        return (load.total_blocks - load.used_blocks) * KV_BLOCK_TOKENS - load.decode_queue_tokens
