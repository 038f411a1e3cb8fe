"""Chat messages -> prompt text: a checkpoint's own Jinja chat template, or pdserve's generic
layout when the checkpoint has none.

Templates render as Hugging Face's `apply_chat_template` renders them: a sandboxed Jinja
environment (no attribute access to Python internals, no mutation of its inputs) with
`trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that keeps
non-ASCII text, and the globals `raise_exception` and `strftime_now`; the variables are
`messages`, `add_generation_prompt`, `bos_token` and `eos_token`, plus whatever the request
adds (`variables`: vLLM's `chat_template_kwargs`, `documents`, `reasoning_effort`). With
`continue_final_message` the text ends right after the final message's content, left open
for the model to continue (Hugging Face's rule: cut after the last occurrence of that
content). A template's own refusal (`raise_exception`, e.g. roles out of order) raises
`TemplateRefusal` with its message.

The generic layout uses the shipped tokenizer's role markers (`<|system|>`, `<|user|>`,
`<|assistant|>`); `developer` is a system message and a `tool` result a user turn naming
its call. It has no variables: the request's extra ones have nothing to change there.

`end_of_turn_text()` finds the text a template puts right after an assistant message's
content (SmolLM2 and Qwen2: `<|im_end|>`, Llama 3: `<|eot_id|>`) by rendering a marked
message, so the engine can stop at the end of the turn even where it is not the EOS token.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

GENERIC_MARKERS = {"system": "<|system|>", "developer": "<|system|>", "user": "<|user|>",
                   "assistant": "<|assistant|>", "tool": "<|user|>"}
_MARK = "\u2063pdserve-end-of-turn-probe\u2063"


class TemplateRefusal(ValueError):
    """A template refused the messages (its own check, or an error while rendering)."""


def _raise_from_template(message: str) -> None:
    raise TemplateRefusal(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _open_final_message(text: str, messages: list[dict[str, str]]) -> str:
    """`text` cut right after the final message's content (Hugging Face's
    `continue_final_message`: the last occurrence of the stripped content; the content's own
    trailing whitespace is kept where the template kept it)."""
    final = messages[-1]["content"] if messages else ""
    stripped = final.strip()
    if stripped not in text:
        raise TemplateRefusal("continue_final_message: the final message does not appear in "
                              "the rendered chat")
    start = text.rindex(stripped)
    if text[start:start + len(final.lstrip())] == final.lstrip():
        return text[:start + len(final.lstrip())]
    return text[:start + len(stripped)]


class ChatTemplate:
    def __init__(self, source: str | None = None, bos_token: str = "", eos_token: str = "",
                 origin: str = "") -> None:
        """`origin` says where the template came from (for `/v1/models` and logs)."""
        self.bos_token, self.eos_token = bos_token, eos_token
        self.source = source
        self.origin = origin if source is not None else "generic"
        self._template = None
        if source is not None:
            try:
                from jinja2 import TemplateError
                from jinja2.sandbox import ImmutableSandboxedEnvironment
            except ImportError as err:
                raise ValueError("chat templates need jinja2 (pip install jinja2)") from err
            environment = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            environment.filters["tojson"] = _tojson
            environment.globals["raise_exception"] = _raise_from_template
            environment.globals["strftime_now"] = _strftime_now
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
        return cls(file.read_text(), bos_token, eos_token, origin=str(file))

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
               continue_final_message: bool = False,
               variables: dict[str, Any] | None = None) -> str:
        if continue_final_message and add_generation_prompt:
            raise TemplateRefusal("continue_final_message and add_generation_prompt cannot "
                                  "both be true")
        if self._template is None:
            text = self._generic(messages, add_generation_prompt)
        else:
            try:
                text = self._template.render(**(variables or {}), messages=messages,
                                             add_generation_prompt=add_generation_prompt,
                                             bos_token=self.bos_token,
                                             eos_token=self.eos_token)
            except TemplateRefusal:
                raise
            except Exception as err:  # a bug in the template, or input it cannot handle
                raise TemplateRefusal(f"the chat template refused them: {err}") from err
        return _open_final_message(text, messages) if continue_final_message else text

    def end_of_turn_text(self) -> str:
        """The first whitespace-free text after an assistant message ("" if none)."""
        if self._template is None:
            return ""
        try:
            text = self.render([{"role": "user", "content": "hello"},
                                {"role": "assistant", "content": _MARK}],
                               add_generation_prompt=False)
        except TemplateRefusal:
            return ""
        after = text.split(_MARK, 1)[1] if _MARK in text else ""
        return after.split()[0] if after.split() else ""

    @staticmethod
    def _generic(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        parts = []
        for m in messages:
            content = m["content"]
            if m["role"] == "tool":
                content = f"[tool result {m['tool_call_id']}]\n{content}"
            parts.append(f"{GENERIC_MARKERS[m['role']]}\n{content}\n")
        if add_generation_prompt:
            parts.append(GENERIC_MARKERS["assistant"] + "\n")
        return "".join(parts)
