"""MemoryBudget: one cap on the write memory of every bucket a process hosts.

Why: each bucket has its own row buffer (`table.kv.buffer-size`, 64 MiB by default) and its own
RocksDB with its own memtables, so a tablet server's memory would grow with the number of
buckets it hosts. A budget shared by all of them bounds the total instead: half of it caps
RocksDB's memtables (a MemtableCap, which storage configures each bucket's RocksDB with), the
other half caps the row buffers: after a write, while their sum is over the cap, the bucket
with the largest buffer writes it to RocksDB. Each bucket's own limit still applies within the
budget. Flushing a buffer never loses anything (the changelog is the write-ahead log), so the
cap costs only speed: more, smaller RocksDB writes.
"""

from __future__ import annotations

import threading
from typing import Protocol

from merge_engine.kv.memtables import MemtableCap


class BufferedBucket(Protocol):
    """What the budget needs of a bucket: its row buffer's size and a way to empty it. A
    protocol, so the budget does not import the tablet that joins it."""

    @property
    def buffered_bytes(self) -> int: ...

    def flush_if_open(self) -> None:
        """Write the buffer to disk; nothing (and no error) when the bucket cannot."""


class MemoryBudget:
    """The write memory shared by the buckets opened with it (see the module docstring)."""

    def __init__(self, total_bytes: int):
        if not isinstance(total_bytes, int) or total_bytes <= 0:
            raise ValueError(f"A memory budget must be a positive number of bytes, got {total_bytes!r}")
        self.total_bytes = total_bytes
        self.row_buffer_bytes = total_bytes // 2
        self.memtables = MemtableCap(total_bytes - self.row_buffer_bytes)
        self._tablets: dict[int, BufferedBucket] = {}
        self._lock = threading.Lock()

    @property
    def memtable_bytes(self) -> int:
        """What the memtables of every bucket hold now."""
        return self.memtables.used_bytes

    @property
    def buffered_bytes(self) -> int:
        """What the row buffers of every bucket hold now."""
        return sum(tablet.buffered_bytes for tablet in self._members())

    def join(self, tablet: BufferedBucket) -> None:
        with self._lock:
            self._tablets[id(tablet)] = tablet

    def leave(self, tablet: BufferedBucket) -> None:
        with self._lock:
            self._tablets.pop(id(tablet), None)

    def _members(self) -> list[BufferedBucket]:
        with self._lock:
            return list(self._tablets.values())

    def after_write(self) -> None:
        """Flush the largest row buffers until their sum fits the budget. Called by a bucket
        after a write, holding none of its locks: flushing another bucket waits for that
        bucket's write in progress, and no bucket waits for another while holding its own.
        A bucket whose buffer does not shrink (its disk refuses writes) is passed over: its
        rows stay safe in its changelog, and the other buckets still fit the rest."""
        stuck: set[int] = set()
        while True:
            sizes = [(tablet.buffered_bytes, tablet) for tablet in self._members()
                     if id(tablet) not in stuck]
            if sum(size for size, _ in sizes) <= self.row_buffer_bytes:
                return
            largest, tablet = max(sizes, key=lambda pair: pair[0])
            if largest == 0:
                return
            tablet.flush_if_open()
            if tablet.buffered_bytes >= largest:
                stuck.add(id(tablet))

    def __repr__(self) -> str:
        return (f"MemoryBudget({self.total_bytes} bytes: row buffers {self.buffered_bytes}, "
                f"memtables {self.memtable_bytes})")
