"""Profile a live engine and fit the simulator's performance model to it.

Measures, with one torch thread (as a worker runs):
  prefill   one chunk of n new tokens after p prior tokens, over a grid of (n, p)
  decode    one step of B sequences of c context tokens each, over a grid of (B, c)
  transfer  copies between two shared-memory pools (runs of 1 block up to a whole sequence)
Each point is the median of `repeats` runs after a warm-up. The fits (`pdserve.perf.fit`)
and their R^2 go into a `PerfModel` file, which `pdserve simulate --perf-model` and Arrow's
TTFT predictor load.

`contention` other processes run the same model decoding a batch in a loop while the
measurement runs, so the fitted times include the CPU (and memory bandwidth) sharing of a
deployment with that many other workers on the machine.

On a GPU (`where`, `pdserve profile --device cuda`) each point is timed on the host clock
around `Engine.run`, which ends by copying the logits to the host, so the GPU's work is
done when the clock stops; transfers are then block copies between two pools on the GPU
(what a CUDA IPC hand-off does). `measure_engine` returns the raw points
(`bench/gpu_check.py` sets them against the calibrated simulator's prediction).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from pdserve.engine.config import ModelConfig
from pdserve.engine.device import EngineDevice
from pdserve.engine.engine import Engine
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.loader import load_model
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.transfer import copy_aligned
from pdserve.perf.fit import fit_decode, fit_prefill, fit_transfer
from pdserve.perf.fitted import PerfModel
from pdserve.types import KV_BLOCK_TOKENS, blocks_for


@dataclass(frozen=True)
class ProfileGrid:
    prefill_tokens: tuple[int, ...] = (16, 64, 128, 256, 512, 1024, 2048)
    prior_tokens: tuple[int, ...] = (0, 512, 2048)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    context_per_sequence: tuple[int, ...] = (64, 256, 1024)
    transfer_blocks: tuple[int, ...] = (1, 8, 64, 256)
    repeats: int = 3


@dataclass(frozen=True)
class ProfileSamples:
    """The measured points: prefill (new, prior tokens, s), decode (batch, context tokens
    in all, s) and transfer (bytes, copies, s)."""

    prefill: list[tuple[int, int, float]]
    decode: list[tuple[int, int, float]]
    transfer: list[tuple[float, float, float]]
    kv_bytes_per_token: int


QUICK_GRID = ProfileGrid(prefill_tokens=(16, 128, 512), prior_tokens=(0, 256),
                         batch_sizes=(1, 2, 8), context_per_sequence=(64, 256),
                         transfer_blocks=(1, 16, 64), repeats=2)


def fit_grid_to_context(grid: ProfileGrid, context_tokens: int) -> ProfileGrid:
    """Drop the grid points a model of `context_tokens` positions cannot hold (a checkpoint
    with a short context must still profile)."""
    room = context_tokens - grid.repeats - 2  # each sequence also decodes a few tokens
    prior = tuple(p for p in grid.prior_tokens if p + min(grid.prefill_tokens) <= room)
    new = tuple(n for n in grid.prefill_tokens if min(prior or (0,)) + n <= room)
    contexts = tuple(c for c in grid.context_per_sequence if c <= room)
    if not (prior and new and contexts):
        raise ValueError(f"a context of {context_tokens} tokens is too short to profile")
    return replace(grid, prior_tokens=prior, prefill_tokens=new, context_per_sequence=contexts)


def _median(times: list[float]) -> float:
    return statistics.median(times[1:])  # the first run is a warm-up


def _busy_decoder(model_name: str, ready, stop) -> None:
    """A background process decoding 8 sequences until told to stop."""
    torch.set_num_threads(1)
    model, tokenizer = load_model(model_name)
    engine = Engine(model, tokenizer, 512)
    params = SamplingParams(max_tokens=512, ignore_eos=True)

    def restart() -> None:
        for rid in range(8):
            if rid in engine.sequences:
                engine.release(rid)
            engine.add(rid, [5] * 256, params)
            engine.run([], [(rid, 256)])

    restart()
    ready.set()
    steps = 0
    while not stop.is_set():
        engine.run(list(range(8)), [])
        steps += 1
        if steps % 200 == 0:  # stay within max_tokens and the pool: start over
            restart()


@contextmanager
def _contention(model_name: str, processes: int) -> Iterator[None]:
    if processes <= 0:
        yield
        return
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    readies = [context.Event() for _ in range(processes)]
    workers = [context.Process(target=_busy_decoder, args=(model_name, ready, stop), daemon=True)
               for ready in readies]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + 300
        while not all(ready.is_set() for ready in readies):
            if time.monotonic() > deadline or not all(w.is_alive() for w in workers):
                raise RuntimeError("a contention process did not start")
            time.sleep(0.1)
        yield
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()


def profile_engine(model_name: str, kv_blocks: int = 4096, grid: ProfileGrid = ProfileGrid(),
                   progress: Callable[[str], None] | None = None,
                   contention: int = 0, where: EngineDevice | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> PerfModel:
    if contention < 0:
        raise ValueError(f"contention must not be negative, got {contention}")
    where = where or EngineDevice()
    with _contention(model_name, contention):
        samples = measure_engine(model_name, grid, progress, where, clock)
    on = "1 thread" if where.on_cpu else f"{where.device} {where.dtype}"
    model = PerfModel(name=f"{model_name} (profiled, {on})",
                      prefill=fit_prefill(samples.prefill), decode=fit_decode(samples.decode),
                      transfer=fit_transfer(samples.transfer),
                      kv_bytes_per_token=samples.kv_bytes_per_token,
                      kv_capacity_tokens=kv_blocks * KV_BLOCK_TOKENS)
    if contention:
        model = replace(model, name=f"{model.name}, {contention} other workers decoding")
    return model


def measure_engine(model_name: str, grid: ProfileGrid = ProfileGrid(),
                   progress: Callable[[str], None] | None = None,
                   where: EngineDevice | None = None,
                   clock: Callable[[], float] = time.perf_counter) -> ProfileSamples:
    """`clock`: what a point's time is read from; the CPU time of this thread
    (`time.thread_time`, on the CPU only) measures what an idle core would take even while
    other processes preempt this one (the server's background profile)."""
    where = where or EngineDevice()
    torch.set_num_threads(1)
    model, tokenizer = load_model(model_name, where=where)
    say = progress or (lambda message: None)
    context = model.config.max_position_embeddings
    grid = fit_grid_to_context(grid, context)
    room = context - grid.repeats - 2
    points = [(p, n) for p in grid.prior_tokens for n in grid.prefill_tokens if p + n <= room]
    longest_prompt = max(max(p + n for p, n in points), max(grid.context_per_sequence))
    params = SamplingParams(max_tokens=context - longest_prompt, ignore_eos=True)

    # the measuring pool holds the largest grid point; `kv_blocks` is only what the model
    # reports as the deployment's capacity
    largest = max(max(grid.batch_sizes) * (max(grid.context_per_sequence) + grid.repeats + 2),
                  max(grid.prior_tokens) + max(grid.prefill_tokens))
    pool_blocks = blocks_for(largest) + max(grid.batch_sizes)

    def engine_with(sequences: int, prefilled_tokens: int, extra_tokens: int = 0) -> Engine:
        """A fresh engine holding `sequences` sequences with their first tokens computed."""
        engine = Engine(model, tokenizer, pool_blocks, device=where)
        for rid in range(sequences):
            engine.add(rid, [5] * (prefilled_tokens + extra_tokens), params)
            if prefilled_tokens:
                engine.run([], [(rid, prefilled_tokens)])
        return engine

    prefill = []
    for prior in grid.prior_tokens:
        for new in grid.prefill_tokens:
            if prior + new > room:
                continue
            times = []
            for _ in range(grid.repeats + 1):
                engine = engine_with(1, prior, new)
                start = clock()
                engine.run([], [(0, new)])
                times.append(clock() - start)
            prefill.append((new, prior, _median(times)))
        say(f"prefill after {prior} prior tokens: done")
    decode = []
    for batch in grid.batch_sizes:
        for context in grid.context_per_sequence:
            engine = engine_with(batch, context)
            times = []
            for _ in range(grid.repeats + 1):
                start = clock()
                engine.run(list(range(batch)), [])
                times.append(clock() - start)
            decode.append((batch, batch * (context + 1), _median(times)))
        say(f"decode batch {batch}: done")
    transfer = _profile_transfer(model.config, grid, where, clock)
    say("transfer: done")
    kv_bytes = model.config.kv_elements_per_token * where.element_bytes
    return ProfileSamples(prefill, decode, transfer, kv_bytes)


def _profile_transfer(config: ModelConfig, grid: ProfileGrid, where: EngineDevice,
                      clock: Callable[[], float] = time.perf_counter
                      ) -> list[tuple[float, float, float]]:
    """Copies between two pools (shared memory on the CPU, the GPU's memory on a GPU), as
    one aligned run and block by block: (bytes, copies, seconds)."""
    size = max(grid.transfer_blocks)
    source, target = (
        PagedKVPool(size, config.num_layers, config.num_kv_heads, config.head_dim,
                    shared_name=(f"pdserve-profile-{os.getpid()}-{side}" if where.on_cpu
                                 else None),
                    dtype=where.torch_dtype, device=where.torch_device)
        for side in ("source", "target"))
    samples = []
    try:
        for blocks in grid.transfer_blocks:
            ordered = list(range(blocks))
            for target_blocks in (ordered, ordered[::-1]):  # 1 copy, then `blocks` copies
                times, copies = [], 0
                for _ in range(grid.repeats + 1):
                    start = clock()
                    copies = copy_aligned(source, target, ordered, target_blocks)
                    times.append(clock() - start)
                samples.append((blocks * source.block_bytes, copies, _median(times)))
    finally:
        source.close()
        target.close()
    return samples
