"""A live request as the driver and the HTTP handler share it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pdserve.engine.sampling import SamplingParams
from pdserve.engine.text_stream import TextStream
from pdserve.types import Request


class Overloaded(Exception):
    """Too many requests in flight; retry later."""


@dataclass
class LiveRequest:
    """A client's request. `request` is its current attempt (a re-run after a worker death
    is a new `Request` with a new id); `client_id` is the id of the first attempt."""

    request: Request
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    stream: TextStream
    events: asyncio.Queue[tuple[str, object]] = field(default_factory=asyncio.Queue)
    client_id: int = 0
    token_ids: list[int] = field(default_factory=list)  # streamed to the client
    retries: int = 0
    finish_reason: str = ""
    error_status: int = 0  # HTTP status of a failure: 400 its content, 500/503 the server's
    error_type: str = ""  # OpenAI error type: invalid_request_error, server_error, ...
    last_token_s: float | None = None  # when its last token was streamed (the ITL metric's)

    @property
    def tokens_sent(self) -> int:
        return len(self.token_ids)


