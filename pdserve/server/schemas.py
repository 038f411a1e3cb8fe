"""OpenAI-compatible request bodies (the fields OpenAI and vLLM clients send).

Strict types: no string-to-number, number-to-bool or bool-to-number coercion (an integer is
accepted where a float is expected, as in JSON); `NaN`/`Infinity` refused. Ranges are in the
schema so `/openapi.json` documents them. Unknown fields are accepted and ignored with a
logged warning (vLLM's choice: clients such as guidellm send vendor extensions); fields that
change the output in a way pdserve cannot honour (`tools`, `response_format` other than text,
`suffix`, non-text content parts) are declared here and refused with a 400 naming the field
(`pdserve.server.validation`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

MAX_LOGPROBS = 20
MAX_N = 16
MAX_SEED = 2**63 - 1  # a 64-bit signed integer, as vLLM
_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # usage on every chunk (vLLM)


class _Sampling(BaseModel):
    """Fields common to completions and chat completions."""
    model_config = _STRICT
    model: str
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="below 1e-5: greedy")
    top_p: float | None = Field(None, ge=0.0, le=1.0, description="below 1e-5: greedy")
    top_k: int | None = Field(None, ge=-1, description="0 or -1: off")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    logit_bias: dict[str, float] | None = Field(
        None, description="token id (a decimal string) -> bias in [-100, 100]")
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop: str | Annotated[list[str], Field(max_length=16)] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    min_tokens: int | None = Field(0, ge=0)
    ignore_eos: bool | None = False
    user: str | None = None


_TOKEN_IDS = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
# checked element by element in Python (`validation.completion_prompts`), not by pydantic:
# a 5 MB token list validated in one native call would hold the GIL and stall the server
_PROMPT = WithJsonSchema({"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1},
    _TOKEN_IDS, {"type": "array", "items": _TOKEN_IDS, "minItems": 1}],
    "description": "text, token ids, or a list of either (one choice set per prompt)"})


class CompletionRequest(_Sampling):
    prompt: Annotated[str | list[Any], _PROMPT]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="must equal n")
    suffix: str | None = Field(None, description="not supported: refused when set")


class TextPart(BaseModel):
    """A content part; only `type: "text"` is supported (images and audio are refused)."""
    model_config = _STRICT
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = Field(None, description="not supported")


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, description="absent: up to the context")
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[dict[str, Any]] | None = Field(None, description="not supported when non-empty")
    tool_choice: str | dict[str, Any] | None = Field(None, description="only 'none'")
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = Field(None, description="only type 'text'")
