"""Chat requests -> messages for the model's chat template (`engine/chat_template.py`: the
checkpoint's own, a `--chat-template FILE`, or the generic layout).

Content given as a list of parts is joined from its text parts; any other part type
(images, audio) and assistant `tool_calls` are refused with a 400 naming the field.
"""

from __future__ import annotations

from pdserve.engine.chat_template import ChatTemplate, TemplateRefusal
from pdserve.server.errors import APIError
from pdserve.server.schemas import ChatCompletionRequest, ChatMessage


def check_chat_unsupported(body: ChatCompletionRequest) -> None:
    if body.tools:
        raise APIError(400, "tools: tool calling is not supported", "tools")
    if body.tool_choice not in (None, "none"):
        raise APIError(400, "tool_choice: only 'none' is supported", "tool_choice")
    if body.response_format and body.response_format.get("type", "text") != "text":
        kind = body.response_format.get("type")
        raise APIError(400, f"response_format.type: {kind!r} is not supported (only 'text')",
                       "response_format.type")
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
                add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages`; a template's refusal is the client's 400."""
    try:
        return template.render(messages, add_generation_prompt)
    except TemplateRefusal as err:
        raise APIError(400, f"messages: {err}", "messages") from err
