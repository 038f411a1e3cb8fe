"""What policies may read about an instance.

`InstanceLoad` is the read-only protocol every policy component is written against. In the
simulator the simulated instance implements it directly (no copy per decision); in the live
world the driver holds the latest `InstanceStats` snapshot each worker reported. Counters
named `*_total` are cumulative, so a monitor can difference two snapshots for any window:
`mean_token_interval_s` gives an instance's recent token interval that way.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pdserve.instance.decode_forecast import DecodeForecast


class InstanceLoad(Protocol):
    @property
    def instance_id(self) -> int: ...
    @property
    def prefill_queue_len(self) -> int: ...  # requests waiting for or in prefill
    @property
    def prefill_queue_tokens(self) -> int: ...  # prefill tokens still to compute
    @property
    def prefill_queue_attn_units(self) -> int: ...  # sum of n*(n + 2p) over remaining chunks
    @property
    def decode_queue_len(self) -> int: ...  # decodes waiting for KV transfer or to join
    @property
    def decode_queue_tokens(self) -> int: ...
    @property
    def running_decodes(self) -> int: ...
    @property
    def running_tokens(self) -> int: ...  # sum of sequence lengths of running decodes
    @property
    def used_blocks(self) -> int: ...
    @property
    def total_blocks(self) -> int: ...
    @property
    def preemptions_total(self) -> int: ...
    @property
    def decode_steps_total(self) -> int: ...
    @property
    def decode_busy_s_total(self) -> float: ...  # time spent in batches with decodes
    @property
    def busy_s_total(self) -> float: ...  # time spent in any batch
    @property
    def prefill_running_len(self) -> int: ...  # admitted prefills (partly computed)
    @property
    def sending_len(self) -> int: ...  # prefilled, KV held for a hand-off
    @property
    def reclaimable_blocks(self) -> int: ...  # of used_blocks: session history, evictable


@dataclass(frozen=True, slots=True)
class InstanceStats:
    """A snapshot of `InstanceLoad`, as a live worker reports it or a monitor logs it."""

    instance_id: int
    prefill_queue_len: int
    prefill_queue_tokens: int
    prefill_queue_attn_units: int
    decode_queue_len: int
    decode_queue_tokens: int
    running_decodes: int
    running_tokens: int
    used_blocks: int
    total_blocks: int
    preemptions_total: int
    decode_steps_total: int
    decode_busy_s_total: float
    busy_s_total: float = 0.0
    prefill_running_len: int = 0
    sending_len: int = 0
    reclaimable_blocks: int = 0
    # ARES: the worker's pre-computed decode-load forecast (`instance/decode_forecast.py`),
    # when the policy asked for one
    decode_forecast: DecodeForecast | None = None

    @classmethod
    def empty(cls, instance_id: int, total_blocks: int) -> InstanceStats:
        """The load of an instance that holds nothing (stopped, dead, freshly started)."""
        return cls(instance_id, 0, 0, 0, 0, 0, 0, 0, 0, total_blocks, 0, 0, 0.0)

    @classmethod
    def of(cls, load: InstanceLoad,
           decode_forecast: DecodeForecast | None = None) -> InstanceStats:
        return cls(**{f.name: getattr(load, f.name) for f in fields(cls)
                      if f.name != "decode_forecast"}, decode_forecast=decode_forecast)

    @property
    def memory_fraction(self) -> float:
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0


def mean_token_interval_s(before: InstanceStats, after: InstanceStats) -> float:
    """Mean time between decode tokens on an instance over the window between two snapshots
    (0 when it ran no decode step in the window)."""
    steps = after.decode_steps_total - before.decode_steps_total
    return (after.decode_busy_s_total - before.decode_busy_s_total) / steps if steps else 0.0
