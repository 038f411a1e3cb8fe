"""A live engine keeps a session's history KV and merges a remote prefill onto it."""

from __future__ import annotations

from unittest import mock

import torch

from pdserve.engine import transfer
from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.types import blocks_for

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def engine() -> Engine:
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny", seed=0)
    return Engine(model, tokenizer, 64)


def run_to_end(e: Engine, rid: int, prefill_tokens: int) -> list[int]:
    e.run([], [(rid, prefill_tokens)])
    while not e.sequences[rid].finish_reason:
        e.run([rid], [])
    return e.sequences[rid].generated


def test_history_is_kept_reused_by_prefix_and_merged_after_a_remote_prefill() -> None:
    home = engine()
    first = list(range(5, 45))  # 40 prompt tokens
    home.add(1, first, GREEDY, session_id=3)
    answer = run_to_end(home, 1, len(first))
    home.release(1, keep_session=3)
    kept = len(first) + len(answer) - 1
    assert 3 in home.sessions and home.allocator.free_blocks < 64

    second = first + answer + list(range(60, 80))
    # a remote prefill worker computes the whole round-2 prompt ...
    remote = engine()
    remote.add(2, second, GREEDY)
    remote.run([], [(2, len(second))])
    handoff = remote.export(2)
    # ... and the home engine takes over its kept history, copying only the rest
    copied_blocks: list[int] = []
    real_copy = transfer.copy_aligned

    def counting_copy(source, target, source_blocks, target_blocks):
        copied_blocks.extend(source_blocks)
        return real_copy(source, target, source_blocks, target_blocks)
    with mock.patch("pdserve.engine.engine.copy_aligned", counting_copy):
        home.import_from(handoff, remote.pool, session_id=3)
    assert home.reused_tokens_total == kept
    assert len(copied_blocks) == blocks_for(len(second)) - kept // 16
    assert 3 not in home.sessions
    while not home.sequences[2].finish_reason:  # decode continues as the remote would
        home.run([2], [])
        remote.run([2], [])
    assert home.sequences[2].generated == remote.sequences[2].generated


def test_local_round_computes_only_tokens_past_the_common_prefix() -> None:
    e = engine()
    first = list(range(5, 37))
    e.add(1, first, GREEDY, session_id=9)
    answer = run_to_end(e, 1, len(first))
    e.release(1, keep_session=9)
    edited = first[:20] + [99] + first[21:] + answer  # the client changed token 20
    reused = e.add(2, edited, GREEDY, session_id=9)
    assert reused == 20  # only the agreeing prefix
    assert e.sequences[2].computed_tokens == 20
    fresh = engine()
    fresh.add(2, edited, GREEDY)
    assert run_to_end(e, 2, len(edited) - 20) == run_to_end(fresh, 2, len(edited))
