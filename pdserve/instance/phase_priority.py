"""Which phase a local scheduler serves first (FlowKV sec. 3.4, the hybrid scheduler).

  decode-first   pdserve's default: every running decode gets its token each step, prefill
                 chunks fill the rest of the token budget (Sarathi-style chunked prefill)
  prefill-first  FlowKV's (and vLLM's classic) default: while prefill work can run, a step
                 is prefill chunks only, up to the whole token budget; decodes run in the
                 steps where no prefill can
FlowKV's global controller switches an idle instance's priority to the overloaded phase for
a number of scheduling cycles (Alg. 1, imbalanced load) with a `SetPhasePriority` action.
The local scheduler reads its `phase_priority` when it plans a step.
"""

from __future__ import annotations

import enum


class PhasePriority(enum.Enum):
    DECODE_FIRST = "decode-first"
    PREFILL_FIRST = "prefill-first"


def parse_phase_priority(value: str) -> PhasePriority:
    try:
        return PhasePriority(value)
    except ValueError:
        known = ", ".join(p.value for p in PhasePriority)
        raise ValueError(f"phase priority must be one of {known}, got {value!r}") from None
