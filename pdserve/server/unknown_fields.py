"""Warnings about request-body fields pdserve does not know, with bounded state and safe logs.

Unknown fields are ignored (vLLM's choice: clients such as guidellm send vendor extensions),
and the operator is told once per field name. A client chooses those names, so everything
kept or logged about them is bounded (issue 27: ten 5.4 MB bodies of 80k unique keys each
grew the server by 163 MiB and wrote 50 MiB of log in 5 s; a key holding a newline forged a
log line):

- at most `max_tracked` distinct (schema, name) pairs are remembered, each name cut to
  `MAX_NAME_CHARS`; occurrences of names past that are only counted (`untracked`);
- a warning line names at most `MAX_NAMES_PER_LINE` names, each cut and written as Python's
  `repr` writes it (no raw newline or control character reaches the log), then "+N more";
- at most `lines_per_window` warning lines per `window_s` seconds; the next line allowed
  says how many were suppressed.

`UnknownFields` is shared by the request threads (bodies are parsed in worker threads), so
its state is behind a lock. The app owns one and shows its total on `/metrics`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger("pdserve.server")

MAX_NAME_CHARS = 64
MAX_NAMES_PER_LINE = 8
DEFAULT_MAX_TRACKED = 256
DEFAULT_LINES_PER_WINDOW = 10
DEFAULT_WINDOW_S = 60.0


def shown(name: str) -> str:
    """A client-chosen name as it may appear in a log line: cut, then escaped by `repr`."""
    cut = name[:MAX_NAME_CHARS]
    return repr(cut) + ("..." if len(name) > MAX_NAME_CHARS else "")


@dataclass(frozen=True)
class UnknownFieldCounts:
    total: int  # unknown fields seen, every occurrence
    tracked: int  # distinct (schema, name) pairs remembered
    untracked: int  # occurrences of names not remembered (the table was full)
    suppressed_lines: int  # warning lines dropped by the rate limit


class UnknownFields:
    def __init__(self, max_tracked: int = DEFAULT_MAX_TRACKED,
                 lines_per_window: int = DEFAULT_LINES_PER_WINDOW,
                 window_s: float = DEFAULT_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_tracked, self.lines_per_window, self.window_s = (max_tracked, lines_per_window,
                                                                  window_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], int] = {}  # (schema, cut name) -> occurrences
        self._total = self._untracked = self._suppressed_total = 0
        self._window_start = -float("inf")
        self._lines_in_window = self._suppressed_in_window = 0

    def note(self, schema: str, names: Iterable[str]) -> None:
        """Count the unknown field `names` of one `schema` body; warn about new ones."""
        new: list[str] = []
        more = 0
        with self._lock:
            for name in names:
                self._total += 1
                key = (schema, name[:MAX_NAME_CHARS])
                count = self._seen.get(key)
                if count is not None:
                    self._seen[key] = count + 1
                    continue
                if len(self._seen) < self.max_tracked:
                    self._seen[key] = 1
                else:
                    self._untracked += 1
                if len(new) < MAX_NAMES_PER_LINE:
                    new.append(name)
                else:
                    more += 1
            if not new:
                return
            suppressed = self._admit_line()
        if suppressed < 0:
            return
        listed = ", ".join(shown(name) for name in new) + (f" (+{more} more)" if more else "")
        note = f"; {suppressed} similar warnings suppressed" if suppressed else ""
        log.warning("ignoring unknown %s field(s): %s (logged once per field%s)", schema,
                    listed, note)

    def _admit_line(self) -> int:
        """-1 when the rate limit drops this line, else how many were dropped before it."""
        now = self._clock()
        if now - self._window_start >= self.window_s:
            self._window_start, self._lines_in_window = now, 0
        if self._lines_in_window >= self.lines_per_window:
            self._suppressed_in_window += 1
            self._suppressed_total += 1
            return -1
        self._lines_in_window += 1
        suppressed, self._suppressed_in_window = self._suppressed_in_window, 0
        return suppressed

    def counts(self) -> UnknownFieldCounts:
        with self._lock:
            return UnknownFieldCounts(self._total, len(self._seen), self._untracked,
                                      self._suppressed_total)
