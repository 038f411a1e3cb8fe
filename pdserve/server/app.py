"""The OpenAI-compatible HTTP API over a `LiveDriver`.

/v1/completions and /v1/chat/completions (server-sent events when `stream`, `usage`
filled), /v1/models, /health, /metrics (Prometheus text). A streaming client that goes away
cancels its request, which frees its KV on every worker.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from pdserve.engine.sampling import SamplingParams
from pdserve.live.driver import LiveDriver, LiveRequest, Overloaded
from pdserve.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    chat_prompt,
    parse,
)


def create_app(driver: LiveDriver, model_name: str, context_tokens: int,
               api_key: str | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await driver.start()
        yield
        await driver.close()

    app = FastAPI(title="pdserve", lifespan=lifespan)
    app.state.driver = driver

    def check_key(request: Request) -> None:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            raise APIError(401, "invalid or missing API key", kind="authentication_error")

    def admit(body: CompletionRequest | ChatCompletionRequest, prompt_ids: list[int],
              max_tokens: int) -> LiveRequest:
        if body.model != model_name:
            raise APIError(404, f"model {body.model!r} does not exist; this server serves "
                           f"{model_name!r}", "model", "not_found_error")
        if body.n != 1:
            raise APIError(400, "only n=1 is supported", "n")
        if max_tokens < 1:
            raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
        if not prompt_ids:
            raise APIError(400, "the prompt is empty", "prompt")
        if len(prompt_ids) + max_tokens > context_tokens:
            raise APIError(400, f"prompt ({len(prompt_ids)} tokens) plus max_tokens "
                           f"({max_tokens}) exceeds the context length {context_tokens}",
                           "max_tokens")
        params = SamplingParams(max_tokens=max_tokens, temperature=body.temperature,
                                top_p=body.top_p, seed=body.seed, stop=body.stop_strings)
        try:
            return driver.submit(prompt_ids, params)
        except Overloaded as err:
            raise APIError(429, f"server overloaded: {err}", kind="rate_limit_error",
                           headers={"Retry-After": "1"}) from err

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_key(request)
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": 0, "owned_by": "pdserve"}]}

    @app.get("/health")
    async def health() -> JSONResponse:
        status = driver.health()
        return JSONResponse(status, status_code=200 if status["status"] == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(driver.metrics_text())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        check_key(request)
        body = parse(await request.body(), CompletionRequest)
        tokens = (list(body.prompt) if isinstance(body.prompt, list)
                  else driver.tokenizer.encode(body.prompt))
        live = admit(body, tokens, body.max_tokens)
        return await respond(live, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        check_key(request)
        body = parse(await request.body(), ChatCompletionRequest)
        tokens = driver.tokenizer.encode(chat_prompt(body.messages))
        live = admit(body, tokens, body.token_limit)
        return await respond(live, body, chat=True)

    async def respond(live: LiveRequest, body: CompletionRequest | ChatCompletionRequest,
                      chat: bool) -> Response:
        rid = live.request.request_id
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{rid}"
        created = int(time.time())
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(sse(live, ident, created, chat, include_usage),
                                     media_type="text/event-stream")
        text, reason = [], ""
        while True:
            kind, value = await live.events.get()
            if kind == "text":
                text.append(value)
            elif kind == "done":
                reason = value
                break
            else:
                raise APIError(live.error_status or 503, f"request failed: {value}",
                               kind=live.error_type or "server_error")
        content = "".join(text)
        choice: dict[str, Any] = {"index": 0, "finish_reason": reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": content}
        else:
            choice.update(text=content, logprobs=None)
        return JSONResponse({"id": ident, "object": "chat.completion" if chat
                             else "text_completion", "created": created, "model": model_name,
                             "choices": [choice], "usage": usage(live)})

    def usage(live: LiveRequest) -> dict[str, int]:
        prompt, completion = live.request.input_tokens, live.tokens_sent
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    async def sse(live: LiveRequest, ident: str, created: int, chat: bool,
                  include_usage: bool) -> AsyncIterator[str]:
        kind_name = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: str | None, reason: str | None, role: bool = False) -> str:
            if chat:
                content: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                    {} if delta is None else {"content": delta})
                choice = {"index": 0, "delta": content, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": delta or "", "finish_reason": reason,
                          "logprobs": None}
            return "data: " + json.dumps({"id": ident, "object": kind_name, "created": created,
                                          "model": model_name, "choices": [choice]}) + "\n\n"

        finished = False
        try:
            if chat:
                yield chunk(None, None, role=True)
            while True:
                kind, value = await live.events.get()
                if kind == "text":
                    yield chunk(value, None)
                elif kind == "done":
                    finished = True
                    yield chunk(None, value)
                    if include_usage:
                        yield "data: " + json.dumps({
                            "id": ident, "object": kind_name, "created": created,
                            "model": model_name, "choices": [], "usage": usage(live)}) + "\n\n"
                    break
                else:
                    finished = True
                    yield "data: " + json.dumps({"error": {
                        "message": f"request failed: {value}",
                        "type": live.error_type or "server_error",
                        "param": None, "code": None}}) + "\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:
            if not finished:  # the client went away
                driver.cancel(live.request.request_id)

    return app
