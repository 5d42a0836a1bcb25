"""One log line per epoch (a micro-batch or a batch write), shown without any logging setup.

Every writer (TallySink and `format("tally")`, streaming and batch) reports each epoch it
commits at INFO on the `tally.sink` logger: table, epoch, what it was, rows, keys, rows undone
and seconds. An application that configured no logging would see none of it (Python drops INFO
records that reach no handler), so the logger gets a stderr handler of its own, which stays
silent once the application gives the root logger a handler (the records then go there, as
any library's do). `logging.getLogger("tally.sink").setLevel(logging.WARNING)` quiets it.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("tally.sink")

FORMAT = "%(asctime)s %(name)s: %(message)s"


class _UntilConfigured(logging.StreamHandler):
    """stderr while the root logger has no handler; silent after, so nothing prints twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        super().emit(record)


def show_by_default() -> None:
    """INFO on `tally.sink` unless its level was set, and the stderr handler once."""
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)
    if not any(isinstance(h, _UntilConfigured) for h in log.handlers):
        handler = _UntilConfigured(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        log.addHandler(handler)


def epoch_line(table: str, label: str, result) -> str:
    """`<table> epoch <n> (<label>): <rows> rows, <keys> keys, <undone> undone, <seconds>`."""
    line = (f"{table} epoch {result.epoch} ({label}): {result.rows} rows, {result.keys} keys, "
            f"{result.undone} undone, {result.seconds:.2f}s")
    if result.retried_tasks:
        line += f", {result.retried_tasks} task(s) retried"
    return line
