"""Run one bench job in a fresh Python process and collect its result and peak RSS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from tally.errors import TallyError

# the directory holding the bench/ package, so children import this same tree
SOURCE_ROOT = str(Path(__file__).resolve().parent.parent)


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SOURCE_ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_job(job: str, args: dict, on_progress: Callable[[int], None] | None = None) -> dict:
    """Run `python -m tally.bench.worker job args`; return its result dict.

    Raises TallyError with the tail of the child's stderr when it fails.
    """
    with tempfile.TemporaryFile(mode="w+") as errors:
        child = subprocess.Popen(
            [sys.executable, "-m", "tally.bench.worker", job, json.dumps(args)],
            stdout=subprocess.PIPE,
            stderr=errors,  # a file, not a pipe: a chatty child cannot block on a full pipe
            text=True,
            env=child_env(),
        )
        result = None
        for line in child.stdout:
            kind, _, payload = line.rstrip("\n").partition(" ")
            if kind == "progress" and on_progress:
                on_progress(int(payload))
            elif kind == "result":
                result = json.loads(payload)
        code = child.wait()
        if code != 0 or result is None:
            errors.seek(0)
            tail = "".join(errors.readlines()[-25:])
            raise TallyError(f"bench job {job!r} failed (exit code {code}):\n{tail}")
        return result
