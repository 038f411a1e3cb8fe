"""KV coming in and going out of an instance, a mixin of `LocalScheduler`: a prefill kept
here for a hand-off (`held`) until the KV is copied out or decoded in place; incoming
transfers, which wait FCFS until their blocks can be reserved and join the batch once
copied; a running decode detached for a migration; session histories (AMPD) read from or
adopted into this instance. It updates the local scheduler's block and load counts."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pdserve.instance.prefill_queue import PrefillQueue
from pdserve.instance.prefix_cache import PrefixCache, release_prefix
from pdserve.instance.sessions import SessionCache, SessionHistory
from pdserve.types import Request, blocks_for


class KVHandoffs:
    # the local scheduler's
    free_blocks: int
    decode_queue_tokens: int
    held: dict[int, tuple[Request, int]]
    ready: deque[Request]
    transfer_queue: deque[Request]
    transferring: dict[int, Request]
    running: dict[int, Request]
    history: SessionHistory
    sessions: SessionCache
    prefills: PrefillQueue
    prefix_cache: PrefixCache | None
    _drop_running: Callable[[Request], None]

    def history_reads_due(self) -> list[Request]:
        """Remote session rounds whose history read the driver should start now."""
        return self.history.reads_due(self.prefills)

    def history_read_done(self, request: Request) -> None:
        self.history.read_done(request)

    def adopt_history(self, session_id: int, tokens: int, blocks: int) -> bool:
        """Hold a session's history copied in from another instance (live remote
        prefills); False when there is no room for it."""
        self._reclaim(blocks, session_id)
        if blocks > self.free_blocks:
            return False
        self.free_blocks -= blocks
        self.free_blocks += self.sessions.store(session_id, tokens, blocks)
        return True

    def _reclaim(self, blocks_needed: int, keep_session: int = -1) -> None:
        self.free_blocks += self.history.reclaim(blocks_needed, self.free_blocks, keep_session)

    def continue_in_place(self, request: Request) -> None:
        """Decode a request here whose prefill this instance just finished."""
        held, blocks = self.held.pop(request.request_id)
        held.kv_blocks = blocks
        self._to_ready(held)

    def release_handoff(self, request: Request) -> None:
        """Free the KV of a request that has been transferred to another instance. Only this
        instance's count is touched: in simulation the target shares the `Request` object
        and has already put its own reservation in `request.kv_blocks`."""
        _, blocks = self.held.pop(request.request_id)
        self.free_blocks += blocks
        release_prefix(self, request)

    def enqueue_transfer_in(self, request: Request) -> None:
        self.decode_queue_tokens += request.sequence_tokens
        self.transfer_queue.append(request)

    def admit_transfers(self) -> list[Request]:
        """Reserve blocks for queued transfers, FCFS; returns those that may start now."""
        started: list[Request] = []
        while self.transfer_queue:
            request = self.transfer_queue[0]
            total = blocks_for(request.sequence_tokens - 1)
            history = self.history.history_blocks(request, total)  # only new KV comes in
            self._reclaim(total - history, request.session_id)
            if total - history > self.free_blocks:
                break
            self.transfer_queue.popleft()
            if history:
                history = self.history.take_for_transfer(request)
            self.free_blocks -= total - history
            request.kv_blocks = total
            self.transferring[request.request_id] = request
            started.append(request)
        if self.prefix_cache is not None:
            self.prefix_cache.trim(self.free_blocks)
        return started

    def transfer_done(self, request: Request) -> None:
        del self.transferring[request.request_id]
        self.ready.append(request)  # still counted in decode_queue_tokens until it joins

    def _to_ready(self, request: Request) -> None:
        self.ready.append(request)
        self.decode_queue_tokens += request.sequence_tokens

    def detach(self, request: Request) -> bool:
        """Take a running decode out of the batch to move it elsewhere (between steps): its
        blocks are held as after a prefill until `release_handoff`. False if it is not
        decoding here (still prefilling, queued, or finished)."""
        if request.request_id not in self.running:
            return False
        self._drop_running(request)
        self.held[request.request_id] = (request, request.kv_blocks)
        request.kv_blocks = 0
        return True
