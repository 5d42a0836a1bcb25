"""Progress of long benchmark runs, drawn like every other `tally` command's progress.

On a terminal the current step is a rich progress bar (rows done of the step's rows, rate,
elapsed time) that leaves one line with the step's outcome when it ends; in a log (CI, a pipe)
only the start and the outcome of each step are printed, so logs stay short.
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
        self._bar = None   # the live step's rich Progress
        self._task = None

    def _write(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text)
            self.stream.flush()

    def step(self, label: str) -> None:
        self._close_bar()
        self.index += 1
        self.label = f"[{self.index}/{self.total}] {label}"
        self.started = time.perf_counter()
        if not self.live:
            self._write(self.label + " ...\n")
            return
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as Bar,
                                   SpinnerColumn, TextColumn, TimeElapsedColumn)

        self._bar = Bar(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                        MofNCompleteColumn(), TextColumn("rows"), TimeElapsedColumn(),
                        console=Console(file=self.stream), transient=True)
        self._bar.start()
        self._task = self._bar.add_task(self.label, total=None)

    def rows(self, done: int, total: int) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)

    def done(self, summary: str) -> None:
        self._close_bar()
        seconds = time.perf_counter() - self.started
        prefix = self.label + ":" if self.live else "   "
        self._write(f"{prefix} {summary} ({seconds:.1f} s)\n")

    def note(self, text: str) -> None:
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            self._write(text + "\n")

    def _close_bar(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar, self._task = None, None
