"""Incremental detokenization with stop strings and stop tokens, shared by the engine and the
server.

`push(token)` returns only text that is final: a suffix that could still grow into a stop
string, or an incomplete UTF-8 sequence (decoded as U+FFFD), is held back. When a stop
string appears, the text is cut before it (after it with `include_stop`) and `stopped` is
set; a stop token (EOS unless `ignore_eos`, or one of `stop_token_ids`) sets `stopped` and
adds no text (its own text with `include_stop`: vLLM's `include_stop_str_in_output`, which
also stops holding text back, since the stop string stays in the output). `finish()`
releases whatever was held back when generation ends for another reason. With `min_tokens`,
a stop string counts only if it ends in the text of output token `min_tokens` or later, and
a stop token only from output token `min_tokens` on (vLLM's rules). The text is decoded as
the request asks (`skip_special_tokens`, `spaces_between_special_tokens`:
`TextTokenizer.decode`). The engine uses it to decide that a stop string ended a sequence;
the server uses its own copy to stream exactly that text.
"""

from __future__ import annotations

from collections.abc import Collection

from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.tokenizer import TextTokenizer


class TextStream:
    def __init__(self, tokenizer: TextTokenizer, stop: tuple[str, ...] = (),
                 min_tokens: int = 0, *, include_stop: bool = False,
                 skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True,
                 stop_token_ids: Collection[int] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.token_ids: list[int] = []
        self.text = ""  # final text so far (cut at a stop string once stopped)
        self.emitted = 0  # characters of `text` already returned
        self.stopped = False
        self.min_tokens = min_tokens
        self.unstoppable_chars = 0  # text before output token `min_tokens`: no stop ends there
        self.include_stop = include_stop
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self.stop_token_ids = frozenset(stop_token_ids)

    @classmethod
    def for_params(cls, tokenizer: TextTokenizer, params: SamplingParams,
                   eos_token_ids: tuple[int, ...] | list[int]) -> TextStream:
        """The stream of a request's output as its `params` ask (stop strings and tokens,
        detokenization options)."""
        return cls(tokenizer, params.stop, params.min_tokens,
                   include_stop=params.include_stop_str_in_output,
                   skip_special_tokens=params.skip_special_tokens,
                   spaces_between_special_tokens=params.spaces_between_special_tokens,
                   stop_token_ids=params.stop_tokens(eos_token_ids))

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, self.skip_special_tokens,
                                     self.spaces_between_special_tokens)

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        if token_id in self.stop_token_ids and len(self.token_ids) >= self.min_tokens:
            self.stopped = True
            kept = self.token_ids if self.include_stop else self.token_ids[:-1]
            self.text = self._decode(kept)
            return self._emit(len(self.text))
        full = self._decode(self.token_ids)
        if len(self.token_ids) < self.min_tokens:
            self.unstoppable_chars = len(full)
            cuts = []
        else:
            guard = self.unstoppable_chars
            cuts = [(i, i + len(s) if self.include_stop else i) for i, s in
                    ((full.find(s, max(0, guard - len(s) + 1)), s) for s in self.stop)
                    if i >= 0]
        if cuts:
            self.stopped = True
            self.text = full[:min(cuts)[1]]
            return self._emit(len(self.text))
        self.text = full
        safe = len(full.rstrip("\ufffd"))
        for stop in () if self.include_stop else self.stop:
            # hold back a suffix that may be the start of a stop string
            for length in range(min(len(stop) - 1, safe), 0, -1):
                if full[:safe].endswith(stop[:length]):
                    safe -= length
                    break
        return self._emit(max(safe, self.emitted))

    def finish(self) -> str:
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        delta = self.text[self.emitted:end]
        self.emitted = max(self.emitted, end)
        return delta
