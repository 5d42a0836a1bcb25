"""A digest of one bucket copy: what it holds, so copies can be compared without moving them.

`replica_digest` (cluster credential) answers, for any copy this server holds, leader or
follower: its log start and end, a hash of its rows (hidden state included), a hash of its
changelog from a given offset, its leader epochs, and whether its rows equal the replay of its
changelog (when the log still starts at 0). Two copies at the same log end hold the same bucket
exactly when their hashes agree; an operator or a test asks every copy and compares.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

from merge_engine.table.change_types import DELETE, INSERT, UPDATE_AFTER
from merge_engine.table.hidden_columns import CHANGE_TYPE, OFFSET, UNWRITTEN
from tally.wire.messages import field, table_to_ipc


def _rows_of(table: pa.Table, key: list[str], columns: list[str]) -> dict:
    out = {}
    for row in table.select(columns).to_pylist():
        out[tuple(row[k] for k in key)] = row
    return out


def bucket_digest(tablet, start: int) -> dict:
    """The digest of `tablet` (called under its bucket's lock: nothing moves meanwhile)."""
    key = list(tablet.schema.primary_key)
    snapshot = tablet.snapshot()
    try:
        batches = list(snapshot.batches(None, 65536, True))
    finally:
        snapshot.release()
    columns = list(tablet.schema.names) + [UNWRITTEN]
    rows = _rows_of(pa.Table.from_batches(batches) if batches else
                    pa.table({c: pa.array([]) for c in columns}), key, columns)
    records = tablet.changelog(max(start, tablet.log_start_offset))
    replay_equal = None
    if tablet.log_start_offset == 0:
        full = records if start <= 0 else tablet.changelog(0)
        replayed: dict = {}
        images = full.select([OFFSET, CHANGE_TYPE] + columns).to_pylist()
        for record in images:
            change = record.pop(CHANGE_TYPE)
            record.pop(OFFSET)
            k = tuple(record[c] for c in key)
            if change in (INSERT, UPDATE_AFTER):
                replayed[k] = record
            elif change == DELETE:
                replayed.pop(k, None)
        replay_equal = replayed == rows
    ordered = [rows[k] for k in sorted(rows, key=repr)]
    return {"log_start": tablet.log_start_offset, "log_end": tablet.log_end_offset,
            "rows": hashlib.sha256(repr(ordered).encode()).hexdigest(),
            "row_count": len(rows),
            "changelog": hashlib.sha256(table_to_ipc(records)).hexdigest(),
            "leader_epochs": [list(e) for e in tablet.leader_epochs],
            "replay_equal": replay_equal}


class ReplicaDigest:
    """Added to a TabletServer; adds the `replica_digest` action."""

    def __init__(self, server) -> None:
        self.server = server
        server.actions["replica_digest"] = self.digest

    def digest(self, body: dict) -> dict:
        hosted = self.server.tablet(field(body, "table_id", int),
                                    field(body, "partition_id", int), field(body, "bucket", int))
        with hosted.lock:
            return bucket_digest(hosted.tablet, field(body, "start", int, 0))
