"""How the planner splits N instances between two pools (prefill and decode, or TaiChi's
P-heavy and D-heavy): every split up to `EVERY_SPLIT_UP_TO` instances, and above it a grid
fine where a split's ratio moves fastest (the first and last 16 counts) and in steps of
1/64 of N between, so a plan on hundreds of GPUs screens about a hundred splits a
degree instead of every one of them (1,023 at 1,024 GPUs and TP 1: 314,000 candidates over
all policies, 92 s of screening before the search began).
"""

from __future__ import annotations

EVERY_SPLIT_UP_TO = 64  # instances: below and at this, every split is a candidate
_END_COUNTS = 16  # above it, every split within this many instances of either end
_STEPS = 64  # and between, N * k / _STEPS for k = 1 .. _STEPS - 1


def split_counts(instances: int) -> list[int]:
    """The counts 1 .. instances - 1 the first pool is given (the second takes the rest)."""
    if instances <= EVERY_SPLIT_UP_TO:
        return list(range(1, instances))
    counts = {*range(1, _END_COUNTS + 1), *range(instances - _END_COUNTS, instances),
              *(round(instances * k / _STEPS) for k in range(1, _STEPS))}
    return sorted(c for c in counts if 0 < c < instances)
