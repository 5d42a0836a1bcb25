"""Which allocator Arrow uses in a process that hosts buckets.

Why: a put allocates and frees tens of megabytes of Arrow buffers (taken rows, merged columns,
the changelog batch). With pyarrow's default mimalloc pool those pages are faulted in afresh on
every put; glibc's allocator keeps them, and puts run 10-15% faster (tally.bench.ingest, measured
with ARROW_DEFAULT_MEMORY_POOL=mimalloc against =system). So the first KvTablet a process opens
switches Arrow's default pool to the system allocator, unless the user chose a pool with the
ARROW_DEFAULT_MEMORY_POOL environment variable (which is then respected as is). Buffers keep
the pool they came from, so switching while arrays are alive is safe.
"""

from __future__ import annotations

import os
import threading

import pyarrow as pa

_chosen = False
_lock = threading.Lock()


def use_bucket_allocator() -> None:
    """Make the system allocator Arrow's default pool, once per process (see above)."""
    global _chosen
    with _lock:
        if _chosen:
            return
        _chosen = True
        if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
            pa.set_memory_pool(pa.system_memory_pool())
