"""The OpenAPI document (`/openapi.json`): the server's contract.

Every route declares what it answers (`responses`): each status it can send, with its media
type and schema. Success bodies are described by the models below; every error is an
OpenAI-style body (`ErrorResponse`); a streamed completion is `text/event-stream`; `/metrics`
is Prometheus text. The request schemas are the pydantic models of `schemas.py` and
`tokenization.py`, with what the server checks in Python written into the document: the one
model served, token ids bounded by the vocabulary, non-empty prompts, and chat messages by
role (content required except for an assistant; a tool message names its call). The routes
parse bodies strictly themselves (400s, never FastAPI's 422), so 422 is never documented.
Routes that answer 401 declare the bearer key (optional: only a server started with one
asks for it). `tests/test_server_fuzz.py` runs schemathesis with response-conformance checks
against the document.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field

from pdserve.server.body import BODY_IDLE_TIMEOUT_S
from pdserve.server.schemas import ChatCompletionRequest, CompletionRequest, prompt_schema
from pdserve.server.tokenization import (
    DetokenizeRequest,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    token_ids_schema,
)

# ---- response bodies (documentation: the routes build them as plain dicts) ----

FinishReason = Literal["stop", "length"]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChunk(BaseModel):
    """One event of a streamed completion (usage: the last one with include_usage, or every
    one with continuous_usage_stats)."""
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int = Field(description="when the server started (Unix seconds)")
    owned_by: str
    max_model_len: int
    chat_template: str = Field(description="where the chat template came from")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    workers: int
    live: list[int]
    failed: list[int]
    roles: list[str]
    perf_model: Literal["provisional", "profiled"] = Field(
        description="the performance model the policies read: provisional while the "
        "start-up profile runs in the background, then profiled")
    perf_model_origin: str = Field(description="where its coefficients came from")
    perf_model_error: str | None = Field(
        None, description="why the background start-up profile failed (then the server "
        "stays on the provisional model)")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None


class DetokenizeResponse(BaseModel):
    prompt: str


class VersionResponse(BaseModel):
    version: str


# ---- what each route answers ----

ERRORS = {400: "invalid request", 401: "missing or wrong API key (when one is set)",
          404: "unknown model",
          408: f"the request body stopped arriving ({BODY_IDLE_TIMEOUT_S:g} s without a byte)",
          413: "request body too large",
          415: "a Content-Encoding other than identity (bodies are never decompressed)",
          429: "overloaded: retry later",
          500: "the engine failed on this request", 503: "no worker can serve"}


def event_stream(chunk: type[BaseModel]) -> dict[str, Any]:
    """Server-sent events: each `data` is a JSON `chunk` (or an error body, when a choice
    fails mid-stream), the last one `[DONE]`."""
    data = {"type": "string", "if": {"const": "[DONE]"}, "else": {
        "contentMediaType": "application/json", "contentSchema": {"anyOf": [
            {"$ref": f"#/components/schemas/{chunk.__name__}"},
            {"$ref": "#/components/schemas/ErrorResponse"}]}}}
    return {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"], "properties": {"data": data},
        "description": f"with `stream`: events whose data is a {chunk.__name__} (an error "
                       "body if a choice fails), then [DONE]"}}}


def responses(*errors: int, ok: type[BaseModel] | None = None, ok_description: str = "OK",
              stream: type[BaseModel] | None = None,
              media_type: str | None = None) -> dict[int | str, Any]:
    """A route's `responses=`: 200 (`ok` as JSON, and events of `stream` chunks; or
    `media_type` text; or no body), then each of `errors` as an OpenAI-style error body."""
    success: dict[str, Any] = {"description": ok_description}
    if ok is not None:
        success["model"] = ok
    if media_type is not None:
        success["content"] = {media_type: {"schema": {"type": "string"}}}
    if stream is not None:
        success["content"] = event_stream(stream)
    documented: dict[int | str, Any] = {200: success}
    for status in errors:
        documented[status] = {"description": ERRORS[status], "model": ErrorResponse}
    return documented


def request_body(model: type[BaseModel] | str) -> dict[str, Any]:
    """A route's `openapi_extra` for a JSON body (routes read the body themselves)."""
    name = model if isinstance(model, str) else model.__name__
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{name}"}}}}}


TOKENIZE_REQUEST = "TokenizeRequest"
_USER = [{"role": "user", "content": "Name a colour."}]
EXAMPLES: dict[str, dict[str, dict[str, Any]]] = {  # request body -> name -> body (no model)
    "CompletionRequest": {
        "greedy": {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0},
        "stream": {"prompt": "Once upon a time", "max_tokens": 8, "stream": True,
                   "stream_options": {"include_usage": True}, "logprobs": 2, "seed": 3},
        "prompts x n": {"prompt": ["One", "Two"], "n": 2, "max_tokens": 4, "seed": 1,
                        "echo": True, "stop": ["\n", "."]},
    },
    "ChatCompletionRequest": {
        "chat": {"messages": [{"role": "system", "content": "Be brief."}, *_USER],
                 "max_completion_tokens": 8, "logprobs": True, "top_logprobs": 2},
        "stream": {"messages": _USER, "max_tokens": 8, "stream": True, "logprobs": True,
                   "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        "tool result": {"messages": [*_USER, {"role": "assistant", "content": None},
                                     {"role": "tool", "content": "red", "tool_call_id": "c1"}],
                        "max_tokens": 4, "n": 2, "temperature": 0.7},
    },
    TOKENIZE_REQUEST: {
        "prompt": {"prompt": "Hello world", "return_token_strs": True},
        "chat": {"messages": _USER, "add_generation_prompt": True},
    },
    "DetokenizeRequest": {"tokens": {"tokens": [1, 2, 3]}},
}


def message_schema() -> dict[str, Any]:
    """A chat message as the server takes it, one schema per role."""
    part = {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"enum": ["text"]}, "text": {"type": "string"}},
            "description": "only text parts"}
    content = {"anyOf": [{"type": "string"}, {"type": "array", "items": part}]}
    common = {"name": {"type": ["string", "null"]},
              "tool_call_id": {"type": ["string", "null"]},
              "tool_calls": {"type": ["array", "null"], "maxItems": 0,
                             "description": "tool calls are not supported"}}

    def variant(roles: list[str], required: list[str], **fields: Any) -> dict[str, Any]:
        return {"type": "object", "required": ["role", *required],
                "properties": {"role": {"enum": roles}, **common, **fields}}

    return {"oneOf": [
        variant(["system", "developer", "user"], ["content"], content=content),
        variant(["assistant"], [], content={"anyOf": [content, {"type": "null"}]}),
        variant(["tool"], ["content", "tool_call_id"], content=content,
                tool_call_id={"type": "string", "minLength": 1})],
        "description": "content is required except for an assistant message"}


def document(app: FastAPI, served: str, vocab_size: int, version: str) -> dict[str, Any]:
    schema = get_openapi(title="pdserve", version=version, routes=app.routes,
                         description="An OpenAI- and vLLM-compatible server (pdserve).")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):  # never answered: 400s
        components.pop(name, None)
    for chunk in (CompletionChunk, ChatCompletionChunk):  # referred to by event streams
        body = chunk.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        components[chunk.__name__] = body
    schema["components"]["securitySchemes"] = {"bearer": {
        "type": "http", "scheme": "bearer",
        "description": "the server's API key, when it was started with one"}}
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            operation.get("responses", {}).pop("422", None)
            if "401" in operation.get("responses", {}):  # guarded when a key is set
                operation["security"] = [{"bearer": []}, {}]
    bodies = (CompletionRequest, ChatCompletionRequest, TokenizeCompletionRequest,
              TokenizeChatRequest, DetokenizeRequest)
    for model in bodies:
        body = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(body.pop("$defs", {}))
        model_field = body["properties"]["model"]
        if "anyOf" in model_field:  # optional: the served name or null
            model_field["anyOf"] = [{"type": "string", "enum": [served]}, {"type": "null"}]
        else:
            model_field["enum"] = [served]  # the one model served
        if model is CompletionRequest:
            body["properties"]["prompt"] = prompt_schema(vocab_size)
        if model is DetokenizeRequest:
            body["properties"]["tokens"] = token_ids_schema(vocab_size)
        if "stop_token_ids" in body["properties"]:
            ids = body["properties"]["stop_token_ids"]["anyOf"][0]["items"]
            ids.update(minimum=0, maximum=vocab_size - 1)
        if model is TokenizeCompletionRequest:  # a body with messages is a chat
            body["not"] = {"required": ["messages"]}
        components[model.__name__] = body
    components["ChatMessage"] = message_schema()
    _restrict_structured_outputs(components)
    components.pop("TextPart", None)
    for name in ("ChatCompletionRequest", "TokenizeChatRequest"):
        _restrict_unsupported(components[name]["properties"])
    _restrict_unsupported(components["CompletionRequest"]["properties"])
    components[TOKENIZE_REQUEST] = {"anyOf": [
        {"$ref": "#/components/schemas/TokenizeCompletionRequest"},
        {"$ref": "#/components/schemas/TokenizeChatRequest"}]}
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            media = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if media is not None:
                name = media["schema"]["$ref"].rsplit("/", 1)[1]
                media["examples"] = {title: {"value": {"model": served, **body}}
                                     for title, body in EXAMPLES.get(name, {}).items()}
    return schema


def _restrict_structured_outputs(components: dict[str, Any]) -> None:
    """Structural tags are refused: the schema says so; a json_schema response format needs
    its schema; a list of choices is not empty."""
    kinds = components["ResponseFormat"]["properties"]["type"]
    kinds["enum"] = [kind for kind in kinds["enum"] if kind != "structural_tag"]
    components["ResponseFormat"]["if"] = {"properties": {"type": {"const": "json_schema"}}}
    components["ResponseFormat"]["then"] = {"required": ["json_schema"], "properties": {
        "json_schema": {"type": "object", "required": ["schema"]}}}
    options = components["StructuredOutputs"]["properties"]
    options["structural_tag"] = {"type": "null", "description": "not supported"}


def _restrict_unsupported(properties: dict[str, Any]) -> None:
    """What the server refuses, written into the schema: only the values it takes."""
    only_empty_list = {"type": ["array", "null"], "maxItems": 0}
    not_supported = {"type": "null", "description": "not supported: refused when set"}
    only = {
        "tools": {**only_empty_list, "description": "tool calling is not supported"},
        "tool_choice": {"enum": ["none", None], "description": "only 'none'"},
        "suffix": {"type": ["string", "null"], "maxLength": 0,
                   "description": "not supported: refused when not empty"},
        "chat_template": not_supported,
        "structural_tag": not_supported,
        "truncate_prompt_tokens": not_supported,
        "allowed_token_ids": not_supported,
        "prompt_logprobs": not_supported,
        "prompt_embeds": not_supported,
        "logits_processors": {**only_empty_list, "description": "not supported"},
        "bad_words": {**only_empty_list, "description": "not supported"},
        **{name: {"enum": [False, None], "description": "not supported: refused when true"}
           for name in ("use_beam_search", "return_tokens_as_token_ids", "return_token_ids")},
        **{name: {"enum": [0, None], "description": "not supported: refused unless 0"}
           for name in ("max_repetition_pattern_size", "min_repetition_pattern_size",
                        "repetition_min_count")},
    }
    if "messages" in properties:  # a chat's echo is vLLM's (not a completion's): refused
        only["echo"] = {"enum": [False, None], "description": "not supported: refused when true"}
    for name, schema in only.items():
        if name in properties:
            properties[name] = schema
