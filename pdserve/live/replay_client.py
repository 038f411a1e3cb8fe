"""Replay a workload against an OpenAI-compatible server with real HTTP streaming.

Each request is sent at its (rate-scaled) arrival time as a streaming `/v1/completions` call
whose prompt is a list of token ids of the trace's input length (so lengths are exact on any
server that accepts token prompts) and whose `max_tokens` is the trace's output length, with
`ignore_eos` (vLLM's extension, which pdserve also takes) so outputs have that length.
Times are taken on the client: TTFT at the first streamed text, the end at the last chunk,
and the output length from the final usage chunk. The result is a list of `Request`
records, scored by `pdserve.metrics.summary` exactly like a simulated run. A caller with
real prompts passes `body_of` (request, model -> the JSON body) instead: its requests may
stop at EOS, and their output length is what the server generated.

Bounded: at most `max_in_flight` requests at once (later ones wait, their TTFT includes
it) and `timeout_s` for the whole replay; whatever has not finished by then is recorded as
unfinished with the reason.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx

from pdserve.types import Request
from pdserve.workload.workload import Workload

PROMPT_TOKEN_RANGE = (3, 1000)  # ids every shipped or common tokenizer has


def prompt_ids(request: Request) -> list[int]:
    low, high = PROMPT_TOKEN_RANGE
    return [low + (request.request_id * 7919 + i * 104729) % (high - low)
            for i in range(request.input_tokens)]


# request id -> (the response's id, sent, first text received), `time.monotonic()` times
ClientTimeline = dict[int, tuple[str, float, float]]
# (request, model) -> the streaming `/v1/completions` body to send for it
RequestBody = Callable[[Request, str], dict[str, Any]]


def trace_body(request: Request, model: str) -> dict[str, Any]:
    """A trace's request: token ids of its input length, exactly its output length."""
    return {"model": model, "prompt": prompt_ids(request), "max_tokens": request.output_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


async def _one(client: httpx.AsyncClient, body: dict[str, Any], request: Request,
               origin: float, gate: asyncio.Semaphore,
               timeline: ClientTimeline | None = None) -> None:
    async with gate:
        sent_s = time.monotonic()
        try:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    request.rejected_reason = f"HTTP {response.status_code}: {text[:200]}"
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        request.rejected_reason = chunk["error"]["message"]
                        return
                    now = time.monotonic() - origin
                    if chunk.get("usage"):
                        request.generated_tokens = chunk["usage"]["completion_tokens"]
                    choice = chunk["choices"][0] if chunk.get("choices") else {}
                    if choice.get("text") and math.isnan(request.first_token_s):
                        request.first_token_s = now
                        if timeline is not None:
                            timeline[request.request_id] = (chunk.get("id", ""), sent_s,
                                                            now + origin)
                    if choice.get("finish_reason"):
                        request.finish_s = now
        except httpx.HTTPError as err:
            request.rejected_reason = f"{type(err).__name__}: {err}"
    if math.isnan(request.first_token_s) and not math.isnan(request.finish_s):
        request.first_token_s = request.finish_s  # no text at all (e.g. EOS first)


async def replay(url: str, workload: Workload, model: str, timeout_s: float,
                 max_in_flight: int = 256, api_key: str | None = None,
                 on_progress: Callable[[int], None] | None = None,
                 timeline: ClientTimeline | None = None,
                 body_of: RequestBody = trace_body) -> list[Request]:
    requests = workload.requests()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    gate = asyncio.Semaphore(max_in_flight)
    # as many connections as requests in flight: httpx's default pool (100) would hold the
    # rest back in the client, and their wait would count as the server's TTFT
    limits = httpx.Limits(max_connections=max_in_flight,
                          max_keepalive_connections=max_in_flight)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits,
                                 timeout=httpx.Timeout(timeout_s)) as client:
        origin = time.monotonic()
        deadline = origin + timeout_s
        tasks: list[asyncio.Task[None]] = []
        for request in requests:
            wait = origin + request.arrival_s - time.monotonic()
            if time.monotonic() + max(wait, 0) > deadline:
                break
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(_one(client, body_of(request, model), request,
                                                  origin, gate, timeline)))
        pending = set(tasks)
        while pending and time.monotonic() < deadline:
            done, pending = await asyncio.wait(pending, timeout=min(
                1.0, max(0.0, deadline - time.monotonic())))
            if on_progress is not None:
                on_progress(len(tasks) - len(pending))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for request in requests:
        if not request.finished and not request.rejected_reason:
            request.rejected_reason = "not finished within the replay's time limit"
    return requests


def free_port() -> int:
    """A free TCP port on 127.0.0.1, for a server this process starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until_healthy(url: str, timeout_s: float, alive: Callable[[], bool]) -> None:
    """Poll `url`/health until it answers 200; raise if `alive()` turns false (the server
    process or thread died) or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not alive():
            raise RuntimeError(f"the server at {url} did not become healthy")
        time.sleep(0.2)
