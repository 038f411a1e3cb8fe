"""Chat messages -> prompt text: pdserve's generic layout, or a Jinja chat template file.

The generic layout uses the shipped tokenizer's role markers (`<|system|>`, `<|user|>`,
`<|assistant|>`); `developer` is a system message and a `tool` result is a user turn naming
its call. `--chat-template FILE` renders a Hugging Face style Jinja template instead
(`messages`, `add_generation_prompt`, `bos_token`, `eos_token`); it needs jinja2.
Content given as a list of parts is joined from its text parts; any other part type
(images, audio) and assistant `tool_calls` are refused with a 400 naming the field.
"""

from __future__ import annotations

from pathlib import Path

from pdserve.server.errors import APIError
from pdserve.server.schemas import ChatCompletionRequest, ChatMessage

GENERIC_MARKERS = {"system": "<|system|>", "developer": "<|system|>", "user": "<|user|>",
                   "assistant": "<|assistant|>", "tool": "<|user|>"}


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


class ChatTemplate:
    def __init__(self, source: str | None = None, bos_token: str = "",
                 eos_token: str = "") -> None:
        self.bos_token, self.eos_token = bos_token, eos_token
        self._template = None
        if source is not None:
            try:
                from jinja2 import TemplateError
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError as err:
                raise ValueError("--chat-template needs jinja2 (pip install jinja2)") from err
            environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            environment.globals["raise_exception"] = _raise_from_template
            try:
                self._template = environment.from_string(source)
            except TemplateError as err:
                raise ValueError(f"the chat template does not parse: {err}") from err

    @classmethod
    def from_file(cls, path: str | Path, bos_token: str = "",
                  eos_token: str = "") -> ChatTemplate:
        file = Path(path)
        if not file.is_file():
            raise ValueError(f"--chat-template: no such file {file}")
        return cls(file.read_text(), bos_token, eos_token)

    def render(self, messages: list[dict[str, str]]) -> str:
        if self._template is None:
            return self._generic(messages)
        try:
            return self._template.render(messages=messages, add_generation_prompt=True,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except APIError:
            raise
        except Exception as err:  # a template's own check (e.g. role order) or a bug in it
            raise APIError(400, f"messages: the chat template refused them: {err}",
                           "messages") from err

    @staticmethod
    def _generic(messages: list[dict[str, str]]) -> str:
        parts = []
        for m in messages:
            content = m["content"]
            if m["role"] == "tool":
                content = f"[tool result {m['tool_call_id']}]\n{content}"
            parts.append(f"{GENERIC_MARKERS[m['role']]}\n{content}\n")
        return "".join(parts) + GENERIC_MARKERS["assistant"] + "\n"


def _raise_from_template(message: str) -> None:
    raise APIError(400, f"messages: {message}", "messages")
