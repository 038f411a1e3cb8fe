"""The instance-side scheduler, one piece of code for the simulated and the live instance.

Each step it forms one batch, in this order:
  1. requests whose KV is ready (transferred in, or prefilled here and kept) join the
     running decodes, up to `max_batch_size` sequences;
  2. every running decode gets one token (decode first); when its KV cannot grow by a block,
     the newest admitted sequence is preempted and later recomputed from its tokens, as vLLM
     does;
  3. the rest of the per-step token budget (`chunk_size_tokens` minus the decodes) goes to
     prefill chunks: partially prefilled requests first, then the waiting queue in the order
     the `QueueOrder` hook keeps.
KV memory is counted in blocks of 16 tokens against `total_blocks`. Incoming KV transfers
wait in an FCFS queue until their blocks can be reserved.

The scheduler never measures time: a driver asks for a `BatchPlan`, runs it (a performance
model in simulation, the engine in the live world) and hands it back to `complete`. A
decode-only plan may cover several steps (`max_steps`), which the simulator uses to advance
a batch whose composition cannot change; `shrink_span` cuts such a plan short when new work
arrives, giving exactly the state that running the steps one by one gives.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pdserve.instance.decode_span import DecodeSpans
from pdserve.instance.kv_handoff import KVHandoffs
from pdserve.instance.load_counters import LoadCounters
from pdserve.instance.phase_priority import PhasePriority, prefill_only_plan
from pdserve.instance.prefill_queue import PrefillQueue
from pdserve.instance.prefix_cache import PrefixCache, donate_prefix, release_prefix, reuse_prefix
from pdserve.instance.queue_order import FCFSOrder, QueueOrder
from pdserve.instance.sessions import SessionHistory
from pdserve.types import KV_BLOCK_TOKENS, Request, attn_units, blocks_for


@dataclass(slots=True)
class BatchPlan:
    """One batch: each decode advances `steps` tokens; each chunk computes its tokens once."""

    decodes: list[Request]
    chunks: list[tuple[Request, int]]
    steps: int = 1
    decode_context_tokens: int = 0  # sum of sequence lengths at the first step
    prefill_tokens: int = 0
    prefill_attn_units: int = 0
    preempted: Sequence[Request] = ()  # lost their KV since the previous plan


@dataclass(slots=True)
class BatchResult:
    finished: list[Request] = field(default_factory=list)
    prefilled: list[Request] = field(default_factory=list)  # first prefill done, KV held here
    recomputed: list[Request] = field(default_factory=list)  # re-prefilled after preemption:
    # emitted a token (then decode here again, or finished, also in `finished`)


class LocalScheduler(LoadCounters, DecodeSpans, KVHandoffs):
    def __init__(self, instance_id: int, total_blocks: int, chunk_size_tokens: int,
                 max_batch_size: int = 256, queue_order: QueueOrder | None = None) -> None:
        if total_blocks <= 0:
            raise ValueError(f"total_blocks must be positive, got {total_blocks}")
        if chunk_size_tokens <= 0:
            raise ValueError(f"chunk_size_tokens must be positive, got {chunk_size_tokens}")
        if max_batch_size <= 0:
            raise ValueError(f"max_batch_size must be positive, got {max_batch_size}")
        self.instance_id = instance_id
        self.total_blocks = total_blocks
        self.free_blocks = total_blocks
        self.chunk_size_tokens = chunk_size_tokens
        self.max_batch_size = max_batch_size
        self.prefills = PrefillQueue(queue_order or FCFSOrder())
        self.running: dict[int, Request] = {}
        self.ready: deque[Request] = deque()
        self.transfer_queue: deque[Request] = deque()
        self.transferring: dict[int, Request] = {}
        self.held: dict[int, tuple[Request, int]] = {}  # prefilled here, awaiting hand-off
        self._admit_counter = 0
        self._preempted_pending: list[Request] = []  # until a plan tells the engine
        self.history = SessionHistory()  # sessions (AMPD): `instance/sessions.py`
        self.sessions = self.history.cache
        self.history_reads = self.history.reads
        self.transfer_reused_tokens = self.history.transfer_reused_tokens
        # load counters, kept incrementally so reading them is O(1)
        self.decode_queue_tokens = 0
        self.running_tokens = 0
        self.preemptions_total = 0
        self.decode_steps_total = 0
        self.decode_busy_s_total = 0.0
        self.busy_s_total = 0.0
        self.phase_priority = PhasePriority.DECODE_FIRST  # `phase_priority.py`
        self.prefix_cache: PrefixCache | None = None  # `prefix_cache.py`

    # ---- work coming in ----
    def enqueue_prefill(self, request: Request) -> None:
        """Queue a prefill; a session round takes its history over or waits to read it."""
        self.history.on_enqueue(request)
        self.prefills.push(request)

    def abort(self, request: Request) -> None:
        """Drop a request wherever it is (a cancelled client) and free its blocks. Not
        while it is in a planned batch: the driver aborts between steps."""
        rid = request.request_id
        self.history.forget(request)
        if rid in self.held:
            self.release_handoff(request)
            return
        if rid in self.running:
            self._drop_running(request)
        elif rid in self.prefills.active or request in self.prefills.waiting:
            self.prefills.drop(request)
        elif request in self.ready or request in self.transfer_queue or rid in self.transferring:
            for queue in (self.ready, self.transfer_queue):
                if request in queue:
                    queue.remove(request)
            self.transferring.pop(rid, None)
            self.decode_queue_tokens -= request.sequence_tokens
        self._free_kv(request)

    # ---- batch formation ----
    def plan(self, max_steps: int = 1) -> BatchPlan | None:
        """Form the next batch, or None when there is nothing to run."""
        plan = self._plan(max_steps)
        if self.prefix_cache is not None and plan is not None:
            self.prefix_cache.trim(self.free_blocks)  # memory the batch took is not cache
        return plan

    def _plan(self, max_steps: int) -> BatchPlan | None:
        self._join_ready()
        if self.phase_priority is PhasePriority.PREFILL_FIRST:
            prefill_first = prefill_only_plan(self)
            if prefill_first is not None:
                return prefill_first
        preemptions_before = self.preemptions_total
        self._grow_decodes()
        decodes = list(self.running.values())
        # a step that had to preempt admits no new prefill (vLLM does the same), unless no
        # decode is left to run: then waiting work must start or the instance would stall
        admit_waiting = self.preemptions_total == preemptions_before or not decodes
        chunks = self._plan_chunks(self.chunk_size_tokens - len(decodes), admit_waiting)
        if not decodes and not chunks:
            return None
        plan = BatchPlan(decodes, chunks, decode_context_tokens=self.running_tokens)
        if self._preempted_pending:  # rare: no list is built on the common path
            plan.preempted, self._preempted_pending = self._preempted_pending, []
        for request, tokens in chunks:
            plan.prefill_tokens += tokens
            plan.prefill_attn_units += attn_units(tokens, request.prefilled_tokens)
        # Several steps at once only when no later step could differ: no prefill ran, and
        # waiting prefills were tried and blocked by memory (which only shrinks while the
        # decodes grow), the token budget or the batch cap (both fixed while nothing ends).
        if not chunks and max_steps > 1 and (admit_waiting or not self.prefills.waiting):
            plan.steps = self._reserve_span(decodes, max_steps)
        return plan

    def _join_ready(self) -> None:
        while self.ready and len(self.running) + len(self.prefills.active) < self.max_batch_size:
            request = self.ready.popleft()
            self.decode_queue_tokens -= request.sequence_tokens
            self._admit_counter += 1
            request.admit_seq = self._admit_counter
            self.running[request.request_id] = request
            self.running_tokens += request.sequence_tokens

    def _grow_decodes(self) -> None:
        running = self.running.values()
        needs = [-(-(r.input_tokens + r.generated_tokens) // KV_BLOCK_TOKENS) - r.kv_blocks
                 for r in running]
        total = sum(needs)
        if total > self.free_blocks:  # only then may idle history make room
            self._reclaim(total)
        if total <= self.free_blocks:  # the common case: every decode can grow
            if total:
                self.free_blocks -= total
                for request, need in zip(running, needs, strict=True):
                    request.kv_blocks += need
            return
        for request in list(running):
            if request.request_id not in self.running:
                continue  # preempted while making room for an older one
            need = blocks_for(request.sequence_tokens) - request.kv_blocks
            while need > self.free_blocks:
                victim = self._newest_admitted()
                self._preempt(victim)
                if victim is request:
                    break
            else:
                self.free_blocks -= need
                request.kv_blocks += need

    def _plan_chunks(self, budget_tokens: int, admit_waiting: bool) -> list[tuple[Request, int]]:
        chunks: list[tuple[Request, int]] = []
        prefills = self.prefills
        for request in prefills.active.values():
            if budget_tokens <= 0:
                return chunks
            tokens = self._allocate_chunk(request, budget_tokens)
            if tokens == 0:
                return chunks  # out of memory: later prefills wait too (FCFS)
            chunks.append((request, tokens))
            budget_tokens -= tokens
        while (admit_waiting and budget_tokens > 0 and prefills.waiting
               and len(self.running) + len(prefills.active) < self.max_batch_size):
            head = prefills.peek()
            if self.history.waiting_for_read(head):
                break
            reuse_prefix(self, head)
            tokens = self._allocate_chunk(head, budget_tokens)
            if tokens == 0:
                break
            request = prefills.admit_head()
            self._admit_counter += 1
            request.admit_seq = self._admit_counter
            chunks.append((request, tokens))
            budget_tokens -= tokens
        return chunks

    def _allocate_chunk(self, request: Request, budget_tokens: int) -> int:
        remaining = request.prefill_target_tokens - request.prefilled_tokens
        tokens = min(remaining, budget_tokens)
        need = blocks_for(request.prefilled_tokens + tokens) - request.kv_blocks
        self._reclaim(need)
        if need > self.free_blocks:
            return 0
        self.free_blocks -= need
        request.kv_blocks += need
        return tokens

    # ---- batch completion ----
    def complete(self, plan: BatchPlan, duration_s: float = 0.0,
                 stopped: frozenset[int] = frozenset()) -> BatchResult:
        """Apply a batch that has run all its steps.

        `stopped` names requests the engine ended early (EOS or a stop string)."""
        steps = plan.steps
        result = BatchResult()
        self.busy_s_total += duration_s
        if plan.decodes:
            self.decode_steps_total += steps
            self.decode_busy_s_total += duration_s
        cobatched = plan.prefill_tokens  # TaiChi's interference (prefills are one step)
        if cobatched:
            for request in plan.decodes:
                request.cobatched_prefill_tokens += cobatched
        self.running_tokens += steps * len(plan.decodes)
        for request in plan.decodes:
            request.generated_tokens += steps
            if request.generated_tokens >= request.output_tokens or \
                    request.request_id in stopped:
                self._finish(request, result)
        for request, tokens in plan.chunks:
            self._advance_prefill(request, tokens, stopped, result)
        return result

    def _advance_prefill(self, request: Request, tokens: int, stopped: frozenset[int],
                         result: BatchResult) -> None:
        if not self.prefills.advance(request, tokens):
            return
        donate_prefix(self, request)
        first = request.generated_tokens == 0
        request.generated_tokens += 1  # the prefill's last position samples a token
        if not first:
            result.recomputed.append(request)
        if request.generated_tokens >= request.output_tokens or request.request_id in stopped:
            self._release_finished(request)
            result.finished.append(request)
        elif first:
            self.held[request.request_id] = (request, request.kv_blocks)
            request.kv_blocks = 0
            result.prefilled.append(request)
        else:  # recomputed after preemption: resume decoding here
            self.running[request.request_id] = request
            self.running_tokens += request.sequence_tokens

    def _finish(self, request: Request, result: BatchResult) -> None:
        self._drop_running(request)
        self._release_finished(request)
        result.finished.append(request)

    def _release_finished(self, request: Request) -> None:
        freed = self.history.keep(request)  # a session round keeps its KV for the next
        if freed is None:
            self._free_kv(request)
        else:
            self.free_blocks += freed

    def _drop_running(self, request: Request) -> None:
        del self.running[request.request_id]
        self.running_tokens -= request.sequence_tokens

    def _free_kv(self, request: Request) -> None:
        self.free_blocks += request.kv_blocks
        request.kv_blocks = 0
        release_prefix(self, request)

    # ---- preemption ----
    def _newest_admitted(self) -> Request:
        candidates = [*self.running.values(), *self.prefills.active.values()]
        return max(candidates, key=lambda r: r.admit_seq)

    def _preempt(self, request: Request) -> None:
        if request.request_id in self.running:
            self._drop_running(request)
        else:
            self.prefills.drop(request)
        self._free_kv(request)
        request.preemptions += 1
        self.preemptions_total += 1
        self._preempted_pending.append(request)
        self.prefills.push_front(request)
