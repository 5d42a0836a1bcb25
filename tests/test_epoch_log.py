"""One line per epoch on `tally.sink`, shown without any logging setup, and only once after."""

from __future__ import annotations

import subprocess
import sys

from sink.epoch_log import epoch_line
from sink.protocol import EpochResult

PROGRAM = r"""
import logging, sys
from sink.epoch_log import log, show_by_default
show_by_default()
show_by_default()                      # a second run adds no second handler
log.info("first")
logging.basicConfig(stream=sys.stdout, format="%(name)s %(message)s")
log.info("second")
logging.getLogger("tally.sink").setLevel(logging.WARNING)
log.info("third")
"""


def test_shown_on_stderr_until_the_application_configures_logging():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stderr.count("tally.sink: first") == 1
    assert "second" not in done.stderr
    assert done.stdout.splitlines() == ["tally.sink second"]


def test_the_line_names_table_epoch_rows_keys_undone_and_seconds():
    result = EpochResult(3, False, rows=1204, keys=311, undone=5, retried_tasks=0,
                         seconds=0.8412)
    assert epoch_line("shop.totals", "micro-batch 3 of query q", result) == (
        "shop.totals epoch 3 (micro-batch 3 of query q): 1204 rows, 311 keys, 5 undone, 0.84s")
    result.retried_tasks = 2
    assert epoch_line("t.t", "x", result).endswith(", 2 task(s) retried")
