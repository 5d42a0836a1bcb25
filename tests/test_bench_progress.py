"""The benchmarks' progress: a rich bar on a terminal, start and outcome lines in a log."""

from __future__ import annotations

import io

from tally.bench.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_one_line_per_start_and_outcome():
    log = io.StringIO()
    progress = Progress(2, log)
    progress.step("ingest")
    progress.rows(500, 1000)
    progress.done("1,000 rows/s")
    progress.note("a note")
    lines = log.getvalue().splitlines()
    assert lines[0] == "[1/2] ingest ..." and lines[2] == "a note"
    assert lines[1].startswith("    1,000 rows/s (") and lines[1].endswith(" s)")
    assert len(lines) == 3


def test_a_terminal_gets_a_bar_that_leaves_the_outcome_line():
    terminal = Terminal()
    progress = Progress(2, terminal)
    progress.step("ingest")
    for done in range(0, 1001, 100):
        progress.rows(done, 1000)
    progress.done("1,000 rows/s")
    progress.step("verify")
    progress.done("ok")
    text = terminal.getvalue()
    assert "[1/2] ingest: 1,000 rows/s (" in text and "[2/2] verify: ok (" in text
    assert "\x1b[" in text  # drawn in place with terminal control codes, not a line per update
