"""The prompt set as a live workload (`predictor/prompt_workload.py`) and the replay client's
per-request bodies: what `bench/ares_live_mlp.py` sends."""

from __future__ import annotations

import numpy as np
import pytest

from pdserve.live.replay_client import prompt_ids, trace_body
from pdserve.predictor.mlp import split_requests
from pdserve.predictor.prompt_workload import PromptWorkload, unseen_prompts
from pdserve.predictor.prompts import prompt_set
from pdserve.predictor.record import RecordedSet


def encode(text: str) -> list[int]:
    return [len(word) for word in text.split()]


def test_a_seed_is_one_draw_and_another_seed_another():
    prompts = prompt_set()
    first = PromptWorkload.draw(prompts, encode, 400, 2.0, seed=3, max_tokens=64)
    again = PromptWorkload.draw(prompts, encode, 400, 2.0, seed=3, max_tokens=64)
    other = PromptWorkload.draw(prompts, encode, 400, 2.0, seed=4, max_tokens=64)
    assert first.requests == again.requests
    np.testing.assert_array_equal(first.workload.arrival_s, again.workload.arrival_s)
    assert [r.prompt for r in first.requests] != [r.prompt for r in other.requests]
    assert not np.array_equal(first.workload.arrival_s, other.workload.arrival_s)
    assert len({r.seed for r in first.requests + other.requests}) == 800  # every one its own
    assert first.workload.arrival_s[0] == 0.0
    assert 1.7 < first.workload.mean_rate_rps < 2.3  # Poisson at 2 req/s
    assert first.workload.input_tokens.tolist() == [len(r.token_ids) for r in first.requests]
    assert (first.workload.output_tokens == 64).all()
    kinds = [r.prompt.kind for r in first.requests]
    assert all(110 < kinds.count(k) < 160 for k in ("short", "medium", "long"))
    skewed = [p for p in prompts if p.kind != "short" or p.template == "yes-no"]  # 1/9 short
    mixed = PromptWorkload.draw(skewed, encode, 400, 2.0, seed=3, max_tokens=64)
    assert 110 < sum(r.prompt.kind == "short" for r in mixed.requests) < 160  # still a third
    assert {r.prompt.template for r in mixed.requests if r.prompt.kind == "short"} == {"yes-no"}


def test_the_body_sends_the_prompt_sampled_with_its_seed_and_stops_at_eos():
    draw = PromptWorkload.draw(prompt_set(10), encode, 5, 1.0, seed=0, max_tokens=32)
    request = draw.workload.requests()[2]
    body = draw.body(request, "m")
    drawn = draw.requests[2]
    assert body["prompt"] == list(drawn.token_ids) == encode(drawn.prompt.text)
    assert body["seed"] == drawn.seed and body["max_tokens"] == 32
    assert body["temperature"] == 0.7 and body["top_p"] == 0.95 and body["stream"]
    assert "ignore_eos" not in body  # the output length is the model's answer
    trace = trace_body(request, "m")  # the default: a trace's lengths, forced
    assert trace["ignore_eos"] and trace["prompt"] == prompt_ids(request)
    assert trace["max_tokens"] == request.output_tokens
    with pytest.raises(ValueError, match="positive"):
        PromptWorkload.draw(prompt_set(10), encode, 5, 0.0, seed=0, max_tokens=32)


def recording(prompts, samples_per_request: int = 2) -> RecordedSet:
    """Requests 0..n-1, one per prompt; request 0 stopped before its first capture."""
    rows = [rid for rid in range(1, len(prompts)) for _ in range(samples_per_request)]
    count = len(rows)
    return RecordedSet(np.zeros((count, 4), np.float32), np.array(rows), np.ones(count, int),
                       np.ones(count, int), np.ones(count, int),
                       {"ids": np.arange(len(prompts)),
                        "template": np.array([p.template for p in prompts]),
                        "topic": np.array([p.topic for p in prompts])})


def test_unseen_prompts_are_those_without_a_training_or_validation_generation():
    everything = prompt_set()
    recorded = everything[:60]
    data = recording(recorded)
    train, validation, test = split_requests(data.request_id, 0, data.prompt_groups())
    unseen = unseen_prompts(everything, data, split_seed=0)
    names = {(p.template, p.topic) for p in unseen}
    for rid in np.concatenate([train, validation]).tolist():
        assert (recorded[rid].template, recorded[rid].topic) not in names
    for rid in test.tolist():
        assert (recorded[rid].template, recorded[rid].topic) in names
    assert (recorded[0].template, recorded[0].topic) in names  # no sample: never learned
    assert len(unseen) == len(everything) - len(train) - len(validation)
    assert len(unseen_prompts(everything, data, split_seed=1)) == len(unseen)
    assert unseen_prompts(everything, data, split_seed=1) != unseen
