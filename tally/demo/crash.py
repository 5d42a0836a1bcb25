"""The demo's crash: kill the whole streaming job (driver and JVM) from inside a write task of
the chosen micro-batch, after the task has written half of its rows (a TallySink fail hook).

Then the demo makes sure the crash is complete before it restarts the job: every process of the
killed job (driver, JVM, PySpark daemon and workers; they all inherit `TALLY_DEMO_JOB` in their
environment) is gone, so nothing of the first run can still be running when the second starts.
"""

from __future__ import annotations

import os
import signal
import time

CRASH_EPOCH = "TALLY_DEMO_CRASH_EPOCH"
JOB_PIDS = "TALLY_DEMO_JOB_PIDS"
JOB_MARKER = "TALLY_DEMO_JOB"


def kill_in_epoch(plan, epoch, attempt_number: int, bucket: int) -> None:
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


def job_processes(marker: str) -> list[int]:
    """Pids of the live processes whose environment holds TALLY_DEMO_JOB=`marker` (read from
    /proc; an empty list where there is no /proc)."""
    needle = f"{JOB_MARKER}={marker}".encode()
    pids = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environment = f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours
            continue
        if needle in environment:
            pids.append(int(entry))
    return pids


def command_of(pid: int) -> str:
    """A short name for a process: its command line's module or program."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return str(pid)
    if "-m" in argv[:-1]:
        return argv[argv.index("-m") + 1]
    return os.path.basename(argv[0]) if argv else str(pid)


def end_job_processes(marker: str, deadline_s: float = 300.0) -> list[str]:
    """SIGKILL whatever is left of the job tagged `marker` and wait until none of it runs;
    the processes that were left (short names). Raises if they outlive `deadline_s`."""
    left = job_processes(marker)
    names = [command_of(pid) for pid in left]
    until = time.monotonic() + deadline_s
    survivors = left
    while survivors:
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() > until:
            raise RuntimeError(f"processes {survivors} of the demo's job survive SIGKILL")
        time.sleep(0.1)
        survivors = job_processes(marker)
    return names
