"""Sampling inside the engine: resumed runs, hand-offs and migrations draw what one
uninterrupted run draws; logprobs and prompt logprobs; min_tokens and ignore_eos."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import greedy
from test_engine import prompt_of

from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.transfer import copy_aligned

torch.set_num_threads(1)

SAMPLED = SamplingParams(max_tokens=14, temperature=0.9, top_p=0.95, frequency_penalty=0.6,
                         repetition_penalty=1.2, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", seed=0)


def finish(engine: Engine, request_id: int, chunk: int | None = None) -> list[int]:
    """Prefill what is not computed yet (in chunks), then decode to the end."""
    sequence = engine.sequences[request_id]
    known = len(sequence.token_ids)
    while sequence.computed_tokens < known:
        left = known - sequence.computed_tokens
        engine.run([], [(request_id, min(chunk or left, left))])
    while not sequence.finish_reason:
        engine.run([request_id], [])
    return sequence.generated


@pytest.mark.parametrize("resumed", [1, 6, 13])
def test_a_resumed_run_draws_what_the_uninterrupted_run_drew(tiny, resumed):
    model, tokenizer = tiny
    prompt = prompt_of(40, 2048, seed=11)
    engine = Engine(model, tokenizer, 64)
    engine.add(5, prompt, SAMPLED)  # unseeded: the request id is the key
    full = finish(engine, 5)
    assert len(full) == 14 and len(set(full)) > 3
    again = Engine(model, tokenizer, 64)
    again.add(5, prompt, SAMPLED, resume_ids=tuple(full[:resumed]))
    assert again.sequences[5].generated == full[:resumed]  # resumed tokens count as output
    assert finish(again, 5, chunk=16) == full  # max_tokens counts the resumed tokens too
    other = Engine(model, tokenizer, 64)
    other.add(6, prompt, SAMPLED)
    assert finish(other, 6) != full  # another request id, another stream


def test_p_to_d_hand_off_and_mid_decode_migration_equal_a_single_instance(tiny):
    model, tokenizer = tiny
    prompt = prompt_of(50, 2048, seed=12)
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3, top_k=40,
                            presence_penalty=0.5, stop=("zz",), ignore_eos=True)
    single = Engine(model, tokenizer, 64)
    single.add(1, prompt, params)
    expected = finish(single, 1)
    prefill, decode, last = (Engine(model, tokenizer, 64) for _ in range(3))
    decode.allocator.allocate(3)  # different block ids on each side
    prefill.add(1, prompt, params)
    prefill.run([], [(1, len(prompt))])
    for source, target in ((prefill, decode), (decode, last)):
        handoff = source.export(1)
        copy_aligned(source.pool, target.pool, list(handoff.blocks), target.adopt(handoff))
        source.release(1)
        for _ in range(4):
            target.run([1], [])
    assert finish(last, 1) == expected


def test_logprobs_come_from_the_raw_logits_with_the_top_alternatives(tiny):
    model, tokenizer = tiny
    prompt = prompt_of(20, 2048, seed=13)
    engine = Engine(model, tokenizer, 64)
    engine.add(0, prompt, SamplingParams(max_tokens=6, logprobs=4, ignore_eos=True))
    engine.add(1, prompt, SamplingParams(max_tokens=6, logprobs=0, temperature=1.0,
                                         frequency_penalty=2.0, ignore_eos=True))
    engine.add(2, prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    outputs = engine.run([], [(0, 20), (1, 20), (2, 20)])
    while not engine.sequences[0].finish_reason:
        outputs += engine.run([0, 1, 2], [])
    assert len(outputs) == 18
    for output in outputs:
        if output.request_id == 2:
            assert output.logprob is None
            continue
        reference = torch.log_softmax(output.logits.float(), dim=-1)
        assert torch.exp(reference).sum() == pytest.approx(1.0, abs=1e-5)
        logprob = output.logprob
        assert logprob.token_id == output.token_id
        assert logprob.logprob == pytest.approx(float(reference[output.token_id]), abs=1e-6)
        assert logprob.logprob <= 0
        if output.request_id == 0:  # greedy: the chosen token is the top alternative
            assert len(logprob.top) == 4 and logprob.top[0][0] == output.token_id
            values = [value for _, value in logprob.top]
            assert values == sorted(values, reverse=True)
        else:
            assert logprob.top == ()


def test_prompt_logprobs_match_the_logits_of_each_prefix(tiny):
    model, tokenizer = tiny
    prompt = prompt_of(30, 2048, seed=14)
    params = SamplingParams(max_tokens=2, prompt_logprobs=2, ignore_eos=True)
    one_shot, chunked = Engine(model, tokenizer, 64), Engine(model, tokenizer, 64)
    one_shot.add(0, prompt, params)
    chunked.add(0, prompt, params)
    finish(one_shot, 0)
    finish(chunked, 0, chunk=7)
    whole, pieces = one_shot.sequences[0].prompt_logprobs, chunked.sequences[0].prompt_logprobs
    assert len(whole) == len(pieces) == 30 and whole[0] is None and pieces[0] is None
    for position in (1, 7, 8, 29):
        _, logits = greedy(Engine(model, tokenizer, 64), 9, prompt[:position], 1)
        expected = float(torch.log_softmax(logits, dim=-1)[prompt[position]])
        for logprobs in (whole, pieces):
            assert logprobs[position].token_id == prompt[position]
            assert logprobs[position].logprob == pytest.approx(expected, abs=1e-4)
            assert len(logprobs[position].top) == 2


def test_min_tokens_holds_back_eos_and_stop_strings_and_ignore_eos_ignores_eos(tiny):
    model, tokenizer = tiny
    prompt = tokenizer.encode("Hello")
    reference = Engine(model, tokenizer, 64)
    reference.add(0, prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    free_run = finish(reference, 0)
    text = reference.text_of(0)
    model.config.__dict__["eos_token_ids"] = (free_run[0],)  # the first token is now EOS
    try:
        engine = Engine(model, tokenizer, 64)
        engine.add(1, prompt, SamplingParams(max_tokens=6))
        assert finish(engine, 1) == free_run[:1]
        assert engine.sequences[1].finish_reason == "stop"
        engine.add(2, prompt, SamplingParams(max_tokens=6, ignore_eos=True))
        assert finish(engine, 2) == free_run
        engine.add(3, prompt, SamplingParams(max_tokens=6, min_tokens=3))
        held = finish(engine, 3)
        assert len(held) >= 3 and free_run[0] not in held[:3]
    finally:
        model.config.__dict__["eos_token_ids"] = tokenizer.eos_token_ids
    stop = text[:2]  # appears in the first output token's text
    engine.add(5, prompt, SamplingParams(max_tokens=6, stop=(stop,), ignore_eos=True))
    assert len(finish(engine, 5)) < len(free_run)  # without min_tokens it stops early
    engine.add(4, prompt, SamplingParams(max_tokens=6, stop=(stop,), ignore_eos=True,
                                         min_tokens=len(free_run)))
    assert finish(engine, 4) == free_run  # the stop string came too early to count
