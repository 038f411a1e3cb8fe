"""Least-squares fits of the fitted performance model from profile samples, with R^2.

Samples are plain tuples so a profiler (live engine) or a model (calibrated, roofline) can
produce them:
  prefill   (new_tokens, prior_tokens, seconds)     one request's chunk per sample
  decode    (batch_size, context_tokens, seconds)   one step per sample
  transfer  (bytes, calls, seconds)
Samples span orders of magnitude (a 16-token chunk to a 2048-token one), so the fit
minimises relative error (each row weighted by 1/seconds), and every coefficient that is a
cost (all but the batch-1 adjustment) is kept non-negative by an active-set loop: a
negative one is pinned to 0 and the rest refitted, so no prediction can go negative. R^2 is
reported on the unweighted residuals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from pdserve.perf.fitted import (
    TABLE_TOKENS,
    DecodeCoeffs,
    PerfModel,
    PrefillCoeffs,
    TransferCoeffs,
)
from pdserve.types import attn_units


def _least_squares(columns: list[np.ndarray], target: np.ndarray,
                   free: frozenset[int] = frozenset(), relative: bool = True
                   ) -> tuple[np.ndarray, float]:
    """Least squares with coefficients >= 0 except those in `free`: of relative errors, or
    (`relative=False`) of absolute ones, which estimates the conditional mean."""
    design = np.column_stack(columns)
    weights = 1.0 / np.maximum(target, 1e-12) if relative else np.ones_like(target)
    active = list(range(design.shape[1]))
    coeffs = np.zeros(design.shape[1])
    while active:
        solution, *_ = np.linalg.lstsq(design[:, active] * weights[:, None], target * weights,
                                       rcond=None)
        negative = [i for i, c in zip(active, solution, strict=True) if c < 0 and i not in free]
        if not negative:
            coeffs[:] = 0.0
            coeffs[active] = solution
            break
        active.remove(min(negative, key=lambda i: solution[active.index(i)]))
    residual = target - design @ coeffs
    total = float(((target - target.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else 1.0
    return coeffs, r2


def _as_array(samples: Sequence[tuple[float, float, float]], what: str, minimum: int) -> np.ndarray:
    data = np.asarray(samples, dtype=float)
    if data.ndim != 2 or data.shape[1] != 3:
        raise ValueError(f"{what} samples must be (x, y, seconds) triples")
    if len(data) < minimum:
        raise ValueError(f"need at least {minimum} {what} samples to fit, got {len(data)}")
    return data


def _relative_sse(columns: list[np.ndarray], coeffs: np.ndarray, target: np.ndarray) -> float:
    residual = (np.column_stack(columns) @ coeffs - target) / np.maximum(target, 1e-12)
    return float((residual**2).sum())


def fit_prefill(samples: Sequence[tuple[float, float, float]],
                knee: bool = False) -> PrefillCoeffs:
    """Fit a prefill batch; with `knee`, also a per-token slope above a knee token count,
    the knee chosen among the sampled chunk sizes by the smallest relative error."""
    data = _as_array(samples, "prefill", 3)
    new, prior, seconds = data.T
    units = np.array([attn_units(int(n), int(p)) for n, p in zip(new, prior, strict=True)],
                     dtype=float)
    columns = [np.ones_like(new), new, units]
    coeffs, r2 = _least_squares(columns, seconds)
    best = (_relative_sse(columns, coeffs, seconds), 0, coeffs, r2)
    sizes = sorted(set(new.tolist()))
    for candidate in (sizes[1:-2] if knee else []):
        with_knee = [*columns, np.maximum(0.0, new - candidate)]
        coeffs, r2 = _least_squares(with_knee, seconds)
        error = _relative_sse(with_knee, coeffs, seconds)
        if error < best[0]:
            best = (error, int(candidate), coeffs, r2)
    _, knee_tokens, coeffs, r2 = best
    return PrefillCoeffs(float(coeffs[0]), float(coeffs[1]), float(coeffs[2]), r2, knee_tokens,
                         float(coeffs[3]) if knee_tokens else 0.0)


def fit_decode(samples: Sequence[tuple[float, float, float]], knee: bool = False) -> DecodeCoeffs:
    """Fit a decode step; with `knee`, also a per-sequence slope above a knee batch size,
    the knee chosen among the sampled batch sizes by the smallest relative error."""
    data = _as_array(samples, "decode", 4)
    batch, context, seconds = data.T
    batch1 = (batch == 1).astype(float)
    columns = [np.ones_like(batch), batch, context]
    if 0 < batch1.sum() < len(batch):
        columns.append(batch1)
    free = frozenset({3}) if len(columns) == 4 else frozenset()
    coeffs, r2 = _least_squares(columns, seconds, free=free)
    best: tuple[float, int, np.ndarray, float] = (_relative_sse(columns, coeffs, seconds), 0,
                                                 coeffs, r2)
    sizes = sorted(set(batch.tolist()))
    for candidate in (sizes[1:-2] if knee else []):
        with_knee = [*columns, np.maximum(0.0, batch - candidate)]
        coeffs, r2 = _least_squares(with_knee, seconds, free=free)
        error = _relative_sse(with_knee, coeffs, seconds)
        if error < best[0]:
            best = (error, int(candidate), coeffs, r2)
    _, knee_batch, coeffs, r2 = best
    extra = float(coeffs[3]) if 3 in free else 0.0
    above = float(coeffs[-1]) if knee_batch else 0.0
    return DecodeCoeffs(float(coeffs[0]), float(coeffs[1]), float(coeffs[2]), extra, r2,
                        knee_batch, above)


def fit_transfer(samples: Sequence[tuple[float, float, float]]) -> TransferCoeffs:
    data = _as_array(samples, "transfer", 2)
    num_bytes, calls, seconds = data.T
    (alpha, inv_beta), r2 = _least_squares([calls, num_bytes], seconds)
    if inv_beta <= 0:
        raise ValueError("transfer samples do not grow with size; cannot fit a bandwidth")
    return TransferCoeffs(float(alpha), float(1.0 / inv_beta), r2)


def fit_steps(samples: Sequence[tuple[float, float, float, float, float]]
              ) -> tuple[PrefillCoeffs, DecodeCoeffs]:
    """Fit prefill and decode together from whole batches as an engine ran them:
    (decodes, decode_context_tokens, prefill_tokens, prefill_attn_units, seconds) per batch,
    mixed batches included. A batch pays one step overhead, the decode intercept; a batch
    with prefill work pays a non-negative extra on top (the prefill path's own set-up: a
    few-token leftover chunk cost 2.2 ms more than a decode step in the fidelity runs), so
    the prefill intercept is the decode one plus that extra, which is what
    `PerfModel.batch_time_s` charges a mixed batch.

    Unlike the profile fits, this one minimises absolute errors: logged periods in a
    deployment carry interference that only ever adds time (right-skewed noise), and the
    relative-error fit weighs the fastest periods most, so it prices a batch at about its
    best case, under the mean that sets a queue's utilisation and a request's TPOT (on a
    1P1D run's decode worker: 0.14 s against a mean period of 0.25 s at 48-64 decodes).

    The decode step also gets a non-negative term in the squared batch size
    (`DecodeCoeffs.per_seq_squared_s`) where at least 3 batch sizes were logged: live CPU
    workers' periods grow faster than linearly with the batch (B ~11: 19 ms, ~23: 67 ms,
    ~53: 159 ms), which a linear fit, sitting on the many small batches, prices low just
    where a decode queue nears its capacity; a linear log fits it 0. Beyond the largest
    logged batch the term continues as its tangent (`squared_until_batch`): a 1P1D decode
    worker's log of batches up to 16 fitted a parabola that priced B = 64 at 0.30 s, where
    the runs that reached it measured 0.13 s."""
    data = np.asarray(samples, dtype=float)
    if data.ndim != 2 or data.shape[1] != 5:
        raise ValueError("step samples must be (decodes, context, prefill tokens, attention "
                         "units, seconds) rows")
    if len(data) < 6:
        raise ValueError(f"need at least 6 steps to fit, got {len(data)}")
    batch, context, tokens, units, seconds = data.T
    columns = [np.ones_like(batch), batch, context, tokens, units]
    optional = {"batch1": (batch == 1).astype(float), "prefill": (tokens > 0).astype(float)}
    index: dict[str, int] = {}
    for name, column in optional.items():
        if 0 < column.sum() < len(batch):  # identifiable only beside rows without it
            index[name] = len(columns)
            columns.append(column)
    if len(set(batch[batch > 0].tolist())) >= 3:  # apart from the linear term's
        index["squared"] = len(columns)
        columns.append(batch * batch)
    free = frozenset({index["batch1"]}) if "batch1" in index else frozenset()
    coeffs, r2 = _least_squares(columns, seconds, free=free, relative=False)
    extra = float(coeffs[index["batch1"]]) if "batch1" in index else 0.0
    prefill_extra = float(coeffs[index["prefill"]]) if "prefill" in index else 0.0
    squared = float(coeffs[index["squared"]]) if "squared" in index else 0.0
    intercept = float(coeffs[0])
    decode = DecodeCoeffs(intercept, float(coeffs[1]), float(coeffs[2]), extra, r2,
                          per_seq_squared_s=squared,
                          squared_until_batch=int(batch.max()) if squared else 0)
    table = decode_residual_table(decode, batch, context, tokens, seconds)
    return (PrefillCoeffs(intercept + prefill_extra, float(coeffs[3]), float(coeffs[4]), r2),
            replace(decode, size_table_s=table) if table else decode)


TABLE_MIN_ROWS = 5  # decode-only batches of one size for its residual to count


def decode_residual_table(decode: DecodeCoeffs, batch: np.ndarray, context: np.ndarray,
                          tokens: np.ndarray, seconds: np.ndarray) -> tuple[float, ...]:
    """What the closed form misses at each logged batch size: the mean residual of the
    decode-only batches of that size (sizes with at least `TABLE_MIN_ROWS` of them),
    linear between them, entry B - 1 (`DecodeCoeffs.size_table_s`; beyond the largest
    size the last entry holds). Within the logged range a step is then priced at its
    measured mean, as the kernel tables are interpolated within their measured shapes:
    a 1P1D decode worker logged 10.7 ms at B 5-8 and 35.9 ms at B 9-15 during a ramp,
    which the quadratic priced +18 % and -27 %. Empty when fewer than 2 sizes qualify."""
    only = (tokens == 0) & (batch > 0)
    sizes, counts = np.unique(batch[only].astype(int), return_counts=True)
    known = sizes[counts >= TABLE_MIN_ROWS]
    if len(known) < 2:
        return ()
    residual = seconds[only] - np.array([decode.step_s(int(b), int(c)) for b, c in
                                         zip(batch[only], context[only], strict=True)])
    sized = batch[only].astype(int)
    means = [float(residual[sized == b].mean()) for b in known]
    return tuple(float(x) for x in np.interp(np.arange(1, int(known[-1]) + 1), known, means))


@dataclass(frozen=True)
class FitGrid:
    """Where a step-time model is sampled to fit the runtime form: prefill chunk sizes x
    prior tokens; decode batch sizes x context per sequence (capped at the KV capacity)."""

    prefill_tokens: tuple[int, ...]
    prefill_prior: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context_per_seq: tuple[int, ...]
    knee: bool = False


def fit_perf_model(name: str, prefill_s: Callable[[int, int], float],
                   decode_step_s: Callable[[int, int], float],
                   transfer_s: Callable[[int, int], float], kv_bytes_per_token: int,
                   kv_capacity_tokens: int, grid: FitGrid, max_batch_size: int,
                   size_tables: bool = False,
                   mixed_s: Callable[[int, int, int], float] | None = None) -> PerfModel:
    """The runtime `PerfModel` fitted to a step-time model (calibrated or roofline) over the
    range serving uses. `size_tables`: also read off what the closed form misses at each
    decode batch size (at `TABLE_CONTEXT_PER_SEQ` tokens per sequence) and each prefill
    size (16-token buckets up to the grid's largest chunk, no prior tokens), for a
    step-time model with per-size steps (the per-shape corrections, `perf/residuals.py`).
    `mixed_s(chunk tokens, decodes, context tokens)`: the step-time model's own mixed pass,
    from which the mixed step's decode term is read per batch size (`mixed_decode_table`)."""
    prefill = [(n, p, prefill_s(n, p)) for n in grid.prefill_tokens for p in grid.prefill_prior]
    decode = []
    for batch in grid.decode_batch:
        if batch <= max_batch_size:
            for per_seq in grid.decode_context_per_seq:
                context = min(batch * per_seq, kv_capacity_tokens)
                decode.append((batch, context, decode_step_s(batch, context)))
    sizes = [n * kv_bytes_per_token for n in (16, 256, 4096, 32768)]
    transfer = [(size, calls, transfer_s(size, calls)) for size in sizes for calls in (1, 8, 64)]
    prefill_fit, decode_fit = fit_prefill(prefill, knee=grid.knee), fit_decode(decode,
                                                                              knee=grid.knee)
    if size_tables:
        decode_fit = replace(decode_fit, per_context_token_s=_within_batch_slope(decode))
        prefill_fit, decode_fit = _with_size_tables(prefill_fit, decode_fit, prefill_s,
                                                    decode_step_s, max(grid.prefill_tokens),
                                                    max_batch_size)
    mixed = (mixed_decode_table(prefill_fit, decode_fit, mixed_s, max_batch_size)
             if mixed_s is not None else ())
    return PerfModel(name=name, prefill=prefill_fit, decode=decode_fit,
                     transfer=fit_transfer(transfer), kv_bytes_per_token=kv_bytes_per_token,
                     kv_capacity_tokens=kv_capacity_tokens, mixed_decode_table_s=mixed)


TABLE_CONTEXT_PER_SEQ = 1024  # where a decode size table is read
MIXED_CHUNKS = (256, 1024, 2048)  # the chunks a mixed table is read beside (their median)
MIXED_BATCHES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256,
                 320, 384, 448, 512, 640, 768, 896, 1024)
# the decode batches every fit covers, whatever the instances' batch limit below it: a limit
# above it fits the model up to that limit (`fit_batches`), one below keeps this model
FIT_MIN_BATCHES = 256
# the largest limit a fit covers (2-6 s to fit; a limit of 10^8 was a run that never started)
MAX_BATCH_SIZE = 16_384


def fit_batches(max_batch_size: int) -> int:
    """The decode batches a fit for instances of `max_batch_size` sequences covers."""
    if max_batch_size > MAX_BATCH_SIZE:
        raise ValueError(f"a batch limit of {max_batch_size:,} sequences is above the "
                         f"{MAX_BATCH_SIZE:,} a performance model is fitted to")
    return max(FIT_MIN_BATCHES, max_batch_size)


def mixed_decode_table(prefill: PrefillCoeffs, decode: DecodeCoeffs,
                       mixed_s: Callable[[int, int, int], float],
                       max_batch_size: int) -> tuple[float, ...]:
    """Per decode batch size B up to `max_batch_size`, what B decodes add to a mixed pass
    beyond prefill(chunk + B) and their KV reads: the median over `MIXED_CHUNKS` of the
    step-time model's mixed pass less those two, read at `MIXED_BATCHES` (and
    `max_batch_size`) and linear between them. Against the kernels' own passes it halves
    the mixed step's P90 error on dense models (Llama-3.1-8B, one H100: 5.8 -> 2.4 %) and
    brings mixtures of experts from 20-30 % to 1-3 % (docs/results/fidelity.md)."""
    batches = sorted({b for b in MIXED_BATCHES if b < max_batch_size} | {max_batch_size})
    read = []
    for batch in batches:
        context = batch * TABLE_CONTEXT_PER_SEQ
        read.append(float(np.median([
            mixed_s(chunk, batch, context) - prefill.time_s(chunk + batch, attn_units(chunk, 0))
            - decode.per_context_token_s * context for chunk in MIXED_CHUNKS])))
    return tuple(float(v) for v in np.interp(np.arange(1, max_batch_size + 1), batches, read))


def _within_batch_slope(samples: list[tuple[int, int, float]]) -> float:
    """The decode step's cost per context token at a fixed batch size (pooled least squares
    over the batch sizes sampled, each about its own mean). With a table per batch size
    holding everything the batch size alone sets, the context term must carry only the
    context's own cost: the closed-form fit's slope also absorbs part of the batch size's
    (context grows with the batch across the grid), 1.6e-7 s/token against 0.6-1.1e-7
    within a batch size for Llama-3-70B at TP 2 on the corrected A100 model."""
    numerator = denominator = 0.0
    for batch in {b for b, _, _ in samples}:
        rows = np.array([(c, t) for b, c, t in samples if b == batch], dtype=float)
        if len(rows) < 2:
            continue
        context, seconds = rows[:, 0] - rows[:, 0].mean(), rows[:, 1] - rows[:, 1].mean()
        numerator += float(context @ seconds)
        denominator += float(context @ context)
    return max(0.0, numerator / denominator) if denominator > 0 else 0.0


def _with_size_tables(prefill: PrefillCoeffs, decode: DecodeCoeffs,
                      prefill_s: Callable[[int, int], float],
                      decode_step_s: Callable[[int, int], float], max_prefill_tokens: int,
                      max_batch_size: int) -> tuple[PrefillCoeffs, DecodeCoeffs]:
    # read at the same context per sequence for every batch size, memory or not: the table
    # is for the batch's own steps (the GEMMs' tiles), and the context's share of the step
    # is the closed form's to price
    decode_table = []
    for batch in range(1, max_batch_size + 1):
        context = batch * TABLE_CONTEXT_PER_SEQ
        decode_table.append(decode_step_s(batch, context) - decode.step_s(batch, context))
    prefill_table = [prefill_s(tokens, 0) - prefill.time_s(tokens, attn_units(tokens, 0))
                     for tokens in range(TABLE_TOKENS, max_prefill_tokens + 1, TABLE_TOKENS)]
    return (replace(prefill, size_table_s=tuple(prefill_table)),
            replace(decode, size_table_s=tuple(decode_table)))
