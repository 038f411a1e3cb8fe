"""The load a local scheduler shows policies (the `InstanceLoad` protocol of
`instance/stats.py`), read from the counters it keeps incrementally, so each read is O(1).
A mixin of `LocalScheduler`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections import deque

    from pdserve.instance.prefill_queue import PrefillQueue
    from pdserve.types import Request


class LoadCounters:
    # the local scheduler's state read here
    prefills: PrefillQueue
    transfer_queue: deque[Request]
    transferring: dict[int, Request]
    ready: deque[Request]
    running: dict[int, Request]
    held: dict[int, tuple[Request, int]]
    total_blocks: int
    free_blocks: int

    @property
    def prefill_queue_len(self) -> int:
        return len(self.prefills)

    @property
    def prefill_queue_tokens(self) -> int:
        return self.prefills.tokens

    @property
    def prefill_queue_attn_units(self) -> int:
        return self.prefills.attn_units

    @property
    def decode_queue_len(self) -> int:
        return len(self.transfer_queue) + len(self.transferring) + len(self.ready)

    @property
    def running_decodes(self) -> int:
        return len(self.running)

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    @property
    def prefill_running_len(self) -> int:
        return len(self.prefills.active)

    @property
    def sending_len(self) -> int:
        return len(self.held)
