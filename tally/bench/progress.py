"""Progress lines for long benchmark runs.

On a terminal the current step's row count is updated in place; in a log (CI, a pipe) only the
start and the outcome of each step are printed, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total_steps: int, stream: TextIO | None = sys.stdout):
        self.total = total_steps
        self.stream = stream
        self.index = 0
        self.label = ""
        self.started = 0.0
        self.live = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._last_draw = 0.0

    def _write(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text)
            self.stream.flush()

    def step(self, label: str) -> None:
        self.index += 1
        self.label = f"[{self.index}/{self.total}] {label}"
        self.started = time.perf_counter()
        self._write(self.label + " ..." + ("" if self.live else "\n"))

    def rows(self, done: int, total: int) -> None:
        if not self.live:
            return
        now = time.perf_counter()
        if now - self._last_draw < 0.2 and done < total:
            return  # redraw at most five times a second
        self._last_draw = now
        self._write(f"\r{self.label} ... {done:,}/{total:,} rows")

    def done(self, summary: str) -> None:
        seconds = time.perf_counter() - self.started
        prefix = "\r\033[K" + self.label + ":" if self.live else "   "
        self._write(f"{prefix} {summary} ({seconds:.1f} s)\n")

    def note(self, text: str) -> None:
        self._write(text + "\n")
