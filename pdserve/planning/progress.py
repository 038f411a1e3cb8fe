"""A progress line on stderr: rewritten in place on a terminal, a line every few seconds
otherwise (a log file), at most every `interval_s`; nothing when disabled."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressLine:
    def __init__(self, enabled: bool = True, stream: TextIO | None = None,
                 interval_s: float = 0.25, log_interval_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.interval_s = interval_s if self.tty else log_interval_s
        self._last = -float("inf")
        self._width = 0
        self._text = ""

    def update(self, text: str) -> None:
        self._text = text
        now = time.monotonic()
        if not self.enabled or now - self._last < self.interval_s:
            return
        self._last = now
        if self.tty:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._text:
            self.stream.write(("\r" + self._text.ljust(self._width) if self.tty
                               else self._text) + "\n")
            self.stream.flush()
