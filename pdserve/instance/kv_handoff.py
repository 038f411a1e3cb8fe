"""Requests whose KV moves between instances, as one local scheduler tracks them.

  out   `held`: prefilled here (or a running decode detached for a migration), the KV kept
        for a hand-off until it is copied out (`release`) or decoded in place (`to_ready`)
  in    `transfer_queue`: hand-offs waiting, FCFS, until their blocks can be reserved;
        `transferring`: blocks reserved, KV being copied in; `ready`: KV here, waiting to
        join the running batch (under its size cap)

`HandoffQueues` owns these queues and the token count of the incoming ones (the decode
queue policies read, `InstanceLoad.decode_queue_tokens`), kept incrementally. It counts no
memory: the local scheduler reserves and frees the blocks with its `KVBudget`.
"""

from __future__ import annotations

from collections import deque

from pdserve.types import Request


class HandoffQueues:
    __slots__ = ("held", "transfer_queue", "transferring", "ready", "incoming_tokens")

    def __init__(self) -> None:
        self.held: dict[int, tuple[Request, int]] = {}  # request id -> (request, blocks)
        self.transfer_queue: deque[Request] = deque()
        self.transferring: dict[int, Request] = {}
        self.ready: deque[Request] = deque()
        self.incoming_tokens = 0  # sequence tokens of the three incoming queues

    # ---- going out ----
    def hold(self, request: Request) -> None:
        """Keep the request's KV for a hand-off; its blocks are counted here meanwhile."""
        self.held[request.request_id] = (request, request.kv_blocks)
        request.kv_blocks = 0

    def release(self, request: Request) -> int:
        """The KV was copied out (or is dropped): returns the blocks it held here."""
        _, blocks = self.held.pop(request.request_id)
        return blocks

    def keep_in_place(self, request: Request) -> None:
        """Decode here the request whose KV is held: it waits to join the batch."""
        held, blocks = self.held.pop(request.request_id)
        held.kv_blocks = blocks
        self.to_ready(held)

    # ---- coming in ----
    def queue_transfer(self, request: Request) -> None:
        self.incoming_tokens += request.sequence_tokens
        self.transfer_queue.append(request)

    def start_transfer(self) -> Request:
        """The queue's head got its blocks: its copy starts."""
        request = self.transfer_queue.popleft()
        self.transferring[request.request_id] = request
        return request

    def transfer_done(self, request: Request) -> None:
        del self.transferring[request.request_id]
        self.ready.append(request)  # still counted in incoming_tokens until it joins

    def to_ready(self, request: Request) -> None:
        self.ready.append(request)
        self.incoming_tokens += request.sequence_tokens

    def join_next(self) -> Request:
        """The oldest ready request leaves to join the running batch."""
        request = self.ready.popleft()
        self.incoming_tokens -= request.sequence_tokens
        return request

    def drop_incoming(self, request: Request) -> bool:
        """Remove a request from the incoming queues (a cancelled client); False if it is
        in none of them."""
        if request in self.ready:
            self.ready.remove(request)
        elif request in self.transfer_queue:
            self.transfer_queue.remove(request)
        elif self.transferring.pop(request.request_id, None) is None:
            return False
        self.incoming_tokens -= request.sequence_tokens
        return True
