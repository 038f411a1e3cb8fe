"""Turn the driver's per-request events into OpenAI responses: one JSON body, or SSE chunks.

A response has one choice per admitted `LiveRequest` (prompts x n); their event queues are
read together, so choices stream interleaved as their tokens come. Logprob events come
before the text event of their token (text may be held back by stop-string detection); the
logprobs seen so far ride on the next chunk that carries text or the finish reason.
Usage counts each prompt once and every choice's completion tokens. A client that goes away
(or a choice that fails) cancels every unfinished choice.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pdserve.live.driver import LiveDriver, LiveRequest
from pdserve.live.timeline import RequestTimeline
from pdserve.server.errors import APIError, error_body
from pdserve.server.logprobs import LogprobFormatter, merge
from pdserve.server.prepare import Prepared


def failure_of(live: LiveRequest) -> tuple[int, str]:
    """The HTTP status and OpenAI error type of a failed request: the driver's verdict
    (400 when the request's own content failed it) where it gives one, else 503."""
    status = live.error_status or 503
    kind = live.error_type or ("invalid_request_error" if status < 500 else "server_error")
    return status, kind


@dataclass
class Choice:
    index: int
    live: LiveRequest
    logprobs: LogprobFormatter | None
    echo: str = ""
    texts: list[str] = field(default_factory=list)
    logprob_parts: list[dict[str, Any]] = field(default_factory=list)
    reason: str | None = None
    text_sent: bool = False  # a stream wrote its first text


@dataclass
class Response:
    driver: LiveDriver
    prepared: Prepared
    choices: list[Choice]
    ident: str
    created: int
    model: str
    chat: bool
    # a step-log run's timeline (`live/timeline.py`), and when the server received the
    # request (`time.monotonic()`): the first text's send is logged there
    timeline: RequestTimeline | None = None
    received_s: float = 0.0

    def usage(self) -> dict[str, int]:
        prompt = sum(len(ids) for ids in self.prepared.prompts)
        completion = sum(c.live.tokens_sent for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    def cancel_unfinished(self) -> None:
        for choice in self.choices:
            if choice.reason is None:
                self.driver.cancel(choice.live.request.request_id)

    async def events(self) -> AsyncIterator[tuple[Choice, str, Any]]:
        """(choice, kind, value) from every choice until each is done or one fails."""
        waiting = {asyncio.ensure_future(c.live.events.get()): c for c in self.choices}
        try:
            while waiting:
                done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for future in sorted(done, key=lambda f: waiting[f].index):
                    choice = waiting.pop(future)
                    kind, value = future.result()
                    if kind == "done":
                        choice.reason = value
                    elif kind != "error":
                        waiting[asyncio.ensure_future(choice.live.events.get())] = choice
                    yield choice, kind, value
        finally:
            for future in waiting:
                future.cancel()

    # ---- one JSON body ----
    async def whole(self) -> dict[str, Any]:
        events = self.events()
        try:
            async for choice, kind, value in events:
                if kind == "logprob" and choice.logprobs is not None:
                    choice.logprobs.add(value)
                elif kind == "text":
                    choice.texts.append(value)
                    self._take_logprobs(choice)
                elif kind == "done":
                    if choice.logprobs is not None:
                        choice.logprobs.finish(value)
                    self._take_logprobs(choice)
                elif kind == "error":
                    status, kind_name = failure_of(choice.live)
                    raise APIError(status, f"request failed: {value}", kind=kind_name)
        finally:
            await events.aclose()  # drops the pending queue reads at once
            self.cancel_unfinished()
        return {"id": self.ident, "object": "chat.completion" if self.chat
                else "text_completion", "created": self.created, "model": self.model,
                "choices": [self._final_choice(c) for c in self.choices],
                "usage": self.usage()}

    def _take_logprobs(self, choice: Choice) -> None:
        if choice.logprobs is not None and (part := choice.logprobs.take()) is not None:
            choice.logprob_parts.append(part)

    def _final_choice(self, choice: Choice) -> dict[str, Any]:
        text = choice.echo + "".join(choice.texts)
        logprobs = merge(choice.logprob_parts, self.chat) if choice.logprobs else None
        if self.chat:
            return {"index": choice.index, "message": {"role": "assistant", "content": text},
                    "logprobs": logprobs, "finish_reason": choice.reason}
        return {"index": choice.index, "text": text, "logprobs": logprobs,
                "finish_reason": choice.reason}

    # ---- server-sent events ----
    def _chunk(self, choices: list[dict[str, Any]], usage: bool) -> str:
        body: dict[str, Any] = {
            "id": self.ident, "object": "chat.completion.chunk" if self.chat
            else "text_completion", "created": self.created, "model": self.model,
            "choices": choices}
        if usage:
            body["usage"] = self.usage()
        return f"data: {json.dumps(body)}\n\n"

    def _delta(self, choice: Choice, text: str | None, reason: str | None,
               role: bool = False) -> dict[str, Any]:
        logprobs = choice.logprobs.take() if choice.logprobs is not None else None
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                {} if text is None else {"content": text})
            return {"index": choice.index, "delta": delta, "logprobs": logprobs,
                    "finish_reason": reason}
        return {"index": choice.index, "text": text or "", "logprobs": logprobs,
                "finish_reason": reason}

    def _first_text_sent(self, choice: Choice) -> None:
        """Log when a step-log run's request first sent text (its control plane's latency,
        `live/timeline.py`); called after the chunk was written (the generator resumes when
        the server asks for the next one): where the client's TTFT ends."""
        if self.timeline is not None and not choice.text_sent:
            choice.text_sent = True
            self.timeline.first_sent(choice.live.client_id, self.received_s, time.monotonic())

    async def stream(self) -> AsyncIterator[str]:
        continuous = self.prepared.continuous_usage
        events = self.events()
        try:
            for choice in self.choices:
                if self.chat:
                    yield self._chunk([self._delta(choice, None, None, role=True)], continuous)
                elif choice.echo:
                    yield self._chunk([self._delta(choice, choice.echo, None)], continuous)
            async for choice, kind, value in events:
                if kind == "logprob" and choice.logprobs is not None:
                    choice.logprobs.add(value)
                elif kind == "text":
                    yield self._chunk([self._delta(choice, value, None)], continuous)
                    self._first_text_sent(choice)
                elif kind == "done":
                    if choice.logprobs is not None:
                        choice.logprobs.finish(value)
                    yield self._chunk([self._delta(choice, None, value)], continuous)
                elif kind == "error":
                    failure = error_body(f"request failed: {value}", failure_of(choice.live)[1])
                    yield f"data: {json.dumps(failure)}\n\n"
                    break
            else:
                if self.prepared.include_usage:
                    yield self._chunk([], True)
            yield "data: [DONE]\n\n"
        finally:
            await events.aclose()
            self.cancel_unfinished()
