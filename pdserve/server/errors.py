"""OpenAI-style error bodies for every failure the server can answer.

`{"error": {"message", "type", "param", "code"}}` with the status OpenAI and vLLM use: an
invalid request 400 (never 422), a bad API key 401, an unknown model or route 404, a wrong
method 405, a body over the limit 413, overload 429, a server fault 500 (or 503 when no
worker can serve). FastAPI's own 404/405/422 and unexpected exceptions get the same shape,
so a client never sees a plain-text body.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger("pdserve.server")

_TYPE_OF_STATUS = {401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "invalid_request_error",
                   429: "rate_limit_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, object]]:
        return error_body(self.message, self.kind, self.param)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, dict[str, object]]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def shown_path(path: str) -> str:
    """A client-chosen URL path as a log line may show it: cut, and escaped by `repr` (a
    percent-encoded newline arrives decoded and would start a forged line)."""
    return repr(path[:200])


def shown(text: str, limit: int = 80) -> str:
    """Client input as an error message quotes it: escaped by `repr` and cut to `limit`
    characters, saying how long it was (a 100 KB path or model name is not echoed back)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def check_model(name: str | None, served: str) -> None:
    """A request naming a model (None: it names none) must name the served one: else the
    404 OpenAI and vLLM answer."""
    if name is not None and name != served:
        raise APIError(404, f"model {shown(name)} does not exist; this server serves "
                       f"{served!r}", "model", "not_found_error")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, err: HTTPException) -> JSONResponse:
        if err.status_code == 404:
            message = f"no route {request.method} {shown(request.url.path)}"
        elif err.status_code == 405:
            message = f"method {request.method} is not allowed on {shown(request.url.path)}"
        else:
            message = str(err.detail)
        kind = _TYPE_OF_STATUS.get(err.status_code, "invalid_request_error"
                                   if err.status_code < 500 else "server_error")
        return JSONResponse(error_body(message, kind), status_code=err.status_code,
                            headers=getattr(err, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0] if err.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(part) for part in first["loc"][1:]) or None
        return JSONResponse(error_body(f"{param}: {first['msg']}", "invalid_request_error",
                                       param), status_code=400)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method,
                      shown_path(request.url.path))
        return JSONResponse(error_body(f"internal server error: {type(err).__name__}",
                                       "server_error"), status_code=500)
