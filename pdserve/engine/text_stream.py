"""Incremental detokenization with stop strings, shared by the engine and the server.

`push(token)` returns only text that is final: a suffix that could still grow into a stop
string, or an incomplete UTF-8 sequence (decoded as U+FFFD), is held back. When a stop
string appears, the text is cut before it and `stopped` is set; `finish()` releases whatever
was held back when generation ends for another reason. The engine uses it to decide that a
stop string ended a sequence; the server uses its own copy to stream exactly that text.
"""

from __future__ import annotations

from pdserve.engine.tokenizer import TextTokenizer


class TextStream:
    def __init__(self, tokenizer: TextTokenizer, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.token_ids: list[int] = []
        self.text = ""  # final text so far (cut at a stop string once stopped)
        self.emitted = 0  # characters of `text` already returned
        self.stopped = False

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self.token_ids.append(token_id)
        full = self.tokenizer.decode(self.token_ids)
        cuts = [i for i in (full.find(s) for s in self.stop) if i >= 0]
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
