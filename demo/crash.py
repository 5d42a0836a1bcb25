"""The demo's crash: kill the whole streaming job (driver and JVM) from inside a write task of
the chosen micro-batch, after the task has written half of its rows (a TallySink fail hook)."""

from __future__ import annotations

import os
import signal

CRASH_EPOCH = "TALLY_DEMO_CRASH_EPOCH"
JOB_PIDS = "TALLY_DEMO_JOB_PIDS"


def kill_in_epoch(plan, epoch, attempt_number: int) -> None:
    wanted = os.environ.get(CRASH_EPOCH)
    if wanted is None or int(wanted) != epoch.epoch:
        return
    pids_file = os.environ.get(JOB_PIDS)
    if pids_file and os.path.exists(pids_file):
        with open(pids_file) as f:
            for pid in f.read().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    os._exit(137)
