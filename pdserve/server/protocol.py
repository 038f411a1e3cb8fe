"""OpenAI-compatible request bodies, validation, and OpenAI-style errors.

Unknown fields are refused (as the OpenAI API does), so a typo is an error, not silently
ignored. Status codes: malformed JSON 400; a field of the wrong type or shape 422; a value
out of range (max_tokens <= 0, n != 1, a prompt longer than the context) 400; an unknown
model 404; a bad API key 401; overload 429 with Retry-After.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

CHAT_TEMPLATE_ROLES = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": None}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    n: int = 1
    user: str | None = None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class CompletionRequest(_Common):
    prompt: str | list[int]
    max_tokens: int = 16


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    @property
    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or 256


def parse(body: bytes, schema: type[BaseModel]) -> Any:
    try:
        raw = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(400, f"request body is not valid JSON: {err}") from err
    if not isinstance(raw, dict):
        raise APIError(400, "request body must be a JSON object")
    try:
        return schema.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        problem = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
        raise APIError(422, f"{param}: {problem}", param) from err


def chat_prompt(messages: list[ChatMessage]) -> str:
    """The chat template of pdserve's named models (role markers from the shipped
    tokenizer); Hugging Face checkpoints use the same generic layout."""
    parts = [f"{CHAT_TEMPLATE_ROLES[m.role]}\n{m.content}\n" for m in messages]
    return "".join(parts) + CHAT_TEMPLATE_ROLES["assistant"] + "\n"
