"""OpenAI-compatible request bodies (the fields OpenAI and vLLM clients send).

Strict types: no string-to-number, number-to-bool or bool-to-number coercion (an integer is
accepted where a float is expected, as in JSON); `NaN`/`Infinity` refused. Ranges are in the
schema so `/openapi.json` documents them (`openapi.py` adds what is checked in Python).
Unknown fields are accepted and ignored, counted and logged within bounds
(`unknown_fields.py`; vLLM's choice: clients such as guidellm send vendor extensions). Every
field vLLM's `CompletionRequest` and `ChatCompletionRequest` take is declared here, so none
is silently ignored as unknown: it is implemented, refused with a 400 naming it when it would
change the output (`validation.refuse_unimplemented`), or accepted and ignored because it
cannot change the output. The audit (vLLM 0.11-0.12 field lists, and the `guided_*` fields of
earlier versions; C: completions only, Ch: chat only):

| vLLM field | pdserve |
| --- | --- |
| model, prompt (C), messages (Ch), max_tokens, max_completion_tokens (Ch), n, stream, stream_options, temperature, top_p, top_k, min_p, seed, stop, presence_penalty, frequency_penalty, repetition_penalty, logit_bias, ignore_eos, min_tokens, logprobs, top_logprobs (Ch), echo (C) | implemented |
| stop_token_ids, include_stop_str_in_output, skip_special_tokens, spaces_between_special_tokens | implemented (`TextStream`, the engine's stop check) |
| add_special_tokens | implemented (what the tokenizer's post-processor adds; C default true, Ch false) |
| add_generation_prompt, continue_final_message, chat_template_kwargs, documents, reasoning_effort (Ch) | implemented: template variables, as vLLM passes them (`server/chat_template.py`) |
| response_format (json_object, json_schema), structured_outputs (json, regex, choice, grammar, json_object, disable_any_whitespace, disable_additional_properties, whitespace_pattern), guided_json, guided_regex, guided_choice, guided_grammar, guided_whitespace_pattern | implemented: structured outputs (`server/constraints.py`, `engine/structured_output.py`) |
| best_of (C) | implemented when equal to n, else refused |
| response_format structural_tag, structured_outputs.structural_tag, structural_tag | refused |
| suffix (C), tools, tool_choice other than none (Ch), chat_template (Ch), echo (Ch), use_beam_search, truncate_prompt_tokens, allowed_token_ids, bad_words (Ch), prompt_logprobs, prompt_embeds (C), logits_processors, return_tokens_as_token_ids, return_token_ids, max_repetition_pattern_size, min_repetition_pattern_size, repetition_min_count | refused when set (non-default) |
| user, parallel_tool_calls (Ch), length_penalty (beam search only, refused), priority (scheduling), request_id (an id), cache_salt (prefix-cache isolation), kv_transfer_params (vLLM's P/D connectors), vllm_xargs (read by vLLM extensions; pdserve has none), mm_processor_kwargs (Ch; no multimodal input is taken), include_reasoning (Ch; no reasoning parser), guided_decoding_backend, structured_outputs.disable_fallback (pdserve has one grammar engine) | accepted and ignored: output-neutral |
"""  # noqa: E501 (a table's rows are one line each)

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
MAX_STOP_TOKEN_IDS = 256  # each is a set lookup per token: cheap, but a body should not
# be a vocabulary
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


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`."""
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow",
                              populate_by_name=True)
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = Field(None, description="accepted: the output always follows the "
                                "schema")


class ResponseFormat(BaseModel):
    model_config = _STRICT
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: at most one constraint (json, regex, choice, grammar or
    json_object), with options for JSON Schemas."""
    model_config = _STRICT
    json_: dict[str, Any] | str | None = Field(None, alias="json",
                                               description="a JSON Schema")
    regex: str | None = None
    choice: list[str] | None = Field(None, min_length=1)
    grammar: str | None = Field(None, description="Lark, or GBNF/EBNF, as llguidance takes it")
    json_object: bool | None = None
    disable_any_whitespace: bool | None = Field(
        None, description="JSON without free whitespace; pdserve's default unless false")
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None
    structural_tag: str | dict[str, Any] | None = Field(None, description="not supported")
    disable_fallback: bool | None = Field(None, description="accepted: one grammar engine")


_STOP_TOKEN_IDS = {"anyOf": [{"type": "array", "items": {"type": "integer"},
                              "maxItems": MAX_STOP_TOKEN_IDS}, {"type": "null"}],
                   "description": "token ids that end the output as EOS does"}


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
    # vLLM's sampling and detokenization extensions
    stop_token_ids: Annotated[list[Any] | None, WithJsonSchema(_STOP_TOKEN_IDS)] = None
    include_stop_str_in_output: bool | None = False
    skip_special_tokens: bool | None = True
    spaces_between_special_tokens: bool | None = True
    add_special_tokens: bool | None = Field(
        None, description="add what the tokenizer adds (e.g. BOS): default true for "
        "completions, false for chat")
    # structured outputs (one constraint per request)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = Field(None, min_length=1)
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = Field(None, description="accepted and ignored")
    structural_tag: str | None = Field(None, description="not supported")
    # vLLM fields refused when set: they would change the output
    use_beam_search: bool | None = Field(False, description="not supported: refused when true")
    truncate_prompt_tokens: int | None = Field(None, description="not supported")
    allowed_token_ids: list[int] | None = Field(None, description="not supported")
    prompt_logprobs: int | None = Field(None, description="not supported")
    logits_processors: list[Any] | None = Field(None, description="not supported")
    return_tokens_as_token_ids: bool | None = Field(None, description="not supported")
    return_token_ids: bool | None = Field(None, description="not supported")
    max_repetition_pattern_size: int | None = Field(0, description="not supported")
    min_repetition_pattern_size: int | None = Field(0, description="not supported")
    repetition_min_count: int | None = Field(0, description="not supported")
    # vLLM fields accepted and ignored: they do not change the output
    length_penalty: float | None = Field(None, description="beam search only: no effect")
    priority: int | None = Field(None, description="accepted and ignored")
    request_id: str | None = Field(None, description="accepted and ignored")
    cache_salt: str | None = Field(None, description="accepted and ignored")
    kv_transfer_params: dict[str, Any] | None = Field(None, description="accepted and ignored")
    vllm_xargs: dict[str, Any] | None = Field(None, description="accepted and ignored")


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
    prompt_embeds: str | list[str] | None = Field(None, description="not supported")


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
    # the chat template's inputs (vLLM's)
    add_generation_prompt: bool | None = Field(
        None, description="end with the assistant's turn opening (default true; false "
        "with continue_final_message)")
    continue_final_message: bool | None = Field(
        False, description="leave the final message open for the model to continue")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="more variables for the chat template")
    documents: list[dict[str, str]] | None = Field(
        None, description="the template's `documents` variable")
    reasoning_effort: str | None = Field(
        None, description="the template's `reasoning_effort` variable")
    chat_template: str | None = Field(None, description="not supported: refused when set")
    echo: bool | None = Field(False, description="not supported: refused when true")
    bad_words: list[str] | None = Field(None, description="not supported")
    include_reasoning: bool | None = Field(None, description="accepted and ignored")
    mm_processor_kwargs: dict[str, Any] | None = Field(None, description="accepted and ignored")
