"""A live instance: a worker process running the shared local scheduler and the engine.

Loop: take every pending command (block only when there is nothing to run), start queued
KV transfers whose blocks are free, then plan one batch, execute it, complete it, and report
the sampled tokens with an `InstanceStats` snapshot. A first prefill that finishes is
reported with its hand-off (the driver decides where it decodes). One torch thread.

The interface is messages over one connection (`messages.py`), so a Ray actor can host the
same loop later.
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection

import torch

from pdserve.engine.engine import Engine
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.loader import load_model
from pdserve.engine.transfer import attach_pool
from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.stats import InstanceStats
from pdserve.live.messages import (
    AddRequest,
    AdoptKV,
    Cancel,
    Command,
    ContinueInPlace,
    Detach,
    Detached,
    Prefilled,
    ReleaseKV,
    SetChunk,
    Shutdown,
    StepDone,
    Transferred,
    WorkerError,
    WorkerReady,
)
from pdserve.types import Request


class Worker:
    def __init__(self, instance_id: int, model_name: str, seed: int, num_blocks: int,
                 chunk_size_tokens: int, max_batch_size: int, connection: Connection) -> None:
        torch.set_num_threads(1)
        self.instance_id = instance_id
        self.connection = connection
        model, tokenizer = load_model(model_name, seed)
        self.engine = Engine(model, tokenizer, num_blocks,
                             shared_name=f"pdserve-{os.getpid()}-{instance_id}")
        self.local = LocalScheduler(instance_id, num_blocks, chunk_size_tokens, max_batch_size)
        self.requests: dict[int, Request] = {}
        self.handoffs: dict[int, AdoptKV] = {}
        self.peers: dict[str, PagedKVPool] = {}
        self.running = True

    def stats(self) -> InstanceStats:
        return InstanceStats.of(self.local)

    def serve(self) -> None:
        assert self.engine.pool.shared_name is not None
        self.connection.send(WorkerReady(self.instance_id, self.engine.pool.shared_name,
                                         self.stats()))
        try:
            idle = True
            while self.running:
                while self.connection.poll(None if idle else 0):
                    self.handle(self.connection.recv())
                    if not self.running:
                        return
                    idle = False
                self.start_transfers()
                idle = not self.step()
        finally:
            for pool in self.peers.values():
                pool.close()
            self.engine.pool.close()

    # ---- commands ----
    def handle(self, command: Command) -> None:
        local, engine = self.local, self.engine
        if isinstance(command, AddRequest):
            request = Request(command.request_id, 0.0, len(command.prompt_ids),
                              command.params.max_tokens)
            try:
                engine.add(command.request_id, list(command.prompt_ids), command.params)
            except ValueError as err:
                self.connection.send(WorkerError(self.instance_id, command.request_id, str(err)))
                return
            self.requests[request.request_id] = request
            local.enqueue_prefill(request)
        elif isinstance(command, ContinueInPlace):
            local.continue_in_place(self.requests[command.request_id])
        elif isinstance(command, AdoptKV):
            handoff = command.handoff
            request = Request(handoff.request_id, 0.0, handoff.prompt_tokens,
                              handoff.params.max_tokens,
                              generated_tokens=len(handoff.token_ids) - handoff.prompt_tokens)
            self.requests[request.request_id] = request
            self.handoffs[request.request_id] = command
            local.enqueue_transfer_in(request)
        elif isinstance(command, Detach):
            request = self.requests.get(command.request_id)
            moved = request is not None and local.detach(request)
            self.connection.send(Detached(self.instance_id, command.request_id,
                                          engine.export(command.request_id) if moved else None))
        elif isinstance(command, ReleaseKV):
            request = self.requests.pop(command.request_id)
            local.release_handoff(request)
            engine.release(command.request_id)
        elif isinstance(command, Cancel):
            request = self.requests.pop(command.request_id, None)
            if request is not None:
                local.abort(request)
                self.handoffs.pop(command.request_id, None)
                if command.request_id in engine.sequences:
                    engine.release(command.request_id)
        elif isinstance(command, SetChunk):
            local.chunk_size_tokens = command.chunk_size_tokens
        elif isinstance(command, Shutdown):
            self.running = False

    def start_transfers(self) -> None:
        for request in self.local.admit_transfers():
            handoff = self.handoffs.pop(request.request_id).handoff
            assert handoff.pool_name is not None
            if handoff.pool_name not in self.peers:
                self.peers[handoff.pool_name] = attach_pool(handoff.pool_name, self.engine.pool)
            self.engine.import_from(handoff, self.peers[handoff.pool_name])
            self.local.transfer_done(request)
            self.connection.send(Transferred(self.instance_id, request.request_id))

    # ---- one batch ----
    def step(self) -> bool:
        plan = self.local.plan()
        if plan is None:
            return False
        start = time.perf_counter()
        outputs = self.engine.execute(plan)
        stopped = frozenset(o.request_id for o in outputs if o.finish_reason)
        result = self.local.complete(plan, time.perf_counter() - start, stopped)
        tokens = tuple((o.request_id, o.token_id, o.finish_reason, o.logprob) for o in outputs)
        self.connection.send(StepDone(self.instance_id, tokens, self.stats()))
        for request in result.prefilled:
            self.connection.send(Prefilled(self.instance_id,
                                           self.engine.export(request.request_id)))
        for request in result.finished:
            self.requests.pop(request.request_id, None)
            self.engine.release(request.request_id)
        return True


def worker_main(instance_id: int, model_name: str, seed: int, num_blocks: int,
                chunk_size_tokens: int, max_batch_size: int, connection: Connection) -> None:
    """Entry point of a worker process."""
    Worker(instance_id, model_name, seed, num_blocks, chunk_size_tokens, max_batch_size,
           connection).serve()
