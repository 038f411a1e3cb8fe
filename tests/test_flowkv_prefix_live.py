"""Live prefix caching: a worker (in this process) serving the same prompt twice computes
only the uncached suffix the second time, with the same greedy output."""

from __future__ import annotations

from multiprocessing import Pipe

import pytest

pytest.importorskip("torch")

from pdserve.engine.sampling import SamplingParams  # noqa: E402
from pdserve.worker.messages import AddRequest, ContinueInPlace, Prefilled, StepDone  # noqa: E402
from pdserve.worker.worker import Worker  # noqa: E402


def serve_one(worker: Worker, driver_end, request_id: int, prompt: tuple[int, ...],
              max_tokens: int) -> list[int]:
    worker.handle(AddRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens,
                                                                ignore_eos=True)))
    tokens: list[int] = []
    for _ in range(200):
        if not worker.step():
            break
        while driver_end.poll():
            message = driver_end.recv()
            if isinstance(message, Prefilled):
                worker.handle(ContinueInPlace(message.handoff.request_id))
            elif isinstance(message, StepDone):
                tokens += [token for rid, token, _, _ in message.tokens if rid == request_id]
    return tokens


def test_a_repeated_prompt_reuses_its_cached_blocks_and_decodes_the_same():
    driver_end, worker_end = Pipe()
    worker = Worker(7, "tiny", 0, 256, 64, 8, worker_end, "decode-first", 16)
    try:
        prompt = tuple(range(5, 75))  # 70 tokens: 4 full blocks of 16 and 6 more
        first = serve_one(worker, driver_end, 1, prompt, 6)
        engine, cache = worker.engine, worker.local.prefix_cache
        assert cache is not None and engine.prefix_hit_tokens_total == 0
        computed_before = engine.computed_tokens_total
        assert computed_before == 70 + 5  # the whole prompt, then 5 decode steps
        assert len(cache) == 4  # the prompt's full blocks stayed cached after it finished
        second = serve_one(worker, driver_end, 2, prompt, 6)
        assert second == first and len(first) == 6
        assert engine.prefix_hit_tokens_total == 64  # 4 blocks reused
        assert engine.computed_tokens_total - computed_before == 6 + 5  # the suffix only
        assert cache.hit_tokens_total == 64
        other = serve_one(worker, driver_end, 3, (1,) + prompt[1:], 3)
        assert len(other) == 3 and engine.prefix_hit_tokens_total == 64  # chain differs
        assert worker.local.used_blocks == 0 and worker.local.free_blocks == 256
        # every block not cached is free in the engine too
        assert engine.allocator.free_blocks == 256 - cache.cached_blocks
    finally:
        worker.engine.pool.close()
