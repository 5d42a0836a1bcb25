"""Failure hooks that run inside a bucket's write (named by TallySink(fail_hook=...) or the data
source option `fail-hook`).

A hook is called as hook(plan, epoch, attempt_number, bucket) after the per-bucket step
(sink.task.write_bucket) has written and flushed half of the bucket's folded rows: in a Spark
write task for TallySink, in the commit process for the data source (attempt_number 0, buckets
in order).
"""

from __future__ import annotations

import json
import os
import signal

KILL_FILE = "TALLY_TEST_KILL_FILE"


class InjectedTaskFailure(RuntimeError):
    """The first attempt of a task fails after half of its writes."""


def fail_first_attempt(plan, epoch, attempt_number: int, bucket: int) -> None:
    if attempt_number == 0:
        raise InjectedTaskFailure(f"injected failure in epoch {epoch.epoch}, attempt 0")


def fail_always(plan, epoch, attempt_number: int, bucket: int) -> None:
    raise InjectedTaskFailure(f"injected failure in epoch {epoch.epoch}, every attempt")


def fail_after_first_bucket(plan, epoch, attempt_number: int, bucket: int) -> None:
    """Fail once bucket 0 is written in full and this bucket half (data source commits)."""
    if bucket >= 1:
        raise InjectedTaskFailure(f"injected failure in epoch {epoch.epoch}, bucket {bucket}")


def crash_after_first_bucket(plan, epoch, attempt_number: int, bucket: int) -> None:
    """The process dies (no rollback can run) once bucket 0 is written in full and this
    bucket half: a data source commit process that crashes."""
    if bucket >= 1:
        os._exit(137)


def kill_job(plan, epoch, attempt_number: int, bucket: int) -> None:
    """SIGKILL the whole streaming job (driver and JVM) from inside a bucket's write when this
    epoch is the one chosen by the test (the kill file names it, and optionally the lowest
    bucket to kill in, "bucket")."""
    path = os.environ.get(KILL_FILE)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        spec = json.load(f)
    if spec.get("point") != "task" or spec.get("epoch") != epoch.epoch or "pids" not in spec:
        return
    if bucket < spec.get("bucket", 0):
        return
    for pid in spec["pids"]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(137)


def kill_tablet_server(plan, epoch, attempt_number: int, bucket: int) -> None:
    """SIGKILL a tablet server (the kill file's "server_pid") from inside a bucket's write of
    the chosen epoch, once: the job itself goes on, and its writes must find the new leaders."""
    path = os.environ.get(KILL_FILE)
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        spec = json.load(f)
    if spec.get("point") != "server" or spec.get("epoch") != epoch.epoch:
        return
    try:
        os.mkdir(path + ".done")  # one task kills; the others go on writing
    except FileExistsError:
        return
    try:
        os.kill(spec["server_pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass


# The environment variable naming the first bucket `fail_from_bucket` fails in.
FAIL_BUCKET = "TALLY_TEST_FAIL_BUCKET"


def fail_from_bucket(plan, epoch, attempt_number: int, bucket: int) -> None:
    """Fail in every bucket from the one $TALLY_TEST_FAIL_BUCKET names, after half its rows:
    a driver delivery's write that fails part-way (other buckets, written at the same time,
    may be written in full)."""
    if bucket >= int(os.environ.get(FAIL_BUCKET, "0")):
        raise InjectedTaskFailure(f"injected failure in epoch {epoch.epoch}, bucket {bucket}")
