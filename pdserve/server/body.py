"""Reading a request body safely: a size limit, JSON with a nesting limit, valid Unicode.

A body is read as sent: one declaring a Content-Encoding (gzip, ...) is a 415, so no
compression bomb is ever expanded. The size limit is checked on the declared Content-Length
before reading anything and again on the bytes actually received (a chunked or lying
client), so a huge body is refused with 413 as soon as it passes the limit; a client that
closes the connection before its body is all sent gets (nobody reads it) a 499, as one that
leaves while its answer is computed, and one that stops sending it (a Content-Length larger
than the body, chunks that never end) a 408 after `BODY_IDLE_TIMEOUT_S` without a byte,
instead of waiting for ever while the connection holds what came. `NaN`/`Infinity`
literals, nesting deeper than `MAX_JSON_DEPTH`, lone UTF-16 surrogates (`"\\ud800"`, which
no tokenizer can encode) and integers longer than Python converts
(`sys.get_int_max_str_digits()`, 4,300 digits) are 400s.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from pdserve.server.errors import APIError

YIELDING_PARSE_BYTES = 64 << 10  # larger bodies parse numbers through a Python hook
BODY_IDLE_TIMEOUT_S = 30.0  # a body that sends nothing for this long is a 408
MAX_JSON_DEPTH = 32  # OpenAI bodies nest 5 levels at most (messages -> content -> part)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


async def read_body(request: Request, max_body_bytes: int) -> bytes:
    encoding = request.headers.get("content-encoding", "identity")
    if encoding.strip().lower() != "identity":  # nothing is decompressed: no bomb gets in
        raise APIError(415, f"Content-Encoding {encoding[:40]!r} is not supported: send the "
                       "body uncompressed")
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise APIError(400, f"invalid Content-Length header {declared[:40]!r}")
        if int(declared) > max_body_bytes:
            raise APIError(413, f"request body of {int(declared)} bytes exceeds the limit of "
                           f"{max_body_bytes} bytes (--max-body-bytes)")
    parts, size = [], 0
    stream = request.stream()
    try:
        while True:
            try:
                async with asyncio.timeout(BODY_IDLE_TIMEOUT_S):
                    part = await anext(stream)
            except StopAsyncIteration:
                break
            except TimeoutError as err:
                raise APIError(408, "no part of the request body arrived for "
                               f"{BODY_IDLE_TIMEOUT_S:g} s (it declared more than it sent, "
                               "or its chunks never ended)") from err
            size += len(part)
            if size > max_body_bytes:
                raise APIError(413, f"request body exceeds the limit of {max_body_bytes} "
                               "bytes (--max-body-bytes)")
            parts.append(part)
    except ClientDisconnect as err:  # the client's doing, not the server's: no traceback
        raise APIError(499, "the client closed the connection before sending its body"
                       ) from err
    return b"".join(parts)


def _refuse_constant(name: str) -> float:
    raise APIError(400, f"request body is not valid JSON: {name} is not a JSON number")


def _parse_int(text: str) -> int:
    return int(text)


def parse_json_object(body: bytes) -> dict[str, Any]:
    """Parse (in a worker thread). A large body's numbers go through a Python-level hook so
    the parser gives up the GIL now and then: a 5 MB token list parsed in one native call
    would hold it for about 0.3 s and stall every stream."""
    hook = _parse_int if len(body) > YIELDING_PARSE_BYTES else None
    try:
        raw = json.loads(body, parse_constant=_refuse_constant, parse_int=hook)
    except RecursionError as err:
        raise APIError(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(400, f"request body is not valid JSON: {err}") from err
    except ValueError as err:  # int() refused a literal past its digit limit
        raise APIError(400, f"request body has {too_long_integer()}") from err
    if not isinstance(raw, dict):
        raise APIError(400, "request body must be a JSON object")
    check_structure(raw, surrogates_possible=bool(_SURROGATE_ESCAPE.search(body)))
    return raw


def too_long_integer() -> str:
    """What a JSON text holds when `json.loads` raises a plain `ValueError`."""
    return f"an integer of more than {sys.get_int_max_str_digits()} digits"


def check_structure(value: Any, surrogates_possible: bool = True,
                    what: str = "request body") -> None:
    """Depth at most MAX_JSON_DEPTH; every string (key or value) valid Unicode. `what` names
    the JSON in the messages (and prefixes the paths of its parts) when it is not the body."""
    stack: list[tuple[Any, int, str]] = [(value, 1, "" if what == "request body" else what)]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise APIError(400, f"{what} nests deeper than {MAX_JSON_DEPTH} levels",
                           path or None)
        if isinstance(item, dict):
            for key, child in item.items():
                if surrogates_possible:
                    _check_text(key, f"{path}.{key}" if path else "key")
                if isinstance(child, dict | list) or (surrogates_possible
                                                       and isinstance(child, str)):
                    stack.append((child, depth + 1, f"{path}.{key}" if path else str(key)))
        elif isinstance(item, list):
            for index, child in enumerate(item):
                if isinstance(child, dict | list) or (surrogates_possible
                                                       and isinstance(child, str)):
                    stack.append((child, depth + 1, f"{path}.{index}"))
        elif isinstance(item, str):
            _check_text(item, path)


def _check_text(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise APIError(400, f"{path}: invalid Unicode (a lone surrogate at character "
                       f"{err.start})", path or None) from err
