"""Logprobs across worker processes: the worker reports each token's `TokenLogprob` and the
driver puts it on the request's events before that token's text."""

from __future__ import annotations

import asyncio

import torch
from server_helpers import running_server
from test_server import PROMPT

from pdserve.engine.engine import Engine
from pdserve.engine.loader import load_model
from pdserve.engine.sampling import SamplingParams

PARAMS = SamplingParams(max_tokens=10, temperature=0.8, seed=4, logprobs=3, ignore_eos=True)


def single_instance(prompt_ids: list[int]) -> list:
    torch.set_num_threads(1)
    model, tokenizer = load_model("tiny", seed=0)
    engine = Engine(model, tokenizer, 64)
    engine.add(1, prompt_ids, PARAMS)
    outputs = engine.run([], [(1, len(prompt_ids))])
    while not engine.sequences[1].finish_reason:
        outputs += engine.run([1], [])
    return [output.logprob for output in outputs]


def test_driver_emits_each_tokens_logprob_before_its_text(tmp_path):
    with running_server(tmp_path, {"cluster.instances": 2, "policy.name": "static-pd",
                                   "cluster.prefill": 1, "cluster.decode": 1}) as (_, driver):
        prompt_ids = driver.tokenizer.encode(PROMPT)

        async def collect() -> list[tuple[str, object]]:
            live = driver.submit(prompt_ids, PARAMS)
            events = []
            while not events or events[-1][0] not in ("done", "error"):
                events.append(await live.events.get())
            return events

        events = asyncio.run_coroutine_threadsafe(collect(), driver._loop).result(60)
    assert events[-1] == ("done", "length")
    logprobs = [value for kind, value in events if kind == "logprob"]
    expected = single_instance(prompt_ids)  # through a P->D hand-off: the same draws
    assert [lp.token_id for lp in logprobs] == [lp.token_id for lp in expected]
    for got, want in zip(logprobs, expected, strict=True):
        assert abs(got.logprob - want.logprob) < 1e-4 and len(got.top) == 3
    text_seen, tokens_seen = "", []
    for kind, value in events[:-1]:  # each text delta is covered by the tokens before it
        if kind == "logprob":
            tokens_seen.append(value.token_id)
        else:
            assert kind == "text"
            text_seen += value
            assert driver.tokenizer.decode(tokens_seen).startswith(text_seen)
    assert text_seen == driver.tokenizer.decode(tokens_seen)
