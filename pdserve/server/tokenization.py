"""`/tokenize` and `/detokenize`, with vLLM's request and response shapes.

Tokenize takes a completion prompt (`prompt`, `add_special_tokens` default true) or chat
messages (`messages`, rendered by the served chat template with `add_generation_prompt`
default true, `add_special_tokens` default false) and answers `{count, max_model_len,
tokens, token_strs}` (`token_strs`, the vocabulary entries, with `return_token_strs`).
Detokenize takes `tokens` and answers `{prompt}`, special tokens kept (vLLM's decode), so a
tokenized chat comes back as its rendered text. `model` is optional; when given it must be
the served model (404 otherwise).

Where pdserve differs from vLLM: vLLM tokenizes a text of any length; pdserve refuses, before
tokenising, a text that cannot fit the context (as for a completion's prompt: tokenising the
8 MiB a body may hold costs ~9 s of CPU, and a count past the context is of no use to a
client of this server); a token id outside the vocabulary is a 400 naming it. A chat renders
as a chat completion's does, with the same template inputs (`add_generation_prompt`,
`continue_final_message`, `chat_template_kwargs`: `server/chat_template.py`); chat fields
that would change the rendering and that pdserve does not implement (`chat_template`,
`tools`) are refused with a 400 naming them.
Everything runs in a worker thread, and a long token list is written out in slices, so the
event loop is never held for long.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from pdserve.engine.chat_template import ChatTemplate
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.server.body import parse_json_object
from pdserve.server.chat_template import chat_options, flatten_messages, render_chat
from pdserve.server.errors import APIError, check_model
from pdserve.server.schemas import ChatMessage
from pdserve.server.unknown_fields import UnknownFields
from pdserve.server.validation import Limits, parse_model, refuse_unfit_text, token_id_list

_STRICT = ConfigDict(strict=True, allow_inf_nan=False, extra="allow")
JSON_SLICE_TOKENS = 8192  # list items written per slice (the GIL is free between slices)


class TokenizeCompletionRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    prompt: str
    add_special_tokens: bool = Field(True, description="add the tokenizer's special tokens "
                                     "(e.g. BOS)")
    return_token_strs: bool | None = Field(False, description="also return each token's "
                                           "vocabulary entry")


class TokenizeChatRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool | None = Field(
        None, description="end with the assistant's turn opening, as a chat completion does "
        "(default true; false with continue_final_message)")
    add_special_tokens: bool = Field(False, description="add the tokenizer's special tokens "
                                     "on top of the chat template's")
    return_token_strs: bool | None = False
    continue_final_message: bool | None = Field(
        False, description="leave the final message open for the model to continue")
    chat_template: str | None = Field(None, description="not supported: refused when set")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="more variables for the chat template")
    tools: list[dict[str, Any]] | None = Field(None, description="not supported: refused when "
                                               "not empty")


# token ids are checked element by element in Python (`validation.token_id_list`): a 5 MB
# list validated in one native call would hold the GIL and stall the server
def token_ids_schema(vocab_size: int | None = None) -> dict[str, Any]:
    items: dict[str, Any] = {"type": "integer"}
    if vocab_size is not None:
        items.update(minimum=0, maximum=vocab_size - 1)
    return {"type": "array", "items": items, "description": "token ids"}


class DetokenizeRequest(BaseModel):
    model_config = _STRICT
    model: str | None = None
    tokens: Annotated[list[Any], WithJsonSchema(token_ids_schema())]


def _check_chat_unsupported(body: TokenizeChatRequest) -> None:
    refused = [("chat_template", body.chat_template is not None),
               ("tools", bool(body.tools))]
    for name, given in refused:
        if given:
            raise APIError(400, f"{name}: not supported by /tokenize", name)


def tokenize(raw_body: bytes, served: str, tokenizer: TextTokenizer, limits: Limits,
             template: ChatTemplate, unknown: UnknownFields | None = None) -> bytes:
    """A `/tokenize` body -> the JSON answer (in a worker thread)."""
    raw = parse_json_object(raw_body)
    if "messages" in raw and "prompt" in raw:
        raise APIError(400, "give either prompt (a completion) or messages (a chat), not both",
                       "messages")
    body: TokenizeCompletionRequest | TokenizeChatRequest
    if "messages" in raw:
        body = parse_model(raw, TokenizeChatRequest, unknown)
        check_model(body.model, served)
        _check_chat_unsupported(body)
        text = render_chat(template, flatten_messages(body.messages), chat_options(
            body.add_generation_prompt, body.continue_final_message, body.chat_template_kwargs))
        param = "messages"
    else:
        body = parse_model(raw, TokenizeCompletionRequest, unknown)
        check_model(body.model, served)
        text, param = body.prompt, "prompt"
    refuse_unfit_text(text, tokenizer, limits, param, 0)
    [encoded] = tokenizer.raw.encode_batch([text], add_special_tokens=body.add_special_tokens)
    ids: list[int] = encoded.ids
    strings = "null"
    if body.return_token_strs:
        strings = json_array([tokenizer.raw.id_to_token(i) or "" for i in ids])
    return (f'{{"count": {len(ids)}, "max_model_len": {limits.context_tokens}, '
            f'"tokens": {json_array(ids)}, "token_strs": {strings}}}').encode()


def detokenize(raw_body: bytes, served: str, tokenizer: TextTokenizer, limits: Limits,
               unknown: UnknownFields | None = None) -> bytes:
    """A `/detokenize` body -> the JSON answer (in a worker thread)."""
    body: DetokenizeRequest = parse_model(parse_json_object(raw_body), DetokenizeRequest,
                                          unknown)
    check_model(body.model, served)
    ids = token_id_list(body.tokens, limits, "tokens")
    [text] = tokenizer.raw.decode_batch([ids], skip_special_tokens=False)  # frees the GIL
    return json.dumps({"prompt": text}).encode()


def json_array(values: list[int] | list[str]) -> str:
    """`values` as a JSON array, written a slice at a time so the GIL is free between
    slices (json.dumps of a million token ids holds it for ~0.3 s)."""
    parts = [json.dumps(values[start:start + JSON_SLICE_TOKENS])[1:-1]
             for start in range(0, len(values), JSON_SLICE_TOKENS)]
    return "[" + ",".join(parts) + "]"
