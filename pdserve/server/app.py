"""The OpenAI-compatible HTTP API over a `LiveDriver`.

/v1/completions and /v1/chat/completions (server-sent events when `stream`), /v1/models and
/v1/models/{id} (`created`: when the server started), vLLM's /tokenize and /detokenize
(`tokenization.py`), /version, /ping (GET and POST: 200 while a worker can serve, else
503), /health (200/503 from the driver's status), /metrics (Prometheus text, through
prometheus_client: `live/server_metrics.py`), /dashboard (the live cluster in a browser:
`dashboard.py`).
Bodies are read under a size limit and parsed, validated and tokenised in a worker thread
(`prepare.py`), so one huge or malformed request cannot stall other streams; every error is
an OpenAI-style JSON body (`errors.py`); unknown body fields are counted and logged within
bounds (`unknown_fields.py`). `/openapi.json` documents every route's request and responses
(`openapi.py`) while the routes parse bodies strictly themselves (400s, never 422).

The API key, when set, guards every route that takes a body or names the model: /v1/*,
/tokenize and /detokenize, and the dashboard (/dashboard and its state and scripts: it
shows requests' fates and the scheduler's reasons). A browser cannot send a bearer token
when it opens a page, so the dashboard also takes HTTP Basic credentials whose password is
the key (any user name): its 401 asks the browser for them. /health, /ping, /version and
/metrics stay open, as vLLM leaves them (its key middleware only guards paths under /v1):
load balancers and scrapers probe them without credentials, and they reveal nothing a
request could not. vLLM leaves /tokenize and /detokenize open too; pdserve guards them,
because they take a body and cost CPU.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)

from pdserve.config import serve_defaults
from pdserve.engine.chat_template import ChatTemplate
from pdserve.engine.structured_output import GrammarCompiler
from pdserve.live.driver import LiveDriver, LiveRequest, Overloaded
from pdserve.live.processes import StartupError
from pdserve.live.server_metrics import CONTENT_TYPE
from pdserve.metrics.report_page import ReportUnavailable
from pdserve.server import openapi
from pdserve.server.body import read_body
from pdserve.server.dashboard import (
    DEFAULT_WINDOW_S,
    MAX_WINDOW_S,
    DashboardView,
    page_js,
    plotly_script,
)
from pdserve.server.errors import APIError, check_model, install_error_handlers, shown
from pdserve.server.logprobs import LogprobFormatter
from pdserve.server.openapi import request_body, responses
from pdserve.server.prepare import Prepared, prepare_chat, prepare_completion
from pdserve.server.responses import Choice
from pdserve.server.responses import Response as Reply
from pdserve.server.schemas import ChatCompletionRequest, CompletionRequest
from pdserve.server.sessions import session_key
from pdserve.server.startup import interruptible, quiet_traceback
from pdserve.server.tokenization import DetokenizeRequest, detokenize, tokenize
from pdserve.server.unknown_fields import UnknownFields
from pdserve.server.validation import Limits
from pdserve.types import SLO

log = logging.getLogger("pdserve.server")
DISCONNECT_POLL_S = 0.5  # how often a non-streaming request checks that its client is there


def package_version() -> str:
    try:
        return metadata.version("pdserve")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


@dataclass(frozen=True)
class ServerSettings:
    model_name: str
    context_tokens: int
    vocab_size: int
    max_body_bytes: int  # server.max_body_bytes
    api_key: str | None = None
    chat_template: ChatTemplate = field(default_factory=ChatTemplate)
    url: str = ""  # where it listens, for the start-up log line
    slo: SLO = field(default_factory=lambda: serve_defaults().slo.targets())  # dashboard's


def create_app(driver: LiveDriver, settings: ServerSettings,
               unknown_fields: UnknownFields | None = None,
               background: Sequence[Callable[[], Awaitable[None]]] = ()) -> FastAPI:
    """The app over `driver`; `unknown_fields` counts and logs ignored body fields (a new
    bounded one by default); `background`: jobs run while the server serves (the start-up
    profile), started once the workers are up and cancelled when the server stops."""
    limits = Limits(settings.context_tokens, settings.vocab_size)
    name = settings.model_name
    created_s = int(time.time())  # the models' `created`: when this server started
    version = package_version()
    unknown = unknown_fields if unknown_fields is not None else UnknownFields()
    tokenizer, template = driver.tokenizer, settings.chat_template
    # structured-output constraints are compiled at the door too (a bad one is a 400)
    grammars = GrammarCompiler(tokenizer, tokenizer.eos_token_ids, settings.vocab_size)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        started = time.monotonic()
        log.info("starting %d workers", driver.workers.count)
        try:
            await interruptible(driver.start())
        except StartupError as err:
            log.error("start-up failed: %s", err)
            quiet_traceback(err)
            raise
        roles = ", ".join(f"{i}: {role.value} (pid {driver.workers.pid(i) or 'not started'})"
                          for i, role in enumerate(driver.scheduler.roles))
        log.info("workers up in %.1fs: %s", time.monotonic() - started, roles)
        log.info("serving %r (context %d tokens) on %s", name, settings.context_tokens,
                 settings.url or "the configured address")
        jobs = [asyncio.create_task(job()) for job in background]
        yield
        for job in jobs:
            job.cancel()
        await asyncio.gather(*jobs, return_exceptions=True)
        await driver.close()

    # no trailing-slash redirect: Starlette's 307 builds its Location from the client's Host
    # header, before the API key is checked; "/v1/models/" is a plain 404 instead
    app = FastAPI(title="pdserve", version=version, lifespan=lifespan, redirect_slashes=False)
    app.state.driver = driver
    app.state.unknown_fields = unknown
    driver.metrics.count_ignored_fields(lambda: unknown.counts().total)
    install_error_handlers(app)

    def contract() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi.document(app, name, settings.vocab_size, version)
        return app.openapi_schema

    app.openapi = contract  # type: ignore[method-assign]

    def check_key(request: Request, browser: bool = False) -> None:
        """The API key as a bearer token; `browser`: or as the password of HTTP Basic
        credentials, which a 401 asks the browser for."""
        key = settings.api_key
        if not key:
            return
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            return
        if browser and given[:6].lower() == "basic ":
            try:
                password = base64.b64decode(given[6:], validate=True).partition(b":")[2]
            except (binascii.Error, ValueError):
                password = b""
            if hmac.compare_digest(password, key.encode()):
                return
        raise APIError(401, "invalid or missing API key", kind="authentication_error",
                       headers={"WWW-Authenticate": 'Basic realm="pdserve dashboard"'}
                       if browser else None)

    def admit(prepared: Prepared, chat: bool, session: str = "") -> list[Choice]:
        choices: list[Choice] = []
        try:
            for index, params in enumerate(prepared.params):
                prompt = prepared.prompt_of(index)
                live: LiveRequest = driver.submit(prepared.prompts[prompt], params, session)
                echo = prepared.echo_texts[prompt] if prepared.echo_texts else ""
                # the token that ends a chat answer is not part of the message (unless the
                # request keeps its text: include_stop_str_in_output)
                end_tokens = tuple(params.stop_tokens(tokenizer.eos_token_ids)) if (
                    chat and not params.include_stop_str_in_output) else ()
                formatter = (LogprobFormatter(tokenizer, chat, len(echo), end_tokens)
                             if prepared.logprobs else None)
                choices.append(Choice(index, live, formatter, echo))
        except Overloaded as err:
            for choice in choices:
                driver.cancel(choice.live.request.request_id)
            raise APIError(429, f"server overloaded: {err}", kind="rate_limit_error",
                           headers={"Retry-After": "1"}) from err
        return choices

    async def respond(request: Request, prepared: Prepared, chat: bool,
                      received_s: float) -> Response:
        choices = admit(prepared, chat, session_key(request, len(prepared.params)))
        rid = choices[0].live.request.request_id
        reply = Reply(driver, prepared, choices, f"{'chatcmpl' if chat else 'cmpl'}-{rid}",
                      int(time.time()), name, chat, driver.timeline, received_s)
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

    def model_card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created_s, "owned_by": "pdserve",
                "max_model_len": settings.context_tokens,
                "chat_template": template.origin}  # "generic" when none

    @app.get("/v1/models", response_model=None,
             responses=responses(401, ok=openapi.ModelList, ok_description="the served model"))
    async def models(request: Request) -> JSONResponse:
        check_key(request)
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}", response_model=None,
             responses=responses(401, 404, ok=openapi.ModelCard))
    async def model(model_id: str, request: Request) -> JSONResponse:
        check_key(request)
        check_model(model_id, name)
        return JSONResponse(model_card())

    @app.get("/health", response_model=None, responses={
        200: {"description": "a worker can serve", "model": openapi.Health},
        503: {"description": "no worker can serve", "model": openapi.Health}})
    async def health() -> JSONResponse:
        status = driver.health()
        return JSONResponse(status, status_code=200 if status["status"] == "ok" else 503)

    async def ping() -> Response:
        """vLLM's /ping (SageMaker's probe): its /health, an empty 200 while serving."""
        if driver.health()["status"] != "ok":
            raise APIError(503, "no worker can serve", kind="server_error")
        return Response(status_code=200)

    ping_doc = responses(503, ok_description="a worker can serve (no body)")
    for method in (app.get, app.post):
        method("/ping", response_class=Response, responses=ping_doc)(ping)

    @app.get("/version", response_model=None, responses=responses(ok=openapi.VersionResponse))
    async def version_route() -> JSONResponse:
        return JSONResponse({"version": version})

    # the probes answer HEAD as GET (load balancers probe with it; no body is sent)
    for path, probe in (("/health", health), ("/ping", ping), ("/version", version_route)):
        app.head(path, include_in_schema=False, response_model=None)(probe)

    @app.get("/metrics", response_class=PlainTextResponse, responses=responses(
        media_type="text/plain", ok_description="Prometheus text exposition format"))
    async def metrics() -> Response:
        return Response(driver.metrics.text(), media_type=CONTENT_TYPE)

    dashboard = DashboardView(driver, name, settings.slo)

    def dashboard_script(read: Callable[[], str]) -> Response:
        try:
            return Response(read(), media_type="text/javascript",
                            headers={"Cache-Control": "max-age=3600"})
        except ReportUnavailable as err:
            raise APIError(503, f"{err}; the dashboard needs it", kind="server_error") from err

    @app.get("/dashboard", response_class=HTMLResponse, responses=responses(
        401, media_type="text/html", ok_description="the live dashboard (HTML)"))
    async def dashboard_page(request: Request) -> HTMLResponse:
        check_key(request, browser=True)
        page = await asyncio.to_thread(dashboard.page, dashboard.snapshot())
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @app.get("/dashboard/state", response_model=None, responses=responses(
        400, 401, ok_description="what the dashboard shows now (metrics/views.py)"))
    async def dashboard_state(request: Request, window_s: str = "") -> Response:
        check_key(request, browser=True)
        try:
            window = float(window_s) if window_s else DEFAULT_WINDOW_S
        except ValueError:
            window = -1.0
        if not 0 < window <= MAX_WINDOW_S:
            raise APIError(400, f"window_s must be a number of seconds in (0, "
                           f"{MAX_WINDOW_S:g}], got {shown(window_s)}", "window_s")
        body = await asyncio.to_thread(dashboard.state_json, dashboard.snapshot(), window)
        return Response(body, media_type="application/json",
                        headers={"Cache-Control": "no-store"})

    @app.get("/dashboard/plotly.min.js", response_class=Response, responses=responses(
        401, 503, media_type="text/javascript", ok_description="plotly.js"))
    async def dashboard_plotly(request: Request) -> Response:
        check_key(request, browser=True)
        return dashboard_script(plotly_script)

    @app.get("/dashboard/page.js", response_class=Response, responses=responses(
        401, media_type="text/javascript", ok_description="the page script"))
    async def dashboard_page_js(request: Request) -> Response:
        check_key(request, browser=True)
        return dashboard_script(page_js)

    @app.post("/v1/completions", response_model=None,
              responses=responses(400, 401, 404, 408, 413, 415, 429, 500, 503,
                                  ok=openapi.CompletionResponse,
                                  stream=openapi.CompletionChunk),
              openapi_extra=request_body(CompletionRequest))
    async def completions(request: Request) -> Response:
        received_s = time.monotonic()  # the control plane's latency starts here
        check_key(request)
        body = await read_body(request, settings.max_body_bytes)
        prepared = await asyncio.to_thread(prepare_completion, body, name, tokenizer, limits,
                                           unknown, grammars)
        return await respond(request, prepared, chat=False, received_s=received_s)

    @app.post("/v1/chat/completions", response_model=None,
              responses=responses(400, 401, 404, 408, 413, 415, 429, 500, 503,
                                  ok=openapi.ChatCompletionResponse,
                                  stream=openapi.ChatCompletionChunk),
              openapi_extra=request_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        received_s = time.monotonic()
        check_key(request)
        body = await read_body(request, settings.max_body_bytes)
        prepared = await asyncio.to_thread(prepare_chat, body, name, tokenizer, limits,
                                           template, unknown, grammars)
        return await respond(request, prepared, chat=True, received_s=received_s)

    @app.post("/tokenize", response_model=None,
              responses=responses(400, 401, 404, 408, 413, 415, ok=openapi.TokenizeResponse),
              openapi_extra=request_body(openapi.TOKENIZE_REQUEST))
    async def tokenize_route(request: Request) -> Response:
        check_key(request)
        body = await read_body(request, settings.max_body_bytes)
        answer = await asyncio.to_thread(tokenize, body, name, tokenizer, limits, template,
                                         unknown)
        return Response(answer, media_type="application/json")

    @app.post("/detokenize", response_model=None,
              responses=responses(400, 401, 404, 408, 413, 415, ok=openapi.DetokenizeResponse),
              openapi_extra=request_body(DetokenizeRequest))
    async def detokenize_route(request: Request) -> Response:
        check_key(request)
        body = await read_body(request, settings.max_body_bytes)
        answer = await asyncio.to_thread(detokenize, body, name, tokenizer, limits, unknown)
        return Response(answer, media_type="application/json")

    return app
