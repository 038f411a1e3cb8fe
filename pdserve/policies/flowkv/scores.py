"""Comprehensive load scores C^p_i, C^d_i and their side averages C^p, C^d (FlowKV Alg. 1
lines 8-15, appendix B.2).

Each status term is normalised to [0, 1] by saturating at a scale (`ScoreScales`:
term = min(1, value / scale)); utilisations and KV use are fractions already. The weighted
sums use one weight set per phase (`settings.py`), each summing to 1, so every score is in
[0, 1]. C^p averages C^p_i over the N prefill instances, C^d averages C^d_i over the M
decode instances (the instances' home sides: an instance lent to the other phase for a few
cycles still counts where it belongs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pdserve.policies.flowkv.settings import ScoreScales, ScoreWeights
from pdserve.policies.flowkv.status import NodeStatus


@dataclass(frozen=True, slots=True)
class NormalisedStatus:
    """Each indicator on [0, 1], the phase's queue terms apart."""

    prefill_running: float
    prefill_waiting: float
    prefill_sending: float
    decode_running: float
    decode_waiting: float
    swapped: float
    token_budget: float
    kv: float
    compute: float
    bandwidth: float


def _saturate(value: float, scale: float) -> float:
    return min(1.0, value / scale) if scale > 0 else 0.0


def normalise(status: NodeStatus, scales: ScoreScales, max_batch_size: int) -> NormalisedStatus:
    return NormalisedStatus(
        prefill_running=_saturate(status.prefill_running, scales.prefill_running),
        prefill_waiting=_saturate(status.prefill_waiting, scales.prefill_waiting),
        prefill_sending=_saturate(status.prefill_sending, scales.sending),
        decode_running=_saturate(status.decode_running,
                                 scales.decode_running_fraction * max_batch_size),
        decode_waiting=_saturate(status.decode_waiting, scales.decode_waiting),
        swapped=_saturate(status.preemptions_per_s, scales.preemptions_per_s),
        token_budget=_saturate(status.token_budget_steps, scales.token_budget_steps),
        kv=min(1.0, status.kv_utilisation),
        compute=min(1.0, status.compute_utilisation),
        bandwidth=min(1.0, status.bandwidth_utilisation))


def prefill_score(s: NormalisedStatus, w: ScoreWeights) -> float:
    """C^p_i (Alg. 1 line 10); prefill has no swapped queue in pdserve (recompute)."""
    return (w.running * s.prefill_running + w.waiting * s.prefill_waiting
            + w.sending * s.prefill_sending + w.token_budget * s.token_budget
            + w.kv * s.kv + w.compute * s.compute + w.bandwidth * s.bandwidth)


def decode_score(s: NormalisedStatus, w: ScoreWeights) -> float:
    """C^d_i (Alg. 1 line 11); a decode instance sends nothing (L_se decode is 0)."""
    return (w.running * s.decode_running + w.waiting * s.decode_waiting
            + w.swapped * s.swapped + w.token_budget * s.token_budget
            + w.kv * s.kv + w.compute * s.compute + w.bandwidth * s.bandwidth)


def side_average(scores: Sequence[float], members: Sequence[int]) -> float:
    """C^p = (1/N) sum C^p_i over the prefill side (C^d likewise); 0 for an empty side."""
    return sum(scores[i] for i in members) / len(members) if members else 0.0
