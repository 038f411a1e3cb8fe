"""Responses from driver events, without workers: logprobs ride on the chunk that carries
their token's text (text held back by stop-string detection included), choices interleave,
usage adds up, a failed choice cancels the others."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import pytest

from pdserve.engine.tokenizer import TextTokenizer
from pdserve.server.errors import APIError
from pdserve.server.logprobs import LogprobFormatter
from pdserve.server.prepare import Prepared
from pdserve.server.responses import Choice, Response

TOKENIZER = TextTokenizer.shipped()


@dataclass
class Entry:  # the engine's TokenLogprob
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass
class FakeRequest:
    request_id: int


@dataclass
class FakeLive:
    request: FakeRequest
    tokens_sent: int
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    error_status: int = 0  # the driver's verdict: 0 until a failure sets it
    error_type: str = ""


class FakeDriver:
    tokenizer = TOKENIZER

    def __init__(self) -> None:
        self.cancelled: list[int] = []

    def cancel(self, request_id: int) -> None:
        self.cancelled.append(request_id)


def reply(events: list[list[tuple[str, object]]], chat: bool, stream: bool) -> Response:
    driver = FakeDriver()
    choices = []
    for index, script in enumerate(events):
        live = FakeLive(FakeRequest(index + 1), sum(kind == "logprob" for kind, _ in script))
        for event in script:
            live.events.put_nowait(event)
        choices.append(Choice(index, live, LogprobFormatter(TOKENIZER, chat)))
    prepared = Prepared([[5, 6, 7]], [], len(events), stream, True, False, None, True)
    return Response(driver, prepared, choices, "id-1", 0, "tiny", chat)  # type: ignore[arg-type]


A, B, C = (TOKENIZER.encode(word)[0] for word in (" a", " b", " c"))
SCRIPT = [("logprob", Entry(A, -0.5, ((A, -0.5), (B, -1.5)))), ("text", " a"),
          ("logprob", Entry(B, -0.25, ((B, -0.25),))),  # text held back ...
          ("logprob", Entry(C, -1.0, ((C, -1.0),))), ("text", " b c"),  # ... released here
          ("done", "length")]


def collect(stream: Response) -> list[dict]:
    async def run() -> list[str]:
        return [chunk async for chunk in stream.stream()]

    lines = asyncio.run(run())
    assert lines[-1] == "data: [DONE]\n\n"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_streamed_completion_logprobs_follow_their_text():
    chunks = collect(reply([SCRIPT], chat=False, stream=True))
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts == [" a", " b c", ""]
    first, second, last = (c["choices"][0]["logprobs"] for c in chunks if c["choices"])
    assert first == {"tokens": [" a"], "token_logprobs": [-0.5],
                     "top_logprobs": [{" a": -0.5, " b": -1.5}], "text_offset": [0]}
    assert second["tokens"] == [" b", " c"] and second["text_offset"] == [2, 4]
    assert last is None
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_whole_chat_response_merges_logprobs_and_interleaves_choices():
    other = [("logprob", Entry(C, -2.0, ())), ("text", " c"), ("done", "stop")]
    body = asyncio.run(reply([SCRIPT, other], chat=True, stream=False).whole())
    first, second = body["choices"]
    assert first["message"]["content"] == " a b c" and first["finish_reason"] == "length"
    content = first["logprobs"]["content"]
    assert [e["token"] for e in content] == [" a", " b", " c"]
    assert content[0]["bytes"] == list(b" a")
    assert content[0]["top_logprobs"] == [{"token": " a", "logprob": -0.5, "bytes": [32, 97]},
                                          {"token": " b", "logprob": -1.5, "bytes": [32, 98]}]
    assert second["index"] == 1 and second["message"]["content"] == " c"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}


def test_a_failed_choice_fails_the_response_and_cancels_the_rest():
    failing = [("error", "worker exploded")]
    endless = [("text", "x")]  # never finishes
    response = reply([endless, failing], chat=False, stream=False)
    with pytest.raises(APIError) as err:
        asyncio.run(response.whole())
    assert err.value.status == 503 and "worker exploded" in err.value.message
    assert 1 in response.driver.cancelled  # the unfinished choice
    streamed = collect(reply([endless, failing], chat=True, stream=True))
    assert streamed[-1]["error"]["message"] == "request failed: worker exploded"


def test_partial_utf8_tokens_show_as_bytes():
    formatter = LogprobFormatter(TOKENIZER, chat=False)
    ids = TOKENIZER.encode("—")  # one character, three byte tokens
    for token in ids:
        formatter.add(Entry(token, -1.0, ()))
    tokens = formatter.take()["tokens"]
    assert all(t.startswith("bytes:\\x") for t in tokens)
    assert "".join(tokens) == "bytes:\\xe2" + "bytes:\\x80" + "bytes:\\x94"


EOS = TOKENIZER.eos_token_ids[0]


def chat_reply(script: list[tuple[str, object]], stream: bool) -> Response:
    response = reply([script], chat=True, stream=stream)
    response.choices[0].logprobs = LogprobFormatter(TOKENIZER, True, end_tokens=(EOS,))
    return response


@pytest.mark.parametrize("tail", ["", " b"])  # text held back may be released after the EOS
def test_chat_logprobs_leave_out_the_end_of_turn_that_stopped_the_answer(tail):
    script = [("logprob", Entry(A, -0.5, ())), ("text", " a"),
              ("logprob", Entry(B, -0.2, ())), ("logprob", Entry(EOS, -0.1, ())),
              *([("text", tail)] if tail else []), ("done", "stop")]
    body = asyncio.run(chat_reply(script, stream=False).whole())
    content = body["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in content] == [" a", " b"]
    chunks = collect(chat_reply(script, stream=True))
    streamed = [entry for c in chunks for choice in c["choices"] if choice["logprobs"]
                for entry in choice["logprobs"]["content"]]
    assert streamed == content


def test_an_end_of_turn_token_that_did_not_end_the_answer_is_listed():
    """With ignore_eos the turn goes on past an EOS, and one may be the last token allowed."""
    script = [("logprob", Entry(EOS, -3.0, ())), ("logprob", Entry(A, -0.5, ())),
              ("text", " a"), ("logprob", Entry(EOS, -2.0, ())), ("done", "length")]
    body = asyncio.run(chat_reply(script, stream=False).whole())
    assert [entry["logprob"] for entry in body["choices"][0]["logprobs"]["content"]] == [
        -3.0, -0.5, -2.0]
    only_eos = [("logprob", Entry(EOS, -0.1, ())), ("done", "stop")]
    body = asyncio.run(chat_reply(only_eos, stream=False).whole())
    assert body["choices"][0]["logprobs"] == {"content": []}
