"""The performance model the simulator and the policies use: a few fitted coefficients.

  prefill batch    a_p + b_p * tokens + c_p * attn_units      attn_units = sum n*(n + 2p)
                   + k_p * max(0, tokens - knee)  (the same floor as decode's, optional)
  decode step      a_d + b_d * B + c_d * sum(context) (+ e_d when B == 1)
                   + k_d * max(0, B - knee)   the GEMMs' memory-bound floor: below `knee`
                                              sequences the weights' read dominates, above it
                                              each extra token costs compute
                   + q_d * B^2                super-linear growth with the batch, as live CPU
                                              workers' periods show (B ~11: 19 ms, ~23: 67 ms,
                                              ~53: 159 ms): fitted to step logs
                                              (`fit.fit_steps`), 0 for every other model;
                                              beyond the largest batch the fit saw (M, if
                                              set) its tangent, q_d * (2 M B - M^2), so a
                                              fit is not extrapolated as a parabola
  mixed batch      linear models (profiles, in-situ fits, which `fit.fit_steps` fits so):
                   prefill part + decode part - min(a_p, a_d)  (one pass, one overhead);
                   models with the GEMMs' memory-bound floor (a prefill knee or size table:
                   fitted to kernels) put the decodes' B tokens into the chunk's GEMMs:
                   prefill(n + B) + c_d * ctx
                   + max(0, decode's batch part(B) - prefill(B) + max(0, a_p - a_d))
                   i.e. the decodes add their KV reads and what their step costs beyond the
                   same tokens' GEMMs (the LM head, per-sequence work), and the pass costs
                   at least a prefill of all its tokens; without the outer max(0, ...) this
                   is the additive form on a linear model. With a mixed table (read off the
                   kernels' own mixed passes, `fit.fit_perf_model(..., mixed_s=...)`) that
                   last term is the table's entry for B instead (the last entry beyond it):
                   the fitted intercepts need not be overheads (a mixture of experts'
                   prefill fit carries its experts' weight read there, 5-13 ms, which the
                   formula charged every mixed step again: 20-30 % high)
  KV transfer      calls * alpha + bytes / beta

  size tables (optional)  + table[B - 1] for a decode step of B sequences, + table[(n - 1) // 16]
                   for a prefill of n tokens (the last entry beyond the table): what the
                   closed form misses at each size (cuBLAS's tile steps), read off the
                   operator model (`fit.fit_perf_model(..., size_tables=True)`)

`attn_units` charges a chunk of n new tokens after p prior tokens for attention over its
context, so a 2-chunk prefill costs the same attention as a 1-shot one. Coefficients come
from `fit_*` in `pdserve.perf.fit` over profile samples: measured on the live engine
(`pdserve profile`) or drawn from the calibrated (or roofline) model for a preset
(`pdserve.perf.presets`).

Because a decode step is linear in the context and the context grows by B per step (B is
fixed within a span, so any term in B alone, the super-linear one included, is a constant of
the span), the time of k steps is
closed-form: k*A + c_d*B*k(k-1)/2 with A the first step's time. The simulator
uses that to advance a batch over many steps at once (`span`: a `DecodeSpan`, its clock;
`span_time_s`, `steps_done_within`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

TABLE_TOKENS = 16  # a prefill size table's bucket width (a GEMM tile is at least this tall)
CONSTANT_BATCHES = 1024  # decode batch sizes whose step constant is precomputed


@dataclass(frozen=True, slots=True)
class PrefillCoeffs:
    intercept_s: float
    per_token_s: float
    per_attn_unit_s: float
    r2: float = 1.0
    knee_tokens: int = 0  # 0: no knee term
    per_token_above_knee_s: float = 0.0
    size_table_s: tuple[float, ...] = ()  # per TABLE_TOKENS-token bucket of the batch's tokens

    def time_s(self, tokens: int, attn_units: int) -> float:
        time = self.intercept_s + self.per_token_s * tokens + self.per_attn_unit_s * attn_units
        if tokens > self.knee_tokens:
            time += self.per_token_above_knee_s * (tokens - self.knee_tokens)
        table = self.size_table_s
        if table:
            time += table[min(max(tokens - 1, 0) // TABLE_TOKENS, len(table) - 1)]
        return time


@dataclass(frozen=True, slots=True)
class DecodeCoeffs:
    intercept_s: float
    per_seq_s: float
    per_context_token_s: float
    batch1_extra_s: float = 0.0
    r2: float = 1.0
    knee_batch: int = 0  # 0: no knee term
    per_seq_above_knee_s: float = 0.0
    size_table_s: tuple[float, ...] = ()  # per batch size (entry B - 1)
    per_seq_squared_s: float = 0.0  # q_d: seconds per B^2 (super-linear batches)
    squared_until_batch: int = 0  # M: the tangent beyond it (0: the parabola throughout)
    # derived, not saved: a step's part that depends on the batch size alone, per size up to
    # CONSTANT_BATCHES (the simulator's hottest call reads it instead of summing the terms)
    _batch_part_s: tuple[float, ...] = field(default=(), init=False, repr=False,
                                             compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_batch_part_s", tuple(
            self.batch_part_s(size) for size in range(1, CONSTANT_BATCHES + 1)))

    def batch_part_s(self, batch_size: int) -> float:
        """The step time's terms in the batch size alone (all but the context's)."""
        extra = self.batch1_extra_s if batch_size == 1 else 0.0
        if batch_size > self.knee_batch:
            extra += self.per_seq_above_knee_s * (batch_size - self.knee_batch)
        table = self.size_table_s
        if table:
            extra += table[min(max(batch_size - 1, 0), len(table) - 1)]
        if self.per_seq_squared_s:
            until = self.squared_until_batch
            extra += self.per_seq_squared_s * (
                batch_size * batch_size if not until or batch_size <= until
                else 2 * until * batch_size - until * until)
        return self.intercept_s + extra + self.per_seq_s * batch_size

    def step_s(self, batch_size: int, context_tokens: int) -> float:
        parts = self._batch_part_s
        if 0 < batch_size <= CONSTANT_BATCHES:
            return parts[batch_size - 1] + self.per_context_token_s * context_tokens
        return self.batch_part_s(batch_size) + self.per_context_token_s * context_tokens


@dataclass(frozen=True, slots=True)
class TransferCoeffs:
    per_call_s: float
    bytes_per_s: float
    r2: float = 1.0

    def time_s(self, num_bytes: int, calls: int = 1) -> float:
        return calls * self.per_call_s + num_bytes / self.bytes_per_s


# `DecodeSpan.steps_within` takes its closed-form estimate as the answer when it lies at
# least this far (in steps) from a whole step, and the span and the cap are small enough that
# the estimate's floating-point error stays far below it (`_TRUSTED_STEPS`); otherwise (a
# read at a step boundary, one in 10^5 on bench/sim_speed.py) it searches exactly.
_STEP_MARGIN = 1e-6
_STEP_MARGIN_BELOW_ONE = 1 - _STEP_MARGIN
_TRUSTED_STEPS = 1e8


class DecodeSpan:
    """The closed-form clock of a decode span (`PerfModel.span`): its first step's time and
    how much each later step adds (the context grows by the batch size per step). Built
    once per span, so the simulator's many reads of a running span (its end, the steps done
    by now) cost no step-time evaluation. Its constants are floats (2.0, not 2): in 3.11 an
    operation of a float with an int takes the generic path, at the same value."""

    __slots__ = ("first_step_s", "growth_s", "_linear", "_linear_squared", "_four_half",
                 "_inverse", "_trusted_steps")

    def __init__(self, first_step_s: float, growth_s: float) -> None:
        self.first_step_s = first_step_s
        self.growth_s = growth_s  # per_context_token_s * batch size
        # the inverse's constants: growth/2 k^2 + (first - growth/2) k = elapsed
        half = growth_s / 2.0
        self._linear = first_step_s - half
        self._linear_squared = self._linear * self._linear
        self._four_half = 4.0 * half
        self._inverse = 1.0 / (2.0 * half) if half > 0.0 else 0.0
        # the caps under which the estimate is trusted off a step boundary: its error is
        # below 9 * 2^-53 * (steps + |linear| / growth) steps (`steps_within`); an int, as
        # the caps are
        trusted = _TRUSTED_STEPS - abs(self._linear) * self._inverse if growth_s > 0.0 \
            else _TRUSTED_STEPS if first_step_s > 0.0 else -1.0
        self._trusted_steps = int(trusted) if trusted > 0.0 else -1  # (NaN, -inf: none)

    def time_s(self, steps: int) -> float:
        """Time of the span's first `steps` steps."""
        return steps * self.first_step_s + self.growth_s * steps * (steps - 1) / 2.0

    def steps_within(self, elapsed_s: float, max_steps: int) -> int:
        """How many whole steps (at most `max_steps`) are done `elapsed_s` after its start:
        exact against `time_s`.

        The closed-form estimate k = (sqrt(linear^2 + 4 half elapsed) - linear) / (2 half)
        is the answer when it lies at least `_STEP_MARGIN` from a whole number: rounding
        (u = 2^-53 per operation) moves it by at most 5u (k + |linear| / (2 half)) steps
        (the square root's cancellation against `linear` is the largest term), and
        `time_s`'s own rounding moves a step boundary by at most 4u k steps, so under
        `_TRUSTED_STEPS` (10^8) the two are within 10^-7 steps of each other: the floor of
        the estimate is the step `time_s` places `elapsed_s` in. Elsewhere (at a boundary,
        at the cap, a huge span) the estimate only seeds an exact search."""
        if self.growth_s > 0.0:
            estimate = (math.sqrt(self._linear_squared + self._four_half * elapsed_s)
                        - self._linear) * self._inverse
        elif self.first_step_s > 0.0:
            estimate = elapsed_s / self.first_step_s
        else:
            return self._search(elapsed_s, max_steps, max_steps)
        steps = int(estimate)
        if steps < max_steps <= self._trusted_steps and \
                _STEP_MARGIN < estimate - steps < _STEP_MARGIN_BELOW_ONE:
            return steps
        return self._search(elapsed_s, max_steps, steps)

    def _search(self, elapsed_s: float, max_steps: int, steps: int) -> int:
        """`steps_within` from a seed `steps`, exact against `time_s` (each step bound is
        evaluated as `time_s` does)."""
        first, growth = self.first_step_s, self.growth_s
        if steps > max_steps:
            steps = max_steps
        elif steps < 0:
            steps = 0
        if steps < max_steps:
            end_s = (steps + 1) * first + growth * (steps + 1) * steps / 2.0
            while end_s <= elapsed_s:
                steps += 1
                if steps == max_steps:
                    break
                end_s = (steps + 1) * first + growth * (steps + 1) * steps / 2.0
        start_s = steps * first + growth * steps * (steps - 1) / 2.0
        while steps > 0 and start_s > elapsed_s:
            steps -= 1
            start_s = steps * first + growth * steps * (steps - 1) / 2.0
        return steps


@dataclass(frozen=True, slots=True)
class PerfModel:
    name: str
    prefill: PrefillCoeffs
    decode: DecodeCoeffs
    transfer: TransferCoeffs
    kv_bytes_per_token: int
    kv_capacity_tokens: int
    # the spread of a deployment's measured prefill-bearing batch times around this model's
    # mean (coefficient of variation; in-situ fits, `perf/step_log.py`): the simulator draws
    # each such batch's time from it (`sim/step_noise.py`); 0 (profiles, the calibrated
    # models): every batch takes its mean
    prefill_step_cv: float = 0.0
    # the control plane's latency per request, median and P90 (HTTP, tokenizing, pipes,
    # streaming: what a deployment adds outside its workers' steps), measured from a live
    # run's timeline (`pdserve profile --from-step-log`, `perf/in_situ.py`); the simulator
    # adds it to every request's output times unless the config sets `sim.control_latency_s`
    # (`sim/runner.py: control_latency`); 0 (profiles, the presets): none
    control_latency_s: float = 0.0
    control_latency_p90_s: float = 0.0
    # per decode batch size B (entry B - 1), what B decodes add to a mixed step beyond
    # prefill(chunk + B) and their KV reads, read off the kernels' mixed passes (empty: the
    # closed-form term of the module docstring)
    mixed_decode_table_s: tuple[float, ...] = ()
    # derived, not saved: per decode batch size up to CONSTANT_BATCHES, what B decodes add
    # to a mixed step beyond their tokens' place in the chunk's GEMMs and their KV reads
    # (the max(0, ...) term above); empty for a linear model
    _mixed_decode_extra_s: tuple[float, ...] = field(default=(), init=False, repr=False,
                                                     compare=False)

    def __post_init__(self) -> None:
        prefill = self.prefill
        if prefill.knee_tokens or prefill.size_table_s or self.mixed_decode_table_s:
            object.__setattr__(self, "_mixed_decode_extra_s", tuple(
                self.mixed_decode_extra_s(size) for size in range(1, CONSTANT_BATCHES + 1)))
        if self.kv_capacity_tokens <= 0:
            raise ValueError(f"perf model {self.name!r}: kv_capacity_tokens must be positive "
                             f"(the model does not fit in memory?), got {self.kv_capacity_tokens}")
        if not 0.0 <= self.prefill_step_cv <= 2.0:
            raise ValueError(f"perf model {self.name!r}: prefill_step_cv must be in [0, 2], "
                             f"got {self.prefill_step_cv}")
        if self.control_latency_s < 0 or (self.control_latency_p90_s and
                                          self.control_latency_p90_s < self.control_latency_s):
            raise ValueError(f"perf model {self.name!r}: the control latency's median must "
                             f"not be negative and its P90 0 or at least the median, got "
                             f"{self.control_latency_s} and {self.control_latency_p90_s}")

    def mixed_decode_extra_s(self, batch_size: int) -> float:
        """What `batch_size` decodes add to a mixed step of a kernel-fitted model beyond
        their tokens' share of the chunk's GEMMs and their KV reads."""
        table = self.mixed_decode_table_s
        if table:
            return table[min(max(batch_size, 1), len(table)) - 1]
        prefill = self.prefill
        return max(0.0, self.decode.batch_part_s(batch_size) - prefill.time_s(batch_size, 0)
                   + max(0.0, prefill.intercept_s - self.decode.intercept_s))

    def batch_time_s(self, batch_size: int, context_tokens: int, prefill_tokens: int,
                     prefill_attn_units: int) -> float:
        """Time of one step of a batch with `batch_size` decodes and the given prefill work
        (the mixed batch's two forms: the module docstring)."""
        decode = self.decode
        if not prefill_tokens:
            return decode.step_s(batch_size, context_tokens)
        prefill = self.prefill
        if not batch_size:
            return prefill.time_s(prefill_tokens, prefill_attn_units)
        extras = self._mixed_decode_extra_s
        if not extras:  # a linear model: the parts less one shared overhead
            shared = min(prefill.intercept_s, decode.intercept_s)
            return (prefill.time_s(prefill_tokens, prefill_attn_units)
                    + decode.step_s(batch_size, context_tokens) - shared)
        # a kernel-fitted model against the kernels' own pass (8 GPU x model x TP cases,
        # chunks of 16-2,048 tokens beside 1-200 decodes): |error| P90 3.6-5.3 %, where the
        # additive form was 8-18 % (median 3-7 % low: a decode's token in a chunk's GEMMs
        # costs compute, not the weight read it shares)
        extra = (extras[batch_size - 1] if batch_size <= CONSTANT_BATCHES
                 else self.mixed_decode_extra_s(batch_size))
        return (prefill.time_s(prefill_tokens + batch_size, prefill_attn_units)
                + decode.per_context_token_s * context_tokens + extra)

    def span(self, batch_size: int, context_tokens: int) -> DecodeSpan:
        """The clock of a span of decode steps of a fixed batch whose context starts at
        `context_tokens` and grows by `batch_size` each step."""
        decode = self.decode
        return DecodeSpan(decode.step_s(batch_size, context_tokens),
                          decode.per_context_token_s * batch_size)

    def span_time_s(self, batch_size: int, context_tokens: int, steps: int) -> float:
        """Time of `steps` decode steps of such a span (`span`)."""
        return self.span(batch_size, context_tokens).time_s(steps)

    def steps_done_within(self, batch_size: int, context_tokens: int, elapsed_s: float,
                          max_steps: int) -> int:
        """How many whole steps of such a span are done `elapsed_s` after it started."""
        return self.span(batch_size, context_tokens).steps_within(elapsed_s, max_steps)

    def transfer_time_s(self, tokens: int, calls: int = 1) -> float:
        return self.transfer.time_s(tokens * self.kv_bytes_per_token, calls)

    # ---- files ----
    def save(self, path: str | Path) -> None:
        record = asdict(self)
        del record["decode"]["_batch_part_s"]  # derived on load
        del record["_mixed_decode_extra_s"]
        Path(path).write_text(json.dumps(record, indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> PerfModel:
        try:
            raw = json.loads(Path(path).read_text())
            model = cls(name=raw["name"], prefill=PrefillCoeffs(**_tabled(raw["prefill"])),
                        decode=DecodeCoeffs(**_tabled(raw["decode"])),
                        transfer=TransferCoeffs(**raw["transfer"]),
                        kv_bytes_per_token=int(raw["kv_bytes_per_token"]),
                        kv_capacity_tokens=int(raw["kv_capacity_tokens"]),
                        prefill_step_cv=float(raw.get("prefill_step_cv", 0.0)),
                        control_latency_s=float(raw.get("control_latency_s", 0.0)),
                        control_latency_p90_s=float(raw.get("control_latency_p90_s", 0.0)),
                        mixed_decode_table_s=tuple(float(x) for x in
                                                   raw.get("mixed_decode_table_s", ())))
            _check_costs(model)
            return model
        except OSError as err:
            raise ValueError(f"cannot read performance model {path}: {err}") from err
        except (KeyError, TypeError, ValueError, OverflowError) as err:  # JSON errors too
            raise ValueError(f"{path}: not a pdserve performance model file ({err})") from err


def _check_costs(model: PerfModel) -> None:
    """A loaded model's step costs: finite, and not negative but for the corrections (the
    batch-1 adjustment, the residual tables), as the fits keep them; one written by hand
    past that priced steps below zero and ran the clock backwards."""
    for side in ("prefill", "decode", "transfer"):
        coeffs = getattr(model, side)
        for item in fields(coeffs):
            value = getattr(coeffs, item.name)
            if not item.init or item.name == "r2":
                continue
            values = value if isinstance(value, tuple) else (value,)
            if not all(math.isfinite(v) for v in values):
                raise ValueError(f"{side}.{item.name} must be finite, got {value!r:.60}")
            if item.name not in ("batch1_extra_s", "size_table_s") and value < 0:
                raise ValueError(f"{side}.{item.name} must not be negative, got {value!r}")
    for name in ("control_latency_s", "control_latency_p90_s"):
        if not math.isfinite(getattr(model, name)):
            raise ValueError(f"{name} must be finite, got {getattr(model, name)!r}")
    if not all(math.isfinite(v) for v in model.mixed_decode_table_s):
        raise ValueError(f"mixed_decode_table_s must be finite, got "
                         f"{model.mixed_decode_table_s!r:.60}")


def _tabled(coeffs: dict) -> dict:
    """A coefficient record from JSON, its size table (a list there) as a tuple."""
    return {**coeffs, "size_table_s": tuple(float(x) for x in coeffs.get("size_table_s", ()))}
