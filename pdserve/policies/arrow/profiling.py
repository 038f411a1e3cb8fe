"""Arrow's start-up profiling: the TTFT predictor and Max Running Tokens (Arrow sec. 5.3).

TTFT predictor: at cluster start each instance type is profiled with single requests of
several input lengths on an idle instance, and TTFT = a + b*n + c*n^2 is fitted by least
squares. The lengths double from 16 up to the longest prompt an instance can serve (the
model's context, `MAX_CONTEXT_TOKENS`, or the instance's KV capacity if smaller), so no
prompt of a trace is predicted by extrapolation, and the fit minimises absolute error (see
`TtftPredictor.fit`). What remains is the chunk staircase: with chunked prefill each chunk
adds one batch overhead, which a quadratic can only average.
In the simulator the "measurement" runs one request through the shared local scheduler
and the performance model (so chunking is included); in the live world the same fit takes
measured samples.
An instance's predicted prefill queueing delay is the predicted remaining time of every
prefill on it. A request with p of its n tokens done is charged one more batch's overhead plus
the rest of the curve: a + b*(n - p) + c*(n - p)*(n + p). Summed, that is
  len * a + b * prefill_queue_tokens + c * prefill_queue_attn_units,
O(1) from the counters every instance keeps (`InstanceLoad`; attn units are (n-p)(n-p+2p)).

Max Running Tokens: the smaller of the KV capacity and the largest number of context tokens
a decode batch (at the batch-size cap) can hold while one step stays within the TPOT SLO.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from pdserve.instance.local_scheduler import LocalScheduler
from pdserve.instance.stats import InstanceLoad
from pdserve.perf.fitted import PerfModel, PrefillCoeffs
from pdserve.types import KV_BLOCK_TOKENS, Request, blocks_for

MAX_CONTEXT_TOKENS = 131_072  # 128K: Llama 3.1, Qwen2.5 and Qwen3 (with YaRN), R1 distills
MIN_PROFILE_TOKENS = 16


def profile_lengths(max_tokens: int) -> list[int]:
    """16, 32, 64, ... doubling below `max_tokens`, then `max_tokens` itself."""
    if max_tokens < MIN_PROFILE_TOKENS:
        raise ValueError(f"cannot profile TTFT up to {max_tokens} tokens (fewer than "
                         f"{MIN_PROFILE_TOKENS})")
    lengths, n = [], MIN_PROFILE_TOKENS
    while n < max_tokens:
        lengths.append(n)
        n *= 2
    return [*lengths, max_tokens]


def longest_prompt_tokens(perf: PerfModel, max_context_tokens: int = MAX_CONTEXT_TOKENS) -> int:
    """The longest prompt one instance serves: the model's context, less one token of
    output, within the instance's KV capacity."""
    return min(max_context_tokens, perf.kv_capacity_tokens) - 1


class TtftPredictor:
    def __init__(self, coeffs: PrefillCoeffs) -> None:
        self.coeffs = coeffs

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float]]) -> TtftPredictor:
        """Fit TTFT = a + b*n + c*n^2 to (input length, measured TTFT) samples by ordinary
        least squares, each coefficient >= 0. Absolute, not relative, error: Alg. 1 adds
        predictions and compares the sum with the TTFT SLO, so a second on a long prompt
        matters and a millisecond on a short one does not."""
        data = np.asarray(samples, dtype=float)
        if data.ndim != 2 or data.shape[1] != 2 or len(data) < 3:
            raise ValueError("the TTFT fit needs at least 3 (input tokens, seconds) samples")
        tokens, seconds = data.T
        design = np.column_stack([np.ones_like(tokens), tokens, tokens * tokens])
        kept = [0, 1, 2]
        while True:  # pin a negative coefficient to 0 and refit the rest
            solution, *_ = np.linalg.lstsq(design[:, kept], seconds, rcond=None)
            if (solution >= 0).all():
                break
            kept.pop(int(np.argmin(solution)))
        coeffs = np.zeros(3)
        coeffs[kept] = solution
        residual = seconds - design @ coeffs
        total = float(((seconds - seconds.mean()) ** 2).sum())
        r2 = 1.0 - float((residual ** 2).sum()) / total if total > 0 else 1.0
        return cls(PrefillCoeffs(float(coeffs[0]), float(coeffs[1]), float(coeffs[2]), r2))

    def ttft_s(self, input_tokens: int) -> float:
        return self.coeffs.time_s(input_tokens, input_tokens * input_tokens)

    def queue_delay_s(self, load: InstanceLoad) -> float:
        c = self.coeffs
        return (load.prefill_queue_len * c.intercept_s + load.prefill_queue_tokens * c.per_token_s
                + load.prefill_queue_attn_units * c.per_attn_unit_s)


def profile_ttft(perf: PerfModel, chunk_size_tokens: int,
                 lengths: Iterable[int] | None = None) -> list[tuple[int, float]]:
    """TTFT of single requests on an idle simulated instance: (input length, seconds);
    by default at `profile_lengths(longest_prompt_tokens(perf))`."""
    total_blocks = perf.kv_capacity_tokens // KV_BLOCK_TOKENS
    if lengths is None:
        lengths = profile_lengths(longest_prompt_tokens(perf))
    samples = []
    for n in lengths:
        if blocks_for(n + 1) > total_blocks:  # its KV does not fit in the instance's blocks
            continue
        local = LocalScheduler(0, total_blocks, chunk_size_tokens,
                               max_batch_size=1)  # one request: the cap never binds
        local.enqueue_prefill(Request(0, 0.0, n, 2))
        elapsed = 0.0
        while True:
            plan = local.plan()
            assert plan is not None
            elapsed += perf.batch_time_s(0, 0, plan.prefill_tokens, plan.prefill_attn_units)
            if local.complete(plan, elapsed).prefilled:
                break
        samples.append((n, elapsed))
    return samples


def profiled_terms(perf: PerfModel, chunk_size_tokens: int, tpot_slo_s: float,
                   max_batch_size: int) -> tuple[TtftPredictor, int]:
    """What Arrow's start-up profiling derives from a performance model: the TTFT predictor
    and Max Running Tokens."""
    return (TtftPredictor.fit(profile_ttft(perf, chunk_size_tokens)),
            max_running_tokens(perf, tpot_slo_s, max_batch_size))


def max_running_tokens(perf: PerfModel, tpot_slo_s: float, max_batch_size: int) -> int:
    """Largest decode context that KV memory holds and one step serves within the TPOT SLO."""
    decode = perf.decode
    fixed = decode.step_s(max_batch_size, 0)
    if decode.per_context_token_s <= 0:
        return perf.kv_capacity_tokens
    within_slo = int((tpot_slo_s - fixed) / decode.per_context_token_s)
    return max(0, min(perf.kv_capacity_tokens, within_slo))
