"""Chat requests -> messages for the model's chat template (`engine/chat_template.py`: the
checkpoint's own, a `--chat-template FILE`, or the generic layout), and the template's
inputs a request sets.

Content given as a list of parts is joined from its text parts; any other part type
(images, audio) and assistant `tool_calls` are refused with a 400 naming the field.

The template's inputs are vLLM's: `add_generation_prompt` (default true),
`continue_final_message` (default false; then `add_generation_prompt` defaults to false,
and both true is a 400 naming both), and variables: `chat_template_kwargs` (any name but
the template's own inputs: `messages`, `bos_token`, `eos_token`, `raise_exception`,
`strftime_now`, and `tools`/`chat_template`, which pdserve refuses), `documents` and
`reasoning_effort`. As in vLLM, `chat_template_kwargs` may also set `add_generation_prompt`
and `continue_final_message` (booleans); one that contradicts the field of the same name is
a 400 naming both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pdserve.engine.chat_template import ChatTemplate, TemplateRefusal
from pdserve.server.errors import APIError
from pdserve.server.schemas import ChatCompletionRequest, ChatMessage

RESERVED_VARIABLES = frozenset({"messages", "bos_token", "eos_token", "raise_exception",
                                "strftime_now", "tools", "chat_template", "tokenize"})
_FLAGS = ("add_generation_prompt", "continue_final_message")


@dataclass(frozen=True)
class ChatOptions:
    """What a request sets of the chat template's inputs."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    variables: dict[str, Any] = field(default_factory=dict)


def chat_options(add_generation_prompt: bool | None, continue_final_message: bool | None,
                 kwargs: dict[str, Any] | None, **variables: Any) -> ChatOptions:
    """The template's inputs from a request's fields (None: not given); `variables` are
    more template variables (`documents`, `reasoning_effort`; None ones left out)."""
    given: dict[str, bool | None] = {"add_generation_prompt": add_generation_prompt,
                                     "continue_final_message": continue_final_message}
    extra = dict(kwargs or {})
    for name in sorted(set(extra) & RESERVED_VARIABLES):
        raise APIError(400, f"chat_template_kwargs.{name}: reserved (an input of the chat "
                       f"template pdserve sets itself)", f"chat_template_kwargs.{name}")
    for name in _FLAGS:
        if name not in extra:
            continue
        value = extra.pop(name)
        if type(value) is not bool:
            raise APIError(400, f"chat_template_kwargs.{name}: must be a boolean",
                           f"chat_template_kwargs.{name}")
        if given[name] is not None and given[name] != value:
            raise APIError(400, f"chat_template_kwargs.{name} ({value}) contradicts {name} "
                           f"({given[name]})", f"chat_template_kwargs.{name}")
        given[name] = value
    cont = bool(given["continue_final_message"])
    if cont and given["add_generation_prompt"]:
        raise APIError(400, "continue_final_message and add_generation_prompt cannot both be "
                       "true", "continue_final_message")
    add = not cont if given["add_generation_prompt"] is None else given["add_generation_prompt"]
    extra.update({name: value for name, value in variables.items() if value is not None})
    return ChatOptions(add, cont, extra)


def request_chat_options(body: ChatCompletionRequest) -> ChatOptions:
    return chat_options(body.add_generation_prompt, body.continue_final_message,
                        body.chat_template_kwargs, documents=body.documents,
                        reasoning_effort=body.reasoning_effort)


def check_chat_unsupported(body: ChatCompletionRequest) -> None:
    if body.tools:
        raise APIError(400, "tools: tool calling is not supported", "tools")
    if body.tool_choice not in (None, "none"):
        raise APIError(400, "tool_choice: only 'none' is supported", "tool_choice")
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")


def flatten_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Each message as {role, content[, name, tool_call_id]} with text content."""
    flat = []
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if message.tool_calls:
            raise APIError(400, f"{where}.tool_calls: tool calls are not supported",
                           f"{where}.tool_calls")
        if message.content is None:
            if message.role != "assistant":
                raise APIError(400, f"{where}.content: required for a {message.role} message",
                               f"{where}.content")
            text = ""
        elif isinstance(message.content, str):
            text = message.content
        else:
            pieces = []
            for j, part in enumerate(message.content):
                if part.type != "text" or part.text is None:
                    raise APIError(400, f"{where}.content.{j}.type: only text parts are "
                                   f"supported, got {part.type!r}", f"{where}.content.{j}.type")
                pieces.append(part.text)
            text = "".join(pieces)
        if message.role == "tool" and not message.tool_call_id:
            raise APIError(400, f"{where}.tool_call_id: required for a tool message",
                           f"{where}.tool_call_id")
        entry = {"role": message.role, "content": text}
        if message.name:
            entry["name"] = message.name
        if message.tool_call_id:
            entry["tool_call_id"] = message.tool_call_id
        flat.append(entry)
    return flat


def render_chat(template: ChatTemplate, messages: list[dict[str, str]],
                options: ChatOptions | None = None) -> str:
    """The prompt text for `messages`; a template's refusal is the client's 400."""
    options = options or ChatOptions()
    try:
        return template.render(messages, options.add_generation_prompt,
                               options.continue_final_message, options.variables)
    except TemplateRefusal as err:
        raise APIError(400, f"messages: {err}", "messages") from err
