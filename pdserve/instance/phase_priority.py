"""Which phase a local scheduler serves first (FlowKV sec. 3.4, the hybrid scheduler).

  decode-first   pdserve's default: every running decode gets its token each step, prefill
                 chunks fill the rest of the token budget (Sarathi-style chunked prefill)
  prefill-first  FlowKV's (and vLLM's classic) default: while prefill work can run, a step
                 is prefill chunks only, up to the whole token budget; decodes run in the
                 steps where no prefill can
FlowKV's global controller switches an idle instance's priority to the overloaded phase for
a number of scheduling cycles (Alg. 1, imbalanced load) with a `SetPhasePriority` action.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from pdserve.types import attn_units

if TYPE_CHECKING:
    from pdserve.instance.local_scheduler import BatchPlan, LocalScheduler


class PhasePriority(enum.Enum):
    DECODE_FIRST = "decode-first"
    PREFILL_FIRST = "prefill-first"


def parse_phase_priority(value: str) -> PhasePriority:
    try:
        return PhasePriority(value)
    except ValueError:
        known = ", ".join(p.value for p in PhasePriority)
        raise ValueError(f"phase priority must be one of {known}, got {value!r}") from None


def prefill_only_plan(local: LocalScheduler) -> BatchPlan | None:
    """A prefill-first step: prefill chunks over the whole token budget, no decode; None
    when no prefill can run now (nothing queued, memory, batch cap), so decodes run."""
    from pdserve.instance.local_scheduler import BatchPlan

    if not len(local.prefills):
        return None
    chunks = local._plan_chunks(local.chunk_size_tokens, True)
    if not chunks:
        return None
    plan = BatchPlan([], chunks)
    if local._preempted_pending:
        plan.preempted, local._preempted_pending = local._preempted_pending, []
    for request, tokens in chunks:
        plan.prefill_tokens += tokens
        plan.prefill_attn_units += attn_units(tokens, request.prefilled_tokens)
    return plan
