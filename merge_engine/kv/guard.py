"""What every part of a bucket shares to stay consistent: its lock, whether it is closed, and
where its changelog starts and ends."""

from __future__ import annotations

import threading

from tally.errors import StorageError


class BucketGuard:
    """The bucket's one lock and its open state. Writes are serialised under the lock; reads
    take it only to pin what they read; nothing runs on a closed bucket."""

    def __init__(self, name: str):
        self.name = name  # what errors call the bucket
        self.lock = threading.RLock()
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise StorageError(f"{self.name} is closed")


class LogOffsets:
    """The bucket's changelog range [start, end): `end` is the offset the next record gets,
    `start` the lowest one still served (0 until the log is truncated). Changed only under the
    bucket's lock, by the commit of a write, a truncation or the cut of a tail."""

    def __init__(self, start: int, end: int):
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"[{self.start}, {self.end})"
