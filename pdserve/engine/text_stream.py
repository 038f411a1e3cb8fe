"""Incremental detokenization with stop strings, shared by the engine and the server.

`push(token)` returns only text that is final: a suffix that could still grow into a stop
string, or an incomplete UTF-8 sequence (decoded as U+FFFD), is held back. When a stop
string appears, the text is cut before it and `stopped` is set; `finish()` releases whatever
was held back when generation ends for another reason. With `min_tokens`, a stop string
counts only if it ends in the text of output token `min_tokens` or later (vLLM's rule). The
engine uses it to decide that a
stop string ended a sequence; the server uses its own copy to stream exactly that text.
"""

from __future__ import annotations

from pdserve.engine.tokenizer import TextTokenizer


class TextStream:
    def __init__(self, tokenizer: TextTokenizer, stop: tuple[str, ...] = (),
                 min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.token_ids: list[int] = []
        self.text = ""  # final text so far (cut at a stop string once stopped)
        self.emitted = 0  # characters of `text` already returned
        self.stopped = False
        self.min_tokens = min_tokens
        self.unstoppable_chars = 0  # text before output token `min_tokens`: no stop ends there

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        full = self.tokenizer.decode(self.token_ids)
        if len(self.token_ids) < self.min_tokens:
            self.unstoppable_chars = len(full)
            cuts = []
        else:
            guard = self.unstoppable_chars
            cuts = [i for i in (full.find(s, max(0, guard - len(s) + 1)) for s in self.stop)
                    if i >= 0]
        if cuts:
            self.stopped = True
            self.text = full[:min(cuts)]
            return self._emit(len(self.text))
        self.text = full
        safe = len(full.rstrip("\ufffd"))
        for stop in self.stop:  # hold back a suffix that may be the start of a stop string
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
