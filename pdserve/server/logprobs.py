"""Per-token logprobs in OpenAI's two formats, from the driver's `("logprob", entry)` events.

An entry (`TokenLogprob`) has `token_id`, `logprob` and `top` ((token id, logprob) pairs,
best first). Completions: `{tokens, token_logprobs, top_logprobs, text_offset}`, where
each `top_logprobs` dict also holds the sampled token (as vLLM does). Chat:
`{content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}`.
A token that is only part of a UTF-8 character is shown as `bytes:\\xNN...`.

Chat leaves out the end-of-turn token that ended the answer (`<|im_end|>`, the EOS), as
OpenAI does: it is not part of the message. The formatter is given those token ids
(`end_tokens`), holds such an entry back until it knows whether another token follows (with
`ignore_eos` the turn goes on, and the entry is shown) or how the choice ended (`finish`).
"""

from __future__ import annotations

from typing import Any

from pdserve.engine.tokenizer import TextTokenizer


class LogprobFormatter:
    def __init__(self, tokenizer: TextTokenizer, chat: bool, text_offset: int = 0,
                 end_tokens: tuple[int, ...] = ()) -> None:
        self.tokenizer, self.chat = tokenizer, chat
        self.text_offset = text_offset  # characters before the next token (echo included)
        self.end_tokens = frozenset(end_tokens)  # left out when they end the choice
        self.pending: list[Any] = []
        self._end: Any = None  # an end-of-turn entry held back
        self._strings: dict[int, tuple[str, list[int]]] = {}

    def add(self, entry: Any) -> None:
        if self._end is not None:  # the turn went on (ignore_eos): the token is output
            self.pending.append(self._end)
            self._end = None
        if entry.token_id in self.end_tokens:
            self._end = entry
        else:
            self.pending.append(entry)

    def finish(self, reason: str) -> None:
        """The choice ended with `reason`: an end-of-turn token that stopped it is left
        out; one that was the last token allowed (`length`) is output."""
        end, self._end = self._end, None
        if end is not None and reason != "stop":
            self.pending.append(end)

    def take(self) -> dict[str, Any] | None:
        """The pending entries in the response's format (None when there are none)."""
        entries, self.pending = self.pending, []
        if not entries:
            return None
        return self._chat(entries) if self.chat else self._completion(entries)

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        known = self._strings.get(token_id)
        if known is None:
            raw = self.tokenizer.token_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{byte:02x}" for byte in raw)
            known = self._strings[token_id] = (text, list(raw))
        return known

    def _completion(self, entries: list[Any]) -> dict[str, Any]:
        tokens, logprobs, tops, offsets = [], [], [], []
        for entry in entries:
            text = self._token(entry.token_id)[0]
            tokens.append(text)
            logprobs.append(entry.logprob)
            top = {self._token(token)[0]: value for token, value in entry.top}
            top.setdefault(text, entry.logprob)
            tops.append(top)
            offsets.append(self.text_offset)
            self.text_offset += len(text)
        return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
                "text_offset": offsets}

    def _chat(self, entries: list[Any]) -> dict[str, Any]:
        content = []
        for entry in entries:
            text, raw = self._token(entry.token_id)
            top = [{"token": self._token(token)[0], "logprob": value,
                    "bytes": self._token(token)[1]} for token, value in entry.top]
            content.append({"token": text, "logprob": entry.logprob, "bytes": raw,
                            "top_logprobs": top})
        return {"content": content}


def merge(parts: list[dict[str, Any]], chat: bool) -> dict[str, Any] | None:
    """One logprobs object from the parts of a whole (non-streamed) response."""
    if chat:
        return {"content": [item for part in parts for item in part["content"]]}
    if not parts:
        return None
    return {key: [item for part in parts for item in part[key]]
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
