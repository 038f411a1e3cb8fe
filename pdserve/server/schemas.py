"""OpenAI-compatible request bodies (the fields OpenAI and vLLM clients send).

Strict types: no string-to-number, number-to-bool or bool-to-number coercion (an integer is
accepted where a float is expected, as in JSON); `NaN`/`Infinity` refused. Ranges are in the
schema so `/openapi.json` documents them (`openapi.py` adds what is checked in Python).
Unknown fields are accepted and ignored, counted and logged within bounds
(`unknown_fields.py`; vLLM's choice: clients such as guidellm send vendor extensions); fields that
change the output in a way pdserve cannot honour (`tools`, `response_format` other than text,
`suffix`, non-text content parts) are declared here and refused with a 400 naming the field
(`pdserve.server.validation`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

MAX_LOGPROBS = 20
MAX_N = 16
MAX_SEED = 2**63 - 1  # a 64-bit signed integer, as vLLM
# OpenAI takes at most 4 stop strings, vLLM any number; clients written for vLLM send more
# than 4 (code benchmarks ~10), so pdserve takes up to 64, each of at most 256 characters:
# every stop string is matched on every token, in the worker and again in the server's
# stream, at a cost that grows with its length times the text (64 x 256 characters: ~6 ms
# per token at 4000 tokens, measured). More or longer ones get a 400 naming the limit.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 256
_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")


def integral(value: object) -> object:
    """3.0 is an integer in JSON (and JSON Schema); 3.5, "3" and true stay refused."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


_INT_FIELDS = frozenset({"top_k", "seed", "n", "min_tokens", "max_tokens", "logprobs",
                         "best_of", "max_completion_tokens", "top_logprobs"})


_STOP_TEXT = {"type": "string", "maxLength": MAX_STOP_CHARS}
_STOP_SCHEMA = {"anyOf": [_STOP_TEXT, {"type": "array", "items": _STOP_TEXT,
                                       "maxItems": MAX_STOP_STRINGS}, {"type": "null"}],
                "description": f"at most {MAX_STOP_STRINGS} stop strings of at most "
                               f"{MAX_STOP_CHARS} characters"}


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # usage on every chunk (vLLM)


class _Sampling(BaseModel):
    """Fields common to completions and chat completions."""
    model_config = _STRICT

    @model_validator(mode="before")
    @classmethod
    def _integral_floats(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: integral(v) if k in _INT_FIELDS else v
                    for k, v in data.items()}
        return data
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
    # checked in Python (`validation.check_stop`) for a message that names the limit
    stop: Annotated[str | list[str] | None, WithJsonSchema(_STOP_SCHEMA)] = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(1, ge=1, le=MAX_N)
    min_tokens: int | None = Field(0, ge=0)
    ignore_eos: bool | None = False
    user: str | None = None


def prompt_schema(vocab_size: int | None = None) -> dict[str, Any]:
    """The documented forms of a completion prompt (token ids bounded by the vocabulary)."""
    ids: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "integer"}}
    if vocab_size is not None:
        ids["items"].update(minimum=0, maximum=vocab_size - 1)
    text = {"type": "string", "minLength": 1}  # "" has no token to start from: a 400
    return {"anyOf": [text, {"type": "array", "items": text, "minItems": 1}, ids,
                      {"type": "array", "items": ids, "minItems": 1}],
            "description": "text, token ids, or a list of either (one choice set per prompt)"}


# checked element by element in Python (`validation.split_prompts`), not by pydantic: a
# 5 MB token list validated in one native call would hold the GIL and stall the server
_PROMPT = WithJsonSchema(prompt_schema())


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
