"""Run one planned batch so that an exception fails only the request that caused it.

`Engine.execute` mutates sequences as it goes: preempted sequences lose their KV, every
sequence of the batch may grow by blocks, and after the forward pass each sequence in turn
advances `computed_tokens`, appends its sampled token, sets `finish_reason` and feeds its
stop-string stream and its constraint matcher. An exception part-way leaves some sequences
advanced and others not.

`run_guarded` snapshots what a step changes (two integers and the finish reason per
sequence; taken on every step, it costs microseconds), and on an exception restores every
sequence of the batch to it (tokens past the snapshot dropped, the stop-string stream and
the structured-output matcher rebuilt from the kept tokens by `Engine.rewind`; blocks
grown for the step stay with their sequence, which needs them on the next try anyway). It
then re-runs the batch's sequences one at a time: those that succeed alone give their token
as if the batch had run; those that fail alone are the culprits. A culprit is blamed on its
content ("invalid_request") unless every sequence of a batch of several failed alone, which
points at the engine ("server_error"); a sequence whose structured-output constraint failed
(`ConstraintFailure`) is always its own culprit, and its message is the constraint's.

Sampling with a seed uses a per-request generator; a sequence that drew before the failure
and draws again on the re-run draws from an advanced stream (a temperature > 0 request
whose batch failed may then differ from a fault-free run; greedy requests never do).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.engine.engine import Engine
from pdserve.engine.sequence import TokenOutput
from pdserve.engine.structured_output import ConstraintFailure
from pdserve.instance.local_scheduler import BatchPlan

SequenceState = tuple[int, int, str]  # computed_tokens, len(token_ids), finish_reason


@dataclass
class GuardedResult:
    outputs: list[TokenOutput]
    failures: dict[int, tuple[str, str]] = field(default_factory=dict)  # id -> (kind, message)


def snapshot(engine: Engine, plan: BatchPlan) -> dict[int, SequenceState]:
    """Each sequence of the batch as the step starts (a sequence the plan preempted starts
    with no KV: `execute` drops it first)."""
    sequences = engine.sequences
    state = {}
    for request in plan.decodes:
        s = sequences[request.request_id]
        state[request.request_id] = (s.computed_tokens, len(s.token_ids), s.finish_reason)
    for request, _ in plan.chunks:
        s = sequences[request.request_id]
        state[request.request_id] = (s.computed_tokens, len(s.token_ids), s.finish_reason)
    for request in plan.preempted:
        if request.request_id in state:
            _, length, reason = state[request.request_id]
            state[request.request_id] = (0, length, reason)
    return state


def restore(engine: Engine, request_id: int, state: SequenceState) -> None:
    sequence = engine.sequences[request_id]
    computed, length, reason = state
    sequence.computed_tokens = computed
    engine.rewind(request_id, length)  # its stop-string stream and matcher follow
    sequence.finish_reason = reason


def describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def run_guarded(engine: Engine, plan: BatchPlan) -> GuardedResult:
    """`engine.execute(plan)`, with a failing sequence isolated instead of raising."""
    engine.attach_prefix_hits(plan)  # a prefix hit is where the sequence starts
    before = snapshot(engine, plan)
    try:
        return GuardedResult(engine.execute(plan))
    except Exception as batch_error:  # noqa: BLE001 - any engine error is isolated
        for request_id, state in before.items():
            restore(engine, request_id, state)
        items: list[tuple[list[int], list[tuple[int, int]]]] = [
            ([r.request_id], []) for r in plan.decodes]
        items += [([], [(r.request_id, tokens)]) for r, tokens in plan.chunks]
        result = GuardedResult([])
        errors: dict[int, BaseException] = {}
        for decodes, chunks in items:
            request_id = decodes[0] if decodes else chunks[0][0]
            try:
                result.outputs += engine.run(decodes, chunks)
            except Exception as err:  # noqa: BLE001
                restore(engine, request_id, before[request_id])
                errors[request_id] = err
        if not errors:  # the batch failed only as a whole: report nobody, keep the outputs
            return result
        engine_fault = len(items) > 1 and len(errors) == len(items)
        for request_id, err in errors.items():
            if isinstance(err, ConstraintFailure):  # its own constraint, whatever the others
                result.failures[request_id] = ("invalid_request", str(err))
            elif engine_fault:
                result.failures[request_id] = (
                    "server_error", f"the engine failed on every request of a batch: "
                                    f"{describe(batch_error)}")
            else:
                result.failures[request_id] = (
                    "invalid_request", f"this request made the engine fail: {describe(err)}")
        return result
