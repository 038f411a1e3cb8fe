"""The provisional performance model: what `pdserve serve` starts on when it has no profile
of the served model yet, while the start-up profile runs in the background
(`background_profile.py`), until the server switches to the profiled model.

It must be conservative: a policy that reads it (Arrow's TTFT predictor and Max Running
Tokens, TaiChi's feasibility test, AMPD's cost model, ...) must not take on more than the
engine can do, so its step times are at least the engine's (a policy may take on less until
the profile is ready; the default policy, `colocated`, only ranks instances by it). Sources,
in order:

1. An earlier start-up profile of the same weights on this machine, kept for another KV
   pool size, grid or torch version (`profile_cache.earlier_profile`): a measurement of this
   engine here, with this server's KV capacity.
2. Else the layer probe (`probe_model`): the served model's own shape (hidden size, heads,
   MLP, vocabulary; random weights) with one decoder layer, run by the real engine code
   (batch building, attention over the paged pool, the LM head, sampling) at a few prefill
   and decode points on one thread, then again with no layer: a point of the L-layer model
   takes t0 + L (t1 - t0), and the fits of those points (`perf.fit`), times `SAFETY`, are the
   model. About 2 s on the 135M default model on 2 cores (0.25 s on `tiny`), against 33 s
   for the quick profile; it measures the machine as loaded now, so a busy machine gets a
   slower model.
   `SAFETY` covers what the probe misses: the fit's error beyond its points, a worker's
   cache misses over L layers' weights where the probe's one layer stays in cache, and a
   quick measurement's noise. On this 2-core machine it put every quick-grid point of
   `tiny` and of the default model at 1.5-3.1x its profiled time (`bench/provisional_check.py`,
   docs/results/clients.md).

KV transfers are priced at `TRANSFER_BYTES_PER_S` and `TRANSFER_CALL_S`, a tenth of the
shared-memory copy speed and ten times the per-call cost the quick profile measured on this
machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from pdserve.engine.checkpoint import resolve_model
from pdserve.engine.config import ModelConfig
from pdserve.engine.engine import Engine
from pdserve.engine.model import CausalLM
from pdserve.engine.profile_cache import earlier_profile
from pdserve.engine.sampling_params import SamplingParams
from pdserve.perf.fit import fit_decode, fit_prefill
from pdserve.perf.fitted import DecodeCoeffs, PerfModel, PrefillCoeffs, TransferCoeffs
from pdserve.types import KV_BLOCK_TOKENS, blocks_for

SAFETY = 2.0
PREFILL_POINTS = ((16, 0), (128, 0), (512, 0), (128, 256))  # (new, prior tokens)
DECODE_POINTS = ((1, 64), (2, 256), (8, 64), (8, 256))  # (sequences, context each)
REPEATS = 2  # timed runs per point (after a warm-up); the fastest counts
TRANSFER_BYTES_PER_S = 1.5e9
TRANSFER_CALL_S = 4e-5


def _probe_points(config: ModelConfig, clock: Callable[[], float]
                  ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """Each point's time (the fastest of `REPEATS` after a warm-up) with one decoder layer
    and with none: (prefill points, decode points)."""
    model = CausalLM(replace(config, num_layers=1)).eval()
    longest = max(max(n + p for n, p in PREFILL_POINTS), max(c for _, c in DECODE_POINTS) + 8)
    engine = Engine(model, None, (max(b for b, _ in DECODE_POINTS) + 1) * blocks_for(longest))
    params = SamplingParams(max_tokens=longest, ignore_eos=True)
    one_layer, no_layer = model.model.layers, nn.ModuleList()
    ids = iter(range(1 << 30))

    def prefill_s(new: int, prior: int) -> float:
        times = []
        for _ in range(REPEATS + 1):
            rid = next(ids)
            engine.add(rid, [5] * (prior + new), params)
            if prior:
                engine.run([], [(rid, prior)])
            start = clock()
            engine.run([], [(rid, new)])
            times.append(clock() - start)
            engine.release(rid)
        return min(times[1:])

    def decode_s(batch: list[int]) -> float:
        times = []
        for _ in range(REPEATS + 1):
            start = clock()
            engine.run(batch, [])
            times.append(clock() - start)
        return min(times[1:])

    prefill, decode = [], []
    for new, prior in PREFILL_POINTS:
        model.model.layers = one_layer
        one = prefill_s(new, prior)
        model.model.layers = no_layer
        prefill.append((one, prefill_s(new, prior)))
    for size, context in DECODE_POINTS:
        model.model.layers = one_layer  # the batch's KV is computed with the layer
        batch = [next(ids) for _ in range(size)]
        for rid in batch:
            engine.add(rid, [5] * context, params)
            engine.run([], [(rid, context)])
        one = decode_s(batch)
        model.model.layers = no_layer
        decode.append((one, decode_s(batch)))
        for rid in batch:
            engine.release(rid)
    return prefill, decode


def probe_model(config: ModelConfig, kv_blocks: int, name: str,
                clock: Callable[[], float] = time.perf_counter) -> PerfModel:
    """The layer probe's model of `config` (see the module's docstring)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a worker runs
    try:
        with torch.inference_mode():
            prefill, decode = _probe_points(config, clock)
    finally:
        torch.set_num_threads(threads)
    layers = config.num_layers

    def scaled(one: float, none: float) -> float:
        return none + layers * max(0.0, one - none)

    prefill_fit = fit_prefill([(n, p, scaled(*t)) for (n, p), t in zip(PREFILL_POINTS, prefill,
                                                                       strict=True)])
    decode_fit = fit_decode([(b, b * (c + 1), scaled(*t)) for (b, c), t in zip(
        DECODE_POINTS, decode, strict=True)])
    return PerfModel(
        name=f"{name} (provisional: layer probe x{SAFETY:g})",
        prefill=_safe_prefill(prefill_fit), decode=_safe_decode(decode_fit),
        transfer=TransferCoeffs(TRANSFER_CALL_S, TRANSFER_BYTES_PER_S),
        kv_bytes_per_token=config.kv_bytes_per_token,
        kv_capacity_tokens=kv_blocks * KV_BLOCK_TOKENS)


def _safe_prefill(fit: PrefillCoeffs) -> PrefillCoeffs:
    return PrefillCoeffs(SAFETY * max(0.0, fit.intercept_s), SAFETY * max(0.0, fit.per_token_s),
                         SAFETY * max(0.0, fit.per_attn_unit_s), fit.r2)


def _safe_decode(fit: DecodeCoeffs) -> DecodeCoeffs:
    return DecodeCoeffs(SAFETY * max(0.0, fit.intercept_s), SAFETY * max(0.0, fit.per_seq_s),
                        SAFETY * max(0.0, fit.per_context_token_s),
                        SAFETY * max(0.0, fit.batch1_extra_s), fit.r2)


def provisional_model(model_spec: str, weights_identity: str, kv_blocks: int
                      ) -> tuple[PerfModel, str]:
    """The provisional model for the served model and where it came from: an earlier
    profile of these weights here, else the layer probe (see the module's docstring)."""
    earlier = earlier_profile(weights_identity, kv_blocks)
    if earlier is not None:
        return earlier
    config = resolve_model(model_spec).config
    started = time.perf_counter()
    model = probe_model(config, kv_blocks, model_spec or "the default model")
    return model, (f"the layer probe of this machine ({time.perf_counter() - started:.1f}s), "
                   f"x{SAFETY:g}")
