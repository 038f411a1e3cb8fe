"""The batched sampler: each filter and penalty, robustness, seeded purity, logprobs."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import pytest
import torch

from pdserve.engine.logits_processing import process_logits
from pdserve.engine.sampling import (
    LOGPROB_FLOOR,
    SamplingParams,
    draw_uniform,
    sample_batch,
    token_logprobs,
)
from pdserve.engine.text_stream import TextStream
from pdserve.engine.tokenizer import TextTokenizer

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])


@dataclass
class Row:
    params: SamplingParams
    token_ids: list[int] = field(default_factory=lambda: [0])
    prompt_tokens: int = 1
    request_id: int = 0


def draws(logits: torch.Tensor, params: SamplingParams, count: int = 300) -> list[int]:
    """One draw each for `count` different seeds (the same logits)."""
    rows = [Row(params, request_id=seed) for seed in range(count)]
    return sample_batch(logits.expand(count, -1), rows)


@pytest.mark.parametrize(("field_name", "value"), [
    ("max_tokens", 0), ("temperature", -0.1), ("temperature", math.inf),
    ("temperature", math.nan), ("top_p", 0.0), ("top_p", 1.5), ("top_p", math.nan),
    ("seed", 2 ** 64), ("seed", -(2 ** 63) - 1), ("top_k", -1), ("min_p", 1.5),
    ("presence_penalty", 2.5), ("frequency_penalty", -3.0), ("repetition_penalty", 0.0),
    ("repetition_penalty", math.inf), ("logit_bias", ((5, 101.0),)),
    ("logit_bias", ((-1, 1.0),)), ("logit_bias", ((5, math.nan),)), ("min_tokens", -1),
    ("min_tokens", 17), ("logprobs", -1), ("logprobs", 21), ("prompt_logprobs", 21),
    ("max_tokens", 4.0), ("top_k", True), ("seed", "5"), ("logit_bias", ((5.0, 1.0),)),
])
def test_out_of_range_parameters_are_refused_naming_the_field(field_name, value):
    with pytest.raises(ValueError, match=f"^{field_name} must be"):
        SamplingParams(**{field_name: value})


def test_temperature_zero_and_near_zero_are_greedy_and_never_raise():
    for params in (SamplingParams(), SamplingParams(temperature=1e-300),
                   SamplingParams(temperature=1e-6), SamplingParams(temperature=1.0,
                                                                   top_p=5e-324)):
        assert set(draws(LOGITS, params, 50)) == {4}
    # just above the greedy threshold: logits / 1e-5 would overflow without the max shift
    assert set(draws(LOGITS * 1e3, SamplingParams(temperature=2e-5), 50)) == {4}


def test_plain_sampling_reaches_every_token_and_top_p_keeps_the_nucleus():
    assert set(draws(LOGITS, SamplingParams(temperature=1.0))) == {0, 1, 2, 3, 4}
    nucleus = set(draws(LOGITS, SamplingParams(temperature=1.0, top_p=0.7)))
    assert nucleus == {0, 4}  # p(4)=0.63, then 0 brings the mass past 0.7


def test_top_k_one_equals_greedy_and_top_k_limits_the_support():
    logits = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
    rows = [Row(SamplingParams(temperature=1.5, top_k=1), request_id=i) for i in range(40)]
    assert sample_batch(logits, rows) == torch.argmax(logits, dim=-1).tolist()
    assert set(draws(LOGITS, SamplingParams(temperature=5.0, top_k=2))) == {0, 4}


def test_min_p_drops_tokens_below_its_share_of_the_top_probability():
    logits = torch.tensor([3.0, 2.9, 2.0, 0.0, -1.0])  # probs .46 .42 .17 .02 .01
    assert set(draws(logits, SamplingParams(temperature=1.0, min_p=0.3))) == {0, 1, 2}
    assert set(draws(logits, SamplingParams(temperature=1.0, min_p=0.5))) == {0, 1}


def test_logit_bias_forbids_or_forces_a_token_and_ignores_ids_outside_the_vocabulary():
    forbid = SamplingParams(temperature=1.0, logit_bias=((4, -100.0), (99, 100.0)))
    assert 4 not in draws(LOGITS, forbid, 500)
    force = SamplingParams(temperature=1.0, logit_bias=((3, 100.0),))
    assert set(draws(LOGITS, force)) == {3}
    assert set(draws(LOGITS, SamplingParams(logit_bias=((3, 100.0),)), 5)) == {3}  # greedy


def test_presence_and_frequency_penalties_follow_openai_over_the_output_only():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=1.0)
    row = Row(params, token_ids=[1, 1, 1, 4, 4, 4, 0], prompt_tokens=3)  # output: 4 4 4 0
    scores = process_logits(LOGITS.unsqueeze(0), [row])
    expected = LOGITS - torch.tensor([1.5, 0.0, 0.0, 0.0, 3.5])  # prompt's 1s not counted
    assert torch.allclose(scores[0], expected)
    # greedy would repeat token 4; with the penalty the repeat loses to token 0
    assert sample_batch(LOGITS.unsqueeze(0), [Row(SamplingParams(frequency_penalty=0.4),
                                                  token_ids=[2, 4, 4, 4])]) == [0]


def test_frequency_penalty_lowers_repeats_in_sampled_output():
    """A constructed case: 5 tokens of equal logits; without a penalty a long sample repeats
    tokens as often as chance gives; with a strong frequency penalty each new draw prefers
    tokens not yet used, so the first 5 draws are all distinct."""
    logits = torch.zeros(5)

    def generate(params: SamplingParams) -> list[int]:
        row = Row(params, token_ids=[0], request_id=3)
        for _ in range(5):
            row.token_ids.append(sample_batch(logits.unsqueeze(0), [row])[0])
        return row.token_ids[1:]

    plain = generate(SamplingParams(temperature=1.0))
    penalized = generate(SamplingParams(temperature=1.0, frequency_penalty=2.0))
    assert len(set(plain)) < 5 and len(set(penalized)) == 5


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    row = Row(SamplingParams(repetition_penalty=2.0), token_ids=[0, 3, 4], prompt_tokens=2)
    scores = process_logits(LOGITS.unsqueeze(0), [row])
    assert torch.allclose(scores[0], torch.tensor([1.0, 1.0, 0.5, -2.0, 1.5]))


def test_min_tokens_masks_eos_until_enough_output_then_allows_it():
    eos_favoured = torch.tensor([0.0, 0.0, 9.0, 0.0])  # token 2 is EOS
    params = SamplingParams(min_tokens=2)
    early = Row(params, token_ids=[0, 1], prompt_tokens=1)  # one output token so far
    late = Row(params, token_ids=[0, 1, 3], prompt_tokens=1)
    assert sample_batch(eos_favoured.expand(2, -1), [early, late], eos_token_ids=(2,)) == [
        0, 2]
    ignoring = Row(SamplingParams(min_tokens=2, ignore_eos=True), token_ids=[0, 1])
    assert process_logits(eos_favoured.unsqueeze(0), [ignoring], (2,)) is None


def test_nan_and_infinite_logits_fall_back_to_greedy_and_are_logged(caplog):
    nan_row = torch.tensor([0.0, math.nan, 2.0, 1.0])
    inf_row = torch.tensor([0.0, math.inf, -math.inf, 1.0])
    rows = [Row(SamplingParams(temperature=1.0), request_id=41),
            Row(SamplingParams(temperature=0.7, top_p=0.9), request_id=42),
            Row(SamplingParams(), request_id=43)]
    with caplog.at_level(logging.WARNING, logger="pdserve.engine.sampling"):
        tokens = sample_batch(torch.stack([nan_row, inf_row, nan_row]), rows)
    assert tokens == [2, 1, 2]
    assert all(f"request {rid}" in caplog.text for rid in (41, 42, 43))
    all_nan = torch.full((1, 4), math.nan)
    assert sample_batch(all_nan, [Row(SamplingParams(temperature=1.0))])[0] in range(4)
    everything_masked = Row(SamplingParams(temperature=1.0, min_tokens=1), token_ids=[0])
    assert sample_batch(torch.tensor([[-math.inf, -math.inf, 5.0]]), [everything_masked],
                        eos_token_ids=(2,)) in ([0], [1])  # no mass left: greedy, no raise


def test_seeded_draws_are_a_pure_function_of_seed_index_and_logits():
    params = SamplingParams(temperature=1.0, seed=7)
    logits = torch.randn(1, 256, generator=torch.Generator().manual_seed(1))
    at = [Row(params, token_ids=[0] * (1 + i)) for i in range(30)]  # output index i
    alone = [sample_batch(logits, [row])[0] for row in at]
    batched = sample_batch(logits.expand(30, -1), at)
    assert alone == batched == [sample_batch(logits, [row])[0] for row in at]
    assert len(set(alone)) > 10  # the index changes the draw
    other_seed = [sample_batch(logits, [Row(SamplingParams(temperature=1.0, seed=8),
                                            token_ids=row.token_ids)])[0] for row in at]
    assert other_seed != alone
    # mixed with other rows (greedy, penalties, filters), a row draws the same token
    mixed = [Row(SamplingParams()), at[5], Row(SamplingParams(temperature=0.5, top_k=3,
                                                             presence_penalty=1.0))]
    assert sample_batch(logits.expand(3, -1), mixed)[1] == alone[5]
    assert 0 <= draw_uniform(2 ** 64 - 1, 10 ** 9) < 1
    assert draw_uniform(-1, 3) == draw_uniform(2 ** 64 - 1, 3)


def test_token_logprobs_are_log_softmax_with_sorted_alternatives():
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)) * 4
    tokens = [5, int(torch.argmax(logits[1])), 63]
    result = token_logprobs(logits, tokens, [0, 3, 64])
    reference = torch.log_softmax(logits, dim=-1)
    for i, logprob in enumerate(result):
        assert logprob.token_id == tokens[i]
        assert logprob.logprob == pytest.approx(float(reference[i, tokens[i]]), abs=1e-6)
        assert logprob.logprob <= 0
        values = [value for _, value in logprob.top]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
    assert result[0].top == () and len(result[1].top) == 3
    assert result[1].top[0] == (tokens[1], pytest.approx(result[1].logprob))
    assert sum(math.exp(value) for _, value in result[2].top) == pytest.approx(1.0, abs=1e-5)
    broken = token_logprobs(torch.tensor([[0.0, -math.inf, math.nan]]), [1], [3])[0]
    assert broken.logprob == LOGPROB_FLOOR
    assert all(math.isfinite(value) for _, value in broken.top)


def test_stop_strings_count_only_from_min_tokens_on():
    tokenizer = TextTokenizer.shipped()
    ids = tokenizer.encode(" stop here stop there")
    plain, late = TextStream(tokenizer, ("stop",)), TextStream(tokenizer, ("stop",), 3)
    for token in ids:
        plain.push(token)
        late.push(token)
    assert plain.stopped and plain.text == " "
    assert late.stopped and late.text == " stop here "
    assert len(tokenizer.encode(" stop here")) >= 2  # the first stop came before token 3
