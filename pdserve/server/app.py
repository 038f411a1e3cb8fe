"""The OpenAI-compatible HTTP API over a `LiveDriver`.

/v1/completions and /v1/chat/completions (server-sent events when `stream`), /v1/models and
/v1/models/{id}, /health (200/503 from the driver's status), /metrics (Prometheus text).
Bodies are read under a size limit and parsed, validated and tokenised in a worker thread
(`prepare.py`), so one huge or malformed request cannot stall other streams; every error is
an OpenAI-style JSON body (`errors.py`). The request schemas are documented in
`/openapi.json` while the routes parse them strictly themselves (400s, never 422).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel

from pdserve.engine.chat_template import ChatTemplate
from pdserve.live.driver import LiveDriver, LiveRequest, Overloaded
from pdserve.server.body import read_body
from pdserve.server.errors import APIError, install_error_handlers
from pdserve.server.logprobs import LogprobFormatter
from pdserve.server.prepare import Prepared, prepare_chat, prepare_completion
from pdserve.server.responses import Choice
from pdserve.server.responses import Response as Reply
from pdserve.server.schemas import ChatCompletionRequest, CompletionRequest, prompt_schema
from pdserve.server.sessions import session_key
from pdserve.server.validation import Limits

log = logging.getLogger("pdserve.server")
DEFAULT_MAX_BODY_BYTES = 8 << 20
DISCONNECT_POLL_S = 0.5  # how often a non-streaming request checks that its client is there


@dataclass(frozen=True)
class ServerSettings:
    model_name: str
    context_tokens: int
    vocab_size: int
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    chat_template: ChatTemplate = field(default_factory=ChatTemplate)
    url: str = ""  # where it listens, for the start-up log line


def _documented(model: type[BaseModel]) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    errors = {str(code): {"description": text, "content": {"application/json": {}}}
              for code, text in ((400, "invalid request"), (401, "bad API key"),
                                 (404, "unknown model"), (413, "body too large"),
                                 (429, "overloaded"), (503, "no worker can serve"))}
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": ref}}}, "responses": errors}


def create_app(driver: LiveDriver, settings: ServerSettings) -> FastAPI:
    limits = Limits(settings.context_tokens, settings.vocab_size)
    name = settings.model_name

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started = time.monotonic()
        log.info("starting %d workers", driver.workers.count)
        await driver.start()
        roles = ", ".join(f"{i}: {role.value} (pid {driver.workers.pid(i) or 'not started'})"
                          for i, role in enumerate(driver.scheduler.roles))
        log.info("workers up in %.1fs: %s", time.monotonic() - started, roles)
        log.info("serving %r (context %d tokens) on %s", name, settings.context_tokens,
                 settings.url or "the configured address")
        yield
        await driver.close()

    app = FastAPI(title="pdserve", lifespan=lifespan)
    app.state.driver = driver
    install_error_handlers(app)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title="pdserve", version="0.1.0", routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for name_ in ("HTTPValidationError", "ValidationError"):  # never answered: 400s
                components.pop(name_, None)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            for model in (CompletionRequest, ChatCompletionRequest):
                body = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(body.pop("$defs", {}))
                body["properties"]["model"]["enum"] = [name]  # the one model served
                if model is CompletionRequest:
                    body["properties"]["prompt"] = prompt_schema(settings.vocab_size)
                components[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    def check_key(request: Request) -> None:
        if settings.api_key and (request.headers.get("authorization")
                                 != f"Bearer {settings.api_key}"):
            raise APIError(401, "invalid or missing API key", kind="authentication_error")

    def admit(prepared: Prepared, chat: bool, session: str = "") -> list[Choice]:
        choices: list[Choice] = []
        try:
            for index, params in enumerate(prepared.params):
                prompt = prepared.prompt_of(index)
                live: LiveRequest = driver.submit(prepared.prompts[prompt], params, session)
                echo = prepared.echo_texts[prompt] if prepared.echo_texts else ""
                formatter = (LogprobFormatter(driver.tokenizer, chat, len(echo))
                             if prepared.logprobs else None)
                choices.append(Choice(index, live, formatter, echo))
        except Overloaded as err:
            for choice in choices:
                driver.cancel(choice.live.request.request_id)
            raise APIError(429, f"server overloaded: {err}", kind="rate_limit_error",
                           headers={"Retry-After": "1"}) from err
        return choices

    async def respond(request: Request, prepared: Prepared, chat: bool) -> Response:
        choices = admit(prepared, chat, session_key(request, len(prepared.params)))
        rid = choices[0].live.request.request_id
        reply = Reply(driver, prepared, choices, f"{'chatcmpl' if chat else 'cmpl'}-{rid}",
                      int(time.time()), name, chat)
        if prepared.stream:  # a client that goes away closes the stream, which cancels
            return StreamingResponse(reply.stream(), media_type="text/event-stream")
        whole = asyncio.ensure_future(reply.whole())
        while not (await asyncio.wait({whole}, timeout=DISCONNECT_POLL_S))[0]:
            if await request.is_disconnected():  # nobody waits for the answer: stop it
                whole.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await whole
                raise APIError(499, "the client closed the connection")
        return JSONResponse(whole.result())

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_key(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> dict[str, Any]:
        check_key(request)
        if model_id != name:
            raise APIError(404, f"model {model_id!r} does not exist; this server serves "
                           f"{name!r}", "model", "not_found_error")
        return model_card()

    def model_card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "pdserve",
                "max_model_len": settings.context_tokens,
                "chat_template": settings.chat_template.origin}  # "generic" when none

    @app.get("/health")
    async def health() -> JSONResponse:
        status = driver.health()
        return JSONResponse(status, status_code=200 if status["status"] == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(driver.metrics_text())

    @app.post("/v1/completions", openapi_extra=_documented(CompletionRequest))
    async def completions(request: Request) -> Response:
        check_key(request)
        body = await read_body(request, settings.max_body_bytes)
        prepared = await asyncio.to_thread(prepare_completion, body, name, driver.tokenizer,
                                           limits)
        return await respond(request, prepared, chat=False)

    @app.post("/v1/chat/completions", openapi_extra=_documented(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        check_key(request)
        body = await read_body(request, settings.max_body_bytes)
        prepared = await asyncio.to_thread(prepare_chat, body, name, driver.tokenizer, limits,
                                           settings.chat_template)
        return await respond(request, prepared, chat=True)

    return app
