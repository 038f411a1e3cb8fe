"""What Arrow's components share: SLOs, the TTFT predictor, the monitor, the load tests.

Decode load measures (Arrow sec. 5.3 and 5.5; the paper names them, pdserve defines them):
  an instance can take a decode      its running plus incoming decode tokens are within Max
                                     Running Tokens, its recent token interval within the
                                     TPOT SLO (Alg. 2) and it has a free batch slot (the
                                     batch-size cap the paper's profiling implies; added)
  decode load is low (Alg. 1 gate)   the decode pool minus one instance could hold today's
                                     decode tokens within LOW_FRACTION of their Max Running
                                     Tokens, and the pool's token interval is within
                                     LOW_FRACTION of the TPOT SLO
  decode is busy (idle-prefill rule) the pool holds BUSY_FRACTION of its Max Running Tokens,
                                     or its token interval is BUSY_FRACTION of the TPOT SLO
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.cluster.messages import ClusterView
from pdserve.cluster.monitor import InstanceMonitor
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.policies.arrow.profiling import TtftPredictor
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

    def __post_init__(self) -> None:
        if not 0 < self.busy_fraction <= 1 or not 0 < self.low_fraction <= 1:
            raise ValueError("arrow low_fraction and busy_fraction must be in (0, 1]")

    @staticmethod
    def decode_tokens(load: InstanceLoad) -> int:
        return load.running_tokens + load.decode_queue_tokens

    def can_take_decode(self, instance_id: int, view: ClusterView) -> bool:
        load = view.instances[instance_id]
        return (self.decode_tokens(load) <= self.max_running_tokens
                and load.running_decodes + load.decode_queue_len < self.max_batch_size
                and self.monitor.token_interval_s([instance_id]) <= self.tpot_slo_s)

    @staticmethod
    def decode_pool(board: RoleBoard) -> list[int]:
        return board.pools[Role.DECODE] + board.pools[Role.P_TO_D]

    def _pool_tokens(self, pool: Sequence[int], view: ClusterView) -> int:
        return sum(self.decode_tokens(view.instances[i]) for i in pool)

    def decode_load_is_low(self, view: ClusterView, board: RoleBoard) -> bool:
        pool = self.decode_pool(board)
        if len(pool) <= 1:
            return False
        room = (len(pool) - 1) * self.max_running_tokens * self.low_fraction
        return (self._pool_tokens(pool, view) <= room and self.monitor.token_interval_s(pool)
                <= self.low_fraction * self.tpot_slo_s)

    def decode_is_busy(self, view: ClusterView, board: RoleBoard) -> bool:
        pool = self.decode_pool(board)
        if not pool:
            return True
        capacity = len(pool) * self.max_running_tokens * self.busy_fraction
        return (self._pool_tokens(pool, view) >= capacity or self.monitor.token_interval_s(pool)
                >= self.busy_fraction * self.tpot_slo_s)
