"""The `X-Session-Id` header: which conversation a request continues (AMPD sessions).

A client that sends its follow-up turn with the same `X-Session-Id` lets the server reuse the
conversation's KV on the worker that served the previous turn (`live/sessions.py`): the
new prompt should start with the previous prompt and the answer's tokens, as a chat history
or an agent's transcript does. Any printable ASCII string of at most 256 characters names a
session. A request asking for several choices (`n` > 1 or several prompts) ignores it: its
choices would compete for one history.
"""

from __future__ import annotations

from starlette.requests import Request

from pdserve.server.errors import APIError

HEADER = "x-session-id"
MAX_LENGTH = 256


def session_key(request: Request, choices: int) -> str:
    value = request.headers.get(HEADER, "")
    if not value or choices != 1:
        return ""
    if len(value) > MAX_LENGTH or not value.isascii() or not value.isprintable():
        raise APIError(400, f"header X-Session-Id must be printable ASCII of at most "
                       f"{MAX_LENGTH} characters, got {value[:40]!r}",
                       param="X-Session-Id")
    return value
