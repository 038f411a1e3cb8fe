"""A simulated instance: the shared local scheduler plus a performance model for time.

It runs one batch at a time. A decode-only batch may be planned over many steps (a span);
when new work reaches the instance mid-span, `interrupt` cuts the span after the step in
progress, which is exactly where a step-by-step run would first see that work. Between
events, the load it shows policies (`InstanceLoad`) counts the steps of the span that have
already finished, so policies read the same numbers in both modes.
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.instance.decode_forecast import DecodeForecast, DecodeLoadTracker
from pdserve.instance.local_scheduler import BatchPlan, LocalScheduler
from pdserve.perf.fitted import DecodeSpan, PerfModel
from pdserve.sim.blocks import BlockTable
from pdserve.sim.step_noise import instance_noise


class SimInstance:
    def __init__(self, local: LocalScheduler, perf: PerfModel, view: ClusterView,
                 max_span_steps: int, seed: int) -> None:
        """`seed`: of the spread drawn around batches with prefill work, when `perf` has
        one (`sim/step_noise.py`)."""
        self.local = local
        self.instance_id = local.instance_id  # constants of the instance (`InstanceLoad`)
        self.total_blocks = local.total_blocks
        self._prefills = local.prefills  # its queues, read by the load's properties
        self._handoffs = local.handoffs
        self._budget = local.budget
        self.perf = perf
        self.noise = instance_noise(perf.prefill_step_cv, seed, local.instance_id)
        self.view = view  # read for the current time only
        self.max_span_steps = max_span_steps
        self.plan: BatchPlan | None = None
        self.start_s = 0.0
        self.end_s = 0.0
        self.version = 0  # bumps when the pending batch-done event is superseded
        self.blocks: BlockTable | None = None  # block ids, when transfers are aligned
        self.tracker: DecodeLoadTracker | None = None  # ARES's forecast, when asked for
        self.span: DecodeSpan | None = None  # the running span's clock (a multi-step plan;
        # it keeps the step it found last, so policies' many reads at one instant are cheap)

    # ---- running batches ----
    def start_batch(self, now_s: float) -> float | None:
        """Plan and start the next batch; returns its end time, or None when idle."""
        plan = self.local.plan(self.max_span_steps)
        self.plan = plan
        if plan is None:
            return None
        self.start_s = now_s
        if self.blocks is not None:
            self.blocks.start(plan)
        if plan.steps > 1:
            span = self.span = self.perf.span(len(plan.decodes), plan.decode_context_tokens)
            duration = span.time_s(plan.steps)
        else:
            self.span = None
            duration = self.perf.batch_time_s(len(plan.decodes), plan.decode_context_tokens,
                                              plan.prefill_tokens, plan.prefill_attn_units)
            if self.noise is not None and plan.prefill_tokens:
                duration *= self.noise.factor()
        self.end_s = now_s + duration
        self.version += 1
        return self.end_s

    def _steps_done(self, plan: BatchPlan) -> int:
        """Whole steps of the running span (`plan`, multi-step) done by now (inline in the
        hot `running_tokens` and `interrupt`)."""
        return self.span.steps_within(  # type: ignore[union-attr]
            self.view.now_s - self.start_s, plan.steps)

    def interrupt(self, now_s: float) -> float | None:
        """Cut a running span after its step in progress; returns the new end time if it
        changed (the caller schedules it), else None."""
        plan = self.plan
        if plan is None or plan.steps == 1:
            return None
        started = self.span.steps_within(  # type: ignore[union-attr]
            now_s - self.start_s, plan.steps) + 1
        if started >= plan.steps:
            return None
        self.local.shrink_span(plan, started)
        if self.blocks is not None:
            self.blocks.shrink(plan)
        self.end_s = self.start_s + self.span.time_s(started)  # type: ignore[union-attr]
        self.version += 1
        return self.end_s

    @property
    def decode_forecast(self) -> DecodeForecast | None:
        """ARES's worker-side report, computed when the rebalancer reads it (None unless
        the policy asked for forecasts). Mid-span, decodes count the steps already done."""
        tracker = self.tracker
        if tracker is None:
            return None
        plan, local = self.plan, self.local
        steps = self._steps_done(plan) if plan is not None and plan.steps > 1 else 0
        return tracker.forecast(local.instance_id, local.running.values(),
                                (*local.transfer_queue, *local.transferring.values(),
                                 *local.ready), steps)

    # ---- InstanceLoad ----
    # Policies read these many times per event: each reads the local scheduler's parts in
    # one call (the same figures as its own `InstanceLoad` properties), and the two
    # constants are plain attributes (`instance_id`, `total_blocks`, set in __init__), and
    # its queues and KV budget are held directly (the local scheduler builds them once).
    @property
    def prefill_queue_len(self) -> int:
        prefills = self._prefills
        return len(prefills.waiting) + len(prefills.active)

    @property
    def prefill_queue_tokens(self) -> int:
        return self._prefills.tokens

    @property
    def prefill_queue_attn_units(self) -> int:
        return self._prefills.attn_units

    @property
    def decode_queue_len(self) -> int:
        handoffs = self._handoffs
        return len(handoffs.transfer_queue) + len(handoffs.transferring) + len(handoffs.ready)

    @property
    def decode_queue_tokens(self) -> int:
        return self._handoffs.incoming_tokens

    @property
    def running_decodes(self) -> int:
        return len(self.local.running)

    @property
    def running_tokens(self) -> int:
        plan = self.plan
        if plan is None or plan.steps == 1:
            return self.local.running_tokens
        steps = self.span.steps_within(self.view.now_s - self.start_s,  # type: ignore[union-attr]
                                       plan.steps)
        return self.local.running_tokens + len(plan.decodes) * steps

    @property
    def used_blocks(self) -> int:
        plan = self.plan
        if plan is None or plan.steps == 1:
            return self._budget.used_blocks
        return self.local.blocks_after(plan, min(self._steps_done(plan) + 1, plan.steps))

    @property
    def preemptions_total(self) -> int:
        return self.local.preemptions_total

    @property
    def decode_steps_total(self) -> int:
        plan = self.plan
        if plan is None or plan.steps == 1:
            return self.local.decode_steps_total
        return self.local.decode_steps_total + self._steps_done(plan)

    @property
    def prefill_running_len(self) -> int:
        return self.local.prefill_running_len

    @property
    def sending_len(self) -> int:
        return self.local.sending_len

    @property
    def reclaimable_blocks(self) -> int:
        return self.local.reclaimable_blocks

    @property
    def busy_s_total(self) -> float:
        """Spans are decode-only, so their finished steps count as in decode_busy_s_total."""
        return self.local.busy_s_total + (self.decode_busy_s_total
                                          - self.local.decode_busy_s_total)

    @property
    def decode_busy_s_total(self) -> float:
        plan = self.plan
        if plan is None or plan.steps == 1:
            return self.local.decode_busy_s_total
        return self.local.decode_busy_s_total + self.span.time_s(  # type: ignore[union-attr]
            self._steps_done(plan))
