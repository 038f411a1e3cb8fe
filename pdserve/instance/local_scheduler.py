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
With `PhasePriority.PREFILL_FIRST` (`phase_priority.py`) a step is prefill chunks only while
any can run, and decodes run in the steps where none can.

The local scheduler owns and wires the parts it is made of:
  `KVBudget`        KV memory, in blocks of 16 tokens against `total_blocks`; the only writer
                    of the free-block count, which it refills by evicting idle session
                    history (`kv_budget.py`)
  `PrefillQueue`    waiting and partially prefilled requests (`prefill_queue.py`)
  `HandoffQueues`   KV held for a hand-off out, and incoming transfers, which wait in an FCFS
                    queue until their blocks can be reserved (`kv_handoff.py`)
  `SessionHistory`  multi-round sessions' kept history KV, AMPD (`sessions.py`)
  `PrefixCache`     optional, FlowKV's prefix reuse (`prefix_cache.py`)
It keeps the load it shows policies (the `InstanceLoad` protocol of `stats.py`) in counters
updated as requests move, so each read is O(1).

The scheduler never measures time: a driver asks for a `BatchPlan`, runs it (a performance
model in simulation, the engine in the live world) and hands it back to `complete`. A
decode-only plan may cover several steps (`max_steps`, a decode span), which the simulator
uses to advance a batch whose composition cannot change: the span reserves the blocks of the
longest run of steps in which no decode finishes and every block it needs is free, and
`shrink_span` cuts such a plan short when new work arrives, giving back the rest: exactly
the state that running the steps one by one gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.instance.kv_budget import KVBudget
from pdserve.instance.kv_handoff import HandoffQueues
from pdserve.instance.phase_priority import PhasePriority
from pdserve.instance.prefill_queue import PrefillQueue
from pdserve.instance.prefix_cache import PrefixCache
from pdserve.instance.queue_order import FCFSOrder, QueueOrder
from pdserve.instance.sessions import SessionCache, SessionHistory
from pdserve.types import KV_BLOCK_TOKENS, Request, attn_units, blocks_for

# read per plan: an enum member's lookup on its class is a descriptor call in 3.11
_PREFILL_FIRST = PhasePriority.PREFILL_FIRST


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


class BatchResult:
    """What a completed batch did to its requests (a plain class: one per batch, built
    without a dataclass's default factories)."""

    __slots__ = ("finished", "prefilled", "recomputed")

    def __init__(self) -> None:
        self.finished: list[Request] = []
        self.prefilled: list[Request] = []  # first prefill done, KV held here
        self.recomputed: list[Request] = []  # re-prefilled after preemption: emitted a
        # token (then decode here again, or finished, also in `finished`)


def _check_chunk_size(chunk_size_tokens: int) -> None:
    if chunk_size_tokens <= 0:
        raise ValueError(f"chunk_size_tokens must be positive, got {chunk_size_tokens}")


class LocalScheduler:
    """One instance's scheduler: where each request is (queued, prefilling, running, held
    for a hand-off, coming in) and the next batch. See the module docstring."""

    def __init__(self, instance_id: int, total_blocks: int, chunk_size_tokens: int,
                 max_batch_size: int, queue_order: QueueOrder | None = None,
                 phase_priority: PhasePriority = PhasePriority.DECODE_FIRST,
                 prefix_cache: PrefixCache | None = None) -> None:
        if total_blocks <= 0:
            raise ValueError(f"total_blocks must be positive, got {total_blocks}")
        _check_chunk_size(chunk_size_tokens)
        if max_batch_size <= 0:
            raise ValueError(f"max_batch_size must be positive, got {max_batch_size}")
        self.instance_id = instance_id
        self.total_blocks = total_blocks  # constant: the KV budget's size
        self.chunk_size_tokens = chunk_size_tokens
        self.max_batch_size = max_batch_size
        self.history = SessionHistory()  # sessions (AMPD): `instance/sessions.py`
        self.sessions: SessionCache = self.history.cache
        self.history_reads = self.history.reads
        self.transfer_reused_tokens = self.history.transfer_reused_tokens
        # the only writer of the free-block count; under pressure it evicts idle history
        self.budget = KVBudget(total_blocks, reclaim=self.history.reclaim)
        self.prefills = PrefillQueue(queue_order or FCFSOrder())
        self.running: dict[int, Request] = {}
        self.handoffs = HandoffQueues()
        # its containers (never replaced), for drivers and policies to read: `held`
        # (id -> (request, blocks)), `transfer_queue`, `transferring`, `ready`
        self.held = self.handoffs.held
        self.transfer_queue = self.handoffs.transfer_queue
        self.transferring = self.handoffs.transferring
        self.ready = self.handoffs.ready
        self._admit_counter = 0
        self._preempted_pending: list[Request] = []  # until a plan tells the engine
        # load counters, kept incrementally so reading them is O(1)
        self.running_tokens = 0
        self.preemptions_total = 0
        self.decode_steps_total = 0
        self.decode_busy_s_total = 0.0
        self.busy_s_total = 0.0
        # changed only by `set_chunk_size` / `set_phase_priority` (a policy's action)
        self.phase_priority = phase_priority  # `phase_priority.py`
        self.prefix_cache = prefix_cache  # `prefix_cache.py`; None: no prefix caching

    def set_chunk_size(self, chunk_size_tokens: int) -> None:
        """The per-step token budget from the next plan on (TaiChi's S_P / S_D, Arrow)."""
        _check_chunk_size(chunk_size_tokens)
        self.chunk_size_tokens = chunk_size_tokens

    def set_phase_priority(self, priority: PhasePriority) -> None:
        """Which phase a step serves first from the next plan on (`phase_priority.py`)."""
        self.phase_priority = priority

    @property
    def free_blocks(self) -> int:
        """Read only: the `KVBudget` alone changes it."""
        return self.budget.free_blocks

    # ---- load (`InstanceLoad`) ----
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
    def decode_queue_tokens(self) -> int:
        return self.handoffs.incoming_tokens

    @property
    def running_decodes(self) -> int:
        return len(self.running)

    @property
    def used_blocks(self) -> int:
        return self.budget.used_blocks

    @property
    def reclaimable_blocks(self) -> int:
        """Of `used_blocks`, the session history kept for later rounds that a request short
        of memory would evict (prefix-cache entries no request uses count as free already)."""
        return self.sessions.evictable_blocks

    @property
    def prefill_running_len(self) -> int:
        return len(self.prefills.active)

    @property
    def sending_len(self) -> int:
        return len(self.held)

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
        else:
            self.handoffs.drop_incoming(request)
        self._free_kv(request)

    # ---- batch formation ----
    def plan(self, max_steps: int = 1) -> BatchPlan | None:
        """Form the next batch, or None when there is nothing to run."""
        if not (self.running or self.ready or self.prefills.waiting or self.prefills.active):
            return None  # idle (a kick after a hand-off freed memory, say): nothing to plan
        plan = self._plan(max_steps)
        if self.prefix_cache is not None and plan is not None:
            self.prefix_cache.trim(self.budget.free_blocks)  # memory the batch took is not cache
        return plan

    def _plan(self, max_steps: int) -> BatchPlan | None:
        if self.ready:
            self._join_ready()
        if max_steps > 1 and self.running and not (self.prefills.active
                                                   or self.prefills.waiting):
            plan = self._plan_free_span(max_steps)
            if plan is not None:
                return plan
        chunks = self._prefill_first_chunks() \
            if self.phase_priority is _PREFILL_FIRST else None
        prefills = self.prefills
        if chunks:  # prefill first, and a prefill can run
            decodes: list[Request] = []
            context_tokens = 0
            admit_waiting = True
        else:  # decode first
            running = self.running
            if running:
                preemptions_before = self.preemptions_total
                self._grow_decodes()
                # a step that had to preempt admits no new prefill (vLLM does the same),
                # unless no decode is left to run: then waiting work must start or the
                # instance would stall
                admit_waiting = self.preemptions_total == preemptions_before or not running
                decodes = list(running.values())
            else:
                admit_waiting, decodes = True, []
            context_tokens = self.running_tokens
            chunks = self._plan_chunks(self.chunk_size_tokens - len(decodes), admit_waiting) \
                if prefills.active or (admit_waiting and prefills.waiting) else []
            if not decodes and not chunks:
                return None
        plan = BatchPlan(decodes, chunks, 1, context_tokens)
        if self._preempted_pending:  # rare: no list is built on the common path
            plan.preempted, self._preempted_pending = self._preempted_pending, []
        if chunks:
            for request, tokens in chunks:
                plan.prefill_tokens += tokens
                plan.prefill_attn_units += attn_units(tokens, request.prefilled_tokens)
        # Several steps at once only when no later step could differ: no prefill ran, and
        # waiting prefills were tried and blocked by memory (which only shrinks while the
        # decodes grow), the token budget or the batch cap (both fixed while nothing ends).
        elif max_steps > 1 and (admit_waiting or not prefills.waiting):
            plan.steps = self._reserve_span(decodes, max_steps)
        return plan

    def _prefill_first_chunks(self) -> list[tuple[Request, int]]:
        """A prefill-first step's chunks: over the whole token budget, no decode; none when
        no prefill can run now (nothing queued, memory, batch cap), so decodes run."""
        if not len(self.prefills):
            return []
        return self._plan_chunks(self.chunk_size_tokens, True)

    def _join_ready(self) -> None:
        ready = self.ready
        while ready and len(self.running) + len(self.prefills.active) < self.max_batch_size:
            request = self.handoffs.join_next()
            self._admit_counter += 1
            request.admit_seq = self._admit_counter
            self.running[request.request_id] = request
            self.running_tokens += request.sequence_tokens

    def _grow_decodes(self) -> None:
        running = self.running.values()
        needs = [-(-(r.input_tokens + r.generated_tokens) // KV_BLOCK_TOKENS) - r.kv_blocks
                 for r in running]
        total = sum(needs)
        if not total:
            return
        budget = self.budget
        if budget.try_take(total):  # the common case: every decode can grow
            for request, need in zip(running, needs, strict=True):
                request.kv_blocks += need
            return
        # idle history was reclaimed and still the decodes do not fit: preempt
        for request in list(running):
            if request.request_id not in self.running:
                continue  # preempted while making room for an older one
            need = blocks_for(request.sequence_tokens) - request.kv_blocks
            while need > budget.free_blocks:
                victim = self._newest_admitted()
                self._preempt(victim)
                if victim is request:
                    break
            else:
                budget.take(need)
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
            if self.prefix_cache is not None:
                self._reuse_prefix(self.prefix_cache, head)
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
        if not self.budget.try_take(need):
            return 0
        request.kv_blocks += need
        return tokens

    def _reuse_prefix(self, cache: PrefixCache, request: Request) -> None:
        """At admission: reference the cached blocks of the prompt's prefix and skip
        computing them."""
        if not request.hash_ids or request.cached_blocks or request.prefilled_tokens:
            return
        hits, taken = cache.reuse(request, self.budget.free_blocks)
        if not hits:
            return
        self.budget.take(taken)
        request.kv_blocks += hits * cache.kv_blocks_per_entry
        self.prefills.skip(request, hits * cache.block_tokens)

    # ---- decode spans (the simulator's fast advance) ----
    def _plan_free_span(self, max_steps: int) -> BatchPlan | None:
        """The common multi-step plan in one pass: decodes only, no prefill here, and the
        blocks of the whole span free. The same plan and state as growing the decodes
        (`_grow_decodes`) and then reserving the span (`_reserve_span`), which the general
        path does; None (nothing changed) when the span is one step or needs more blocks
        than are free (growing may then reclaim history or preempt)."""
        decodes = list(self.running.values())
        steps = _steps_until_a_decode_ends(decodes, max_steps)
        if steps <= 1:
            return None
        extra = steps - 1
        taken = 0
        for request in decodes:  # blocks_for(sequence_tokens + extra), inline (hot)
            taken += -(-(request.input_tokens + request.generated_tokens + extra)
                       // KV_BLOCK_TOKENS) - request.kv_blocks
        if not self.budget.take_if_free(taken):
            return None
        for request in decodes:
            request.kv_blocks = -(-(request.input_tokens + request.generated_tokens + extra)
                                  // KV_BLOCK_TOKENS)
        plan = BatchPlan(decodes, [], steps, self.running_tokens)
        if self._preempted_pending:
            plan.preempted, self._preempted_pending = self._preempted_pending, []
        return plan

    def _reserve_span(self, decodes: list[Request], max_steps: int) -> int:
        """Longest run of steps with an unchanged batch: no decode finishes before its last
        step and every block it needs is free. Reserves those blocks."""
        steps = _steps_until_a_decode_ends(decodes, max_steps)
        if steps <= 1:
            return 1
        free = self.budget.free_blocks
        extra = steps - 1
        taken = 0
        for request in decodes:
            taken += -(-(request.input_tokens + request.generated_tokens + extra)
                       // KV_BLOCK_TOKENS) - request.kv_blocks
        if taken > free:
            low, high = 1, steps  # low fits (its blocks were allocated by _grow_decodes)
            while high - low > 1:
                mid = (low + high) // 2
                if self._span_blocks(decodes, mid) <= free:
                    low = mid
                else:
                    high = mid
            steps = low
            extra = steps - 1
            taken = 0
            for request in decodes:
                blocks = -(-(request.input_tokens + request.generated_tokens + extra)
                           // KV_BLOCK_TOKENS)
                taken += blocks - request.kv_blocks
                request.kv_blocks = blocks
        else:
            for request in decodes:
                request.kv_blocks = -(-(request.input_tokens + request.generated_tokens
                                        + extra) // KV_BLOCK_TOKENS)
        self.budget.take(taken)
        return steps

    @staticmethod
    def _span_blocks(decodes: list[Request], steps: int) -> int:
        """Blocks the decodes need beyond what they hold to run `steps` steps."""
        extra = steps - 1
        return sum(-(-(r.input_tokens + r.generated_tokens + extra) // KV_BLOCK_TOKENS)
                   - r.kv_blocks for r in decodes)

    def shrink_span(self, plan: BatchPlan, steps: int) -> None:
        """Cut a multi-step plan to its first `steps` steps, giving back the blocks reserved
        for the rest; the state is then what running it step by step would have reached."""
        if not 1 <= steps <= plan.steps:
            raise ValueError(f"steps must be in 1..{plan.steps}, got {steps}")
        freed = 0
        extra = steps - 1
        for request in plan.decodes:  # blocks_for(sequence_tokens + extra), inline (hot)
            blocks = -(-(request.input_tokens + request.generated_tokens + extra)
                       // KV_BLOCK_TOKENS)
            freed += request.kv_blocks - blocks
            request.kv_blocks = blocks
        self.budget.give(freed)
        plan.steps = steps

    def blocks_after(self, plan: BatchPlan, steps: int) -> int:
        """Blocks in use once `steps` steps of `plan` have been scheduled (for a view of an
        instance part-way through a multi-step plan)."""
        extra = steps - 1
        excess = 0
        for r in plan.decodes:  # blocks_for(sequence_tokens + extra), inline (hot)
            excess += r.kv_blocks + (r.input_tokens + r.generated_tokens + extra) \
                // -KV_BLOCK_TOKENS
        return self.budget.used_blocks - excess

    # ---- batch completion ----
    def complete(self, plan: BatchPlan, duration_s: float = 0.0,
                 stopped: frozenset[int] = frozenset()) -> BatchResult:
        """Apply a batch that has run all its steps.

        `stopped` names requests the engine ended early (EOS or a stop string)."""
        result = BatchResult()
        self.busy_s_total += duration_s
        decodes = plan.decodes
        if decodes:
            steps = plan.steps
            self.decode_steps_total += steps
            self.decode_busy_s_total += duration_s
            cobatched = plan.prefill_tokens  # TaiChi's interference (prefills are one step)
            if cobatched:
                for request in decodes:
                    request.cobatched_prefill_tokens += cobatched
            self.running_tokens += steps * len(decodes)
            for request in decodes:
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
        if self.prefix_cache is not None:
            self.prefix_cache.donate(request)
        first = request.generated_tokens == 0
        request.generated_tokens += 1  # the prefill's last position samples a token
        if not first:
            result.recomputed.append(request)
        if request.generated_tokens >= request.output_tokens or request.request_id in stopped:
            self._release_finished(request)
            result.finished.append(request)
        elif first:
            self.handoffs.hold(request)
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
            self.budget.give(freed)

    def _drop_running(self, request: Request) -> None:
        del self.running[request.request_id]
        self.running_tokens -= request.sequence_tokens

    def _free_kv(self, request: Request) -> None:
        blocks, request.kv_blocks = request.kv_blocks, 0
        if request.cached_blocks and self.prefix_cache is not None:  # not its own blocks
            blocks += self.prefix_cache.release_entries(request)
        self.budget.give(blocks)

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

    # ---- KV going out ----
    def continue_in_place(self, request: Request) -> None:
        """Decode a request here whose prefill this instance just finished."""
        self.handoffs.keep_in_place(request)

    def release_handoff(self, request: Request) -> None:
        """Free the KV of a request that has been transferred to another instance. Only this
        instance's count is touched: in simulation the target shares the `Request` object
        and has already put its own reservation in `request.kv_blocks`."""
        blocks = self.handoffs.release(request)
        if request.cached_blocks and self.prefix_cache is not None:  # not its own blocks
            blocks += self.prefix_cache.release_entries(request)
        self.budget.give(blocks)

    def detach(self, request: Request) -> bool:
        """Take a running decode out of the batch to move it elsewhere (between steps): its
        blocks are held as after a prefill until `release_handoff`. False if it is not
        decoding here (still prefilling, queued, or finished)."""
        if request.request_id not in self.running:
            return False
        self._drop_running(request)
        self.handoffs.hold(request)
        return True

    # ---- KV coming in ----
    def enqueue_transfer_in(self, request: Request) -> None:
        self.handoffs.queue_transfer(request)

    def admit_transfers(self) -> list[Request]:
        """Reserve blocks for queued transfers, FCFS; returns those that may start now."""
        started: list[Request] = []
        queue = self.transfer_queue
        while queue:
            request = queue[0]
            total = blocks_for(request.sequence_tokens - 1)
            history = self.history.history_blocks(request, total)  # only new KV comes in
            if not self.budget.try_take(total - history, request.session_id):
                break
            self.handoffs.start_transfer()
            if history:  # the history's own count, which may exceed the sequence's
                self.budget.give(self.history.take_for_transfer(request) - history)
            request.kv_blocks = total
            started.append(request)
        if self.prefix_cache is not None:
            self.prefix_cache.trim(self.budget.free_blocks)
        return started

    def transfer_done(self, request: Request) -> None:
        self.handoffs.transfer_done(request)

    # ---- session history (AMPD) ----
    def history_reads_due(self) -> list[Request]:
        """Remote session rounds whose history read the driver should start now."""
        return self.history.reads_due(self.prefills)

    def history_read_done(self, request: Request) -> None:
        self.history.read_done(request)

    def adopt_history(self, session_id: int, tokens: int, blocks: int) -> bool:
        """Hold a session's history copied in from another instance (live remote
        prefills); False when there is no room for it."""
        if not self.budget.try_take(blocks, session_id):
            return False
        self.budget.give(self.sessions.store(session_id, tokens, blocks))
        return True

    def drop_session_history(self, session_id: int) -> int:
        """Forget a session's kept history (its next round goes elsewhere, or copying it
        in failed); returns the blocks freed."""
        freed = self.sessions.drop(session_id)
        self.budget.give(freed)
        return freed

    def trim_session_history(self, session_id: int, tokens: int) -> int:
        """Keep only the first `tokens` of a session's history (0: forget it), as far as a
        live engine reuses it; returns the blocks freed."""
        freed = self.sessions.trim(session_id, tokens)
        self.budget.give(freed)
        return freed


def _steps_until_a_decode_ends(decodes: list[Request], max_steps: int) -> int:
    """At most `max_steps`, and no more steps than the decode nearest its end has left."""
    steps = max_steps
    for request in decodes:
        left = request.output_tokens - request.generated_tokens
        if left < steps:
            steps = left
    return steps
