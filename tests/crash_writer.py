"""A process that writes to a KvTablet until it is killed: the subject of the kill -9 tests.

Run as `python -m tests.crash_writer PATH SEED START_SEQ [PAUSE [BUFFER_SIZE]]`. Write number
`seq` is a pure function of (SEED, seq), so the parent test can regenerate every write and
recompute the table in plain Python. Each write carries `writer=(WRITER_ID, seq)`; a restarted writer starts again at the
first unacknowledged seq, so a write that was applied but not acknowledged before the kill is
re-sent and must then be a no-op (idempotent writer). BUFFER_SIZE sets `table.kv.buffer-size`
('default' or absent: the 64 MiB default, so rows reach RocksDB only when the tablet is reopened;
a small size such as '8kb' flushes the row buffer every few writes, so kills land in flushes too;
'8kb+persisted' also flushes RocksDB's memtables to table files that often).

Protocol on stdout, one flushed line per event:
  ready <log_end_offset>          the tablet is open
  begin <seq> <kind> <rows>       a write is about to be sent
  applied <seq> <offset>          (with PAUSE only) the write returned; PAUSE seconds pass before
                                  its ack, a window in which a kill leaves it applied but unacked
  ack <seq> <offset> <seconds>    that write returned (it is acknowledged) after <seconds>
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass

import pyarrow as pa

WRITER_ID = "crash-writer"
KEYS = 40  # few keys, so writes keep hitting the same rows and deletes find something
VALUE_COLUMNS = ("qty", "price", "tag", "status")
COLUMNS = ("id",) + VALUE_COLUMNS
ARROW_TYPES = {"id": pa.int64(), "qty": pa.int64(), "price": pa.float64(), "tag": pa.string(),
               "status": pa.string()}
PARTIAL_TARGETS = (("id", "qty", "tag"), ("id", "status"), ("id", "price", "status"), ("id", "qty"))
DELETE_TARGETS = (("id", "tag"), ("id", "qty", "price"), ("id", "status"))
BIG_ROWS = 4000  # large enough that a kill often lands inside put()
# A buffer size ending in this: RocksDB's memtables are flushed to table files with every four
# buffers' worth of changelog, so rows the writer flushed outlive its kill (without it, flushed
# rows wait in the memtables, without RocksDB's write-ahead log, and die with the process).
PERSISTED = "+persisted"


def descriptor(buffer_size: str | None = None):
    """The crash table; `buffer_size` sets `table.kv.buffer-size` (runtime only: a tablet may be
    reopened with any size)."""
    from merge_engine import TableDescriptor
    from tally.bench.workload import table_schema

    schema = table_schema()  # the ingest bench's table: crashes are tried on what is measured
    properties = {"table.merge-engine": "aggregation", "table.delete.behavior": "allow"}
    if buffer_size is not None:
        properties["table.kv.buffer-size"] = buffer_size
    return TableDescriptor(schema, properties=properties)


@dataclass
class Write:
    """One put or delete: `rows` are dicts holding exactly the `columns` it sends."""

    kind: str  # put | partial_put | delete | partial_delete
    rows: list[dict]
    columns: tuple[str, ...]
    target_columns: list[str] | None
    as_arrow: bool

    @property
    def is_delete(self) -> bool:
        return self.kind.endswith("delete")


def _value(rnd: random.Random, column: str, big: bool):
    if column == "qty":
        return None if rnd.random() < 0.1 else rnd.randint(-50, 100)
    if column == "price":
        return None if rnd.random() < 0.2 else round(rnd.random() * 100, 2)
    if column == "tag":
        # rare and absent from big writes: string_agg grows without bound otherwise
        return None if big or rnd.random() < 0.8 else f"x{rnd.randint(0, 9)}"
    return None if rnd.random() < 0.3 else rnd.choice(["new", "paid", "sent", "done"])


def make_write(seed: int, seq: int) -> Write:
    rnd = random.Random(seed * 1_000_003 + seq)
    pick = rnd.random()
    if pick < 0.30:
        keys = sorted({rnd.randrange(KEYS) for _ in range(rnd.randint(1, 3))})
        if pick < 0.15:
            return Write("delete", [{"id": k} for k in keys], ("id",), None, False)
        targets = rnd.choice(DELETE_TARGETS)
        return Write("partial_delete", [{"id": k} for k in keys], ("id",), list(targets), False)
    partial = pick < 0.50
    columns = rnd.choice(PARTIAL_TARGETS) if partial else COLUMNS
    big = rnd.random() < 0.12
    count = BIG_ROWS if big else rnd.randint(1, 25)
    rows = []
    for _ in range(count):
        row = {"id": rnd.randrange(KEYS)}
        row.update({c: _value(rnd, c, big) for c in columns[1:]})
        rows.append(row)
    kind = "partial_put" if partial else "put"
    return Write(kind, rows, columns, list(columns) if partial else None, as_arrow=big or rnd.random() < 0.5)


def send(tablet, write: Write, seq: int) -> int:
    """Apply `write` as writer (WRITER_ID, seq); return the offset the tablet answered."""
    rows = write.rows
    if write.as_arrow:
        rows = pa.Table.from_pylist(rows, schema=pa.schema([(c, ARROW_TYPES[c]) for c in write.columns]))
    writer = (WRITER_ID, seq)
    if write.is_delete:
        return tablet.delete(rows, target_columns=write.target_columns, writer=writer)
    return tablet.put(rows, target_columns=write.target_columns, writer=writer)


def main(argv: list[str]) -> None:
    from merge_engine.kv.tablet import KvTablet

    path, seed, seq = argv[0], int(argv[1]), int(argv[2])
    pause = float(argv[3]) if len(argv) > 3 else 0.0
    buffer_size = argv[4] if len(argv) > 4 and argv[4] != "default" else None
    persisted = buffer_size is not None and buffer_size.endswith(PERSISTED)
    if persisted:
        buffer_size = buffer_size[:-len(PERSISTED)]
    tablet = KvTablet.open(path, descriptor(buffer_size))
    if persisted:
        tablet._rows.persist_from = 0
    print(f"ready {tablet.log_end_offset}", flush=True)
    while True:  # until the parent kills us
        write = make_write(seed, seq)
        print(f"begin {seq} {write.kind} {len(write.rows)}", flush=True)
        started = time.perf_counter()
        offset = send(tablet, write, seq)
        took = time.perf_counter() - started
        if pause:
            print(f"applied {seq} {offset}", flush=True)
            time.sleep(pause)
        print(f"ack {seq} {offset} {took:.6f}", flush=True)
        seq += 1


if __name__ == "__main__":
    main(sys.argv[1:])
