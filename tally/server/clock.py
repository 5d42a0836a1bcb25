"""The clock lock expiry is judged by, which tests can move forward for every process at once.

Lock expiry is judged on the coordinator (renew, take over, retention) and on every tablet
server (the write check). A test that expires a lock must move all those clocks together and
without sleeping, so a server started with `--lock-clock-file PATH` reads its time as the wall
clock plus the number of seconds written in that file (`SkewedClock.advance` writes it). The
file is re-read only when it changes.
"""

from __future__ import annotations

import os
import time
from typing import Callable

Clock = Callable[[], float]


class SkewedClock:
    """time.time() plus the offset stored in `path` (0 while the file is missing)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple | None = None
        self._offset = 0.0

    def __call__(self) -> float:
        try:
            info = os.stat(self.path)
            stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        except FileNotFoundError:
            stamp = None
        if stamp != self._stamp:
            self._offset = self._read() if stamp is not None else 0.0
            self._stamp = stamp
        return time.time() + self._offset

    def _read(self) -> float:
        try:
            with open(self.path) as f:
                return float(f.read().strip() or 0.0)
        except (OSError, ValueError):
            return self._offset

    def advance(self, seconds: float) -> None:
        """Move every process reading this file `seconds` ahead (atomically replaced, so a
        reader never sees half a number)."""
        offset = self._read() if os.path.exists(self.path) else 0.0
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(repr(offset + seconds))
        os.replace(tmp, self.path)


def lock_clock(path: str | None) -> Clock:
    return time.time if not path else SkewedClock(path)
