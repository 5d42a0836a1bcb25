"""The end-to-end demo behind `tally demo` (and `make demo`).

Until the Spark sink lands this only describes the run; the steps below are the plan the real
demo follows, so the command, its output shape and its exit code are already stable.
"""

from __future__ import annotations

STEPS = [
    "start a single-node Tally cluster (coordinator + one tablet server) in a temporary directory",
    "create an aggregation table: id BIGINT key, qty SUM, price MAX, tag STRING_AGG, status LAST_VALUE_IGNORE_NULLS",
    "run a Spark Structured Streaming job that aggregates a generated event stream into the table",
    "kill the job with SIGKILL in the middle of a micro-batch (some of its writes already applied)",
    "restart the job from its checkpoint",
    "show the undo: the half-written batch's changes rolled back from the changelog (OVERWRITE mode)",
    "let the job replay the batch and finish the stream",
    "verify exactly-once: every key equals a plain-Python aggregation of the whole input",
]


def run() -> int:
    print("tally demo: not runnable yet; it arrives with the Spark sink. Once it lands, it will:")
    for number, step in enumerate(STEPS, 1):
        print(f"  {number}. {step}")
    print("Until then: `make test` runs the engine's tests, `tally bench` its benchmark.")
    return 0
