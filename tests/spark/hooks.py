"""Failure hooks that run inside Spark write tasks (named by TallySink(fail_hook=...)).

A hook is called after a task has written (and flushed) half of its folded rows.
"""

from __future__ import annotations

import json
import os
import signal

KILL_FILE = "TALLY_TEST_KILL_FILE"


class InjectedTaskFailure(RuntimeError):
    """The first attempt of a task fails after half of its writes."""


def fail_first_attempt(plan, epoch, attempt_number: int) -> None:
    if attempt_number == 0:
        raise InjectedTaskFailure(f"injected failure in epoch {epoch.epoch}, attempt 0")


def kill_job(plan, epoch, attempt_number: int) -> None:
    """SIGKILL the whole streaming job (driver and JVM) from inside a task when this epoch is
    the one chosen by the test (the kill file names it)."""
    path = os.environ.get(KILL_FILE)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        spec = json.load(f)
    if spec.get("point") != "task" or spec.get("epoch") != epoch.epoch or "pids" not in spec:
        return
    for pid in spec["pids"]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(137)


def fail_always(plan, epoch, attempt_number: int) -> None:
    raise InjectedTaskFailure(f"injected failure in epoch {epoch.epoch}, every attempt")
