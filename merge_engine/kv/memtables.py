"""MemtableCap: one cap on the RocksDB memtables of every bucket opened with it.

Each bucket has its own RocksDB with its own memtables, so without a shared cap their memory
grows with the number of buckets a process hosts. One WriteBufferManager shared by all of them
makes RocksDB flush a memtable when the sum nears the cap. Kept apart from the row-buffer
policy (MemoryBudget) so that storage, which only configures RocksDB, depends on this alone.
"""

from __future__ import annotations

from rocksdict import Options, WriteBufferManager


class MemtableCap:
    """The memtable bytes shared by the buckets whose RocksDB options it configured."""

    def __init__(self, cap_bytes: int):
        self.cap_bytes = cap_bytes
        self._manager = WriteBufferManager(cap_bytes, False)

    def configure(self, options: Options) -> None:
        """Count a bucket's RocksDB memtables against the cap."""
        options.set_write_buffer_manager(self._manager)

    @property
    def used_bytes(self) -> int:
        """What the memtables of every bucket hold now."""
        return self._manager.get_usage()
