"""Live engine plumbing: KV transfer speed, sampler cost, copy counts (the model's own speed
against transformers is `engine_speed.py`).

1. KV transfer between two processes through the shared-memory pool: a 1024-block
   sequence (64 MiB for tiny) copied as one aligned run, and block by block. Target:
   >= 5 GB/s.
2. Sampler cost per step at batch 32 (random logits, 512-token contexts) for tiny's vocabulary
   and a 152K one (Qwen2's), from plain greedy (one argmax) to every filter, penalty, bias
   and logprobs at once.
3. Copy operations per transfer after realistic allocator churn (sequences growing and
   finishing on both instances): with FlowKV alignment, one copy per block (paged layout
   with all layers in a block), and one per block per layer per K/V (the layout FlowKV
   replaces).

    python bench/engine_kv.py
"""

from __future__ import annotations

import multiprocessing
import os
import random
import statistics
import time

import torch

from pdserve.engine.allocator import SegmentAllocator, align
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams, sample_batch, token_logprobs
from pdserve.engine.transfer import attach_pool, copy_aligned, copy_per_block

TRANSFER_BLOCKS = 1024


def transfer_source(name: str, shape: tuple, ready, done) -> None:
    """Child: a shared pool filled with data, kept alive until the parent is done."""
    blocks, layers, _, block_size, kv_heads, dim = shape
    pool = PagedKVPool(blocks, layers, kv_heads, dim, block_size, shared_name=name)
    pool.data.normal_()
    ready.set()
    done.wait(120)
    pool.close()


def transfer_table() -> None:
    model, _ = load_model("tiny")
    c = model.config
    target = PagedKVPool(TRANSFER_BLOCKS, c.num_layers, c.num_kv_heads, c.head_dim)
    context = multiprocessing.get_context("spawn")
    ready, done = context.Event(), context.Event()
    name = f"pdserve-bench-{os.getpid()}"
    child = context.Process(target=transfer_source, args=(name, target.shape, ready, done))
    child.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the source process did not start")
        source = attach_pool(name, target)
        blocks = list(range(TRANSFER_BLOCKS))
        size = TRANSFER_BLOCKS * target.block_bytes
        print(f"\nKV transfer between two processes, {TRANSFER_BLOCKS} blocks = "
              f"{size / 2**20:.0f} MiB of tiny's KV")
        for label, copy in (("aligned (1 copy)", copy_aligned),
                            (f"per block ({TRANSFER_BLOCKS} copies)", copy_per_block)):
            times = []
            for _ in range(6):
                start = time.perf_counter()
                copy(source, target, blocks, blocks)
                times.append(time.perf_counter() - start)
            seconds = statistics.median(times[1:])
            print(f"  {label:<24} {seconds * 1e3:7.2f} ms  {size / seconds / 1e9:6.2f} GB/s")
        assert torch.equal(source.data, target.data)
        source.close()
    finally:
        done.set()
        child.join(60)


SAMPLER_SETUPS = {
    "greedy": SamplingParams(),
    "temperature 0.8": SamplingParams(temperature=0.8),
    "+ top-k 50, top-p 0.9": SamplingParams(temperature=0.8, top_k=50, top_p=0.9),
    "+ penalties, bias, min-p, logprobs 5": SamplingParams(
        temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, presence_penalty=0.5,
        frequency_penalty=0.5, repetition_penalty=1.1, logit_bias=((7, 2.0), (9, -5.0)),
        logprobs=5),
}


class BenchRow:
    def __init__(self, request_id: int, params: SamplingParams, vocab: int) -> None:
        rng = random.Random(request_id)
        self.request_id, self.params, self.prompt_tokens = request_id, params, 256
        self.token_ids = [rng.randrange(vocab) for _ in range(512)]


def sampler_table(batch: int = 32) -> None:
    print(f"\nsampler per step, batch {batch}, 512-token contexts (256 prompt + 256 output)")
    print(f"{'setup':<38}{'vocab 2048 us':>15}{'vocab 151936 us':>17}")
    for label, params in SAMPLER_SETUPS.items():
        cells = []
        for vocab in (2048, 151936):
            logits = torch.randn(batch, vocab)
            rows = [BenchRow(i, params, vocab) for i in range(batch)]
            times = []
            for _ in range(7):
                start = time.perf_counter()
                tokens = sample_batch(logits, rows, eos_token_ids=(2,))
                if params.logprobs is not None:
                    token_logprobs(logits, tokens, [params.logprobs] * batch)
                times.append(time.perf_counter() - start)
            cells.append(statistics.median(times[1:]) * 1e6)
        print(f"{label:<38}{cells[0]:>15.0f}{cells[1]:>17.0f}")


def prefill_scenario(rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """P->D hand-offs: prompts allocated whole on a churned sender and receiver."""
    sender, receiver = SegmentAllocator(4096), SegmentAllocator(4096)
    for allocator in (sender, receiver):
        live: dict[int, list[int]] = {}
        for _ in range(3000):
            if live and (rng.random() < 0.3 or allocator.free_blocks < 40):
                allocator.free(live.pop(rng.choice(list(live))))
            else:
                owned = live.setdefault(rng.randrange(200), [])
                count = min(rng.randint(1, 12), allocator.free_blocks)
                owned += allocator.allocate(count, after=owned[-1] if owned else None)
    pairs = []
    for _ in range(200):
        length = rng.randint(1, 64)
        src, dst = sender.allocate(length), receiver.allocate(length)
        pairs.append((src, dst))
        sender.free(src)
        receiver.free(dst)
    return pairs


def decode_growth_scenario(rng: random.Random) -> list[tuple[list[int], list[int]]]:
    """Moves of running decodes (ARES-style migration): 64 sequences start with a prompt
    and then grow one block at a time, interleaved, on both sides."""
    pairs = []
    for _ in range(4):
        sides = []
        for _ in range(2):
            allocator = SegmentAllocator(4096)
            sequences = [allocator.allocate(rng.randint(1, 16)) for _ in range(64)]
            for _ in range(20):
                for blocks in sequences:
                    if rng.random() < 0.5:
                        blocks += allocator.allocate(1, after=blocks[-1])
            sides.append(sequences)
        for src, dst in zip(*sides, strict=True):
            size = min(len(src), len(dst))
            pairs.append((src[:size], dst[:size]))
    return pairs


def copies_table() -> None:
    rng = random.Random(1)
    layers = 4
    print(f"\ncopy operations per transfer (tiny has {layers} layers)")
    print(f"{'scenario':<34}{'aligned':>9}{'per block':>11}{'per block per layer':>21}")
    for label, pairs in (("P->D after prefill (churned pools)", prefill_scenario(rng)),
                         ("running decode, grown interleaved", decode_growth_scenario(rng))):
        aligned = statistics.mean(len(align(src, dst)) for src, dst in pairs)
        per_block = statistics.mean(len(src) for src, _ in pairs)
        print(f"{label:<34}{aligned:>9.2f}{per_block:>11.2f}{per_block * layers * 2:>21.2f}")


def main() -> None:
    torch.set_num_threads(1)
    transfer_table()
    sampler_table()
    copies_table()


if __name__ == "__main__":
    main()
