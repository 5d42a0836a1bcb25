"""ReplicatedEntry: one stored changelog entry as a leader ships it to its followers.

A follower appends the leader's entries verbatim (the same first offsets, serialized batches
and written times), so its changelog, retention and readers see what the leader's do; the
writer beside an entry is the idempotent writer whose write ends with it, which lets the
follower's writer states equal the leader's. Entries travel as one Arrow table (one row per
entry), so a fetch answer is a single Arrow IPC stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from tally.errors import InvalidInputError

ARROW_SCHEMA = pa.schema([
    pa.field("first_offset", pa.int64(), nullable=False),
    pa.field("end_offset", pa.int64(), nullable=False),
    pa.field("written_ms", pa.int64(), nullable=False),
    pa.field("data", pa.large_binary(), nullable=False),
    pa.field("writer_id", pa.string()),
    pa.field("writer_sequence", pa.int64()),
])


@dataclass(frozen=True)
class ReplicatedEntry:
    """The changelog records [first_offset, end_offset) as the leader stored them."""

    first_offset: int
    end_offset: int
    data: bytes  # the stored Arrow IPC stream of the records, unchanged
    written_ms: int  # when the leader wrote it (retention by age counts from it)
    writer: tuple[str, int] | None = None  # (writer id, sequence) of the write it ends

    def __repr__(self) -> str:  # the data is binary and may be megabytes
        return (f"ReplicatedEntry([{self.first_offset}, {self.end_offset}), "
                f"{len(self.data)} bytes, written_ms={self.written_ms}, writer={self.writer})")

    @staticmethod
    def to_arrow(entries: list["ReplicatedEntry"]) -> pa.Table:
        """The entries as one table of ARROW_SCHEMA, one row each, in order."""
        return pa.Table.from_arrays([
            pa.array([e.first_offset for e in entries], pa.int64()),
            pa.array([e.end_offset for e in entries], pa.int64()),
            pa.array([e.written_ms for e in entries], pa.int64()),
            pa.array([e.data for e in entries], pa.large_binary()),
            pa.array([None if e.writer is None else e.writer[0] for e in entries], pa.string()),
            pa.array([None if e.writer is None else e.writer[1] for e in entries], pa.int64()),
        ], schema=ARROW_SCHEMA)

    @staticmethod
    def from_arrow(table: pa.Table) -> list["ReplicatedEntry"]:
        """The entries of a table made by to_arrow (its data column binary or large_binary)."""
        missing = [name for name in ARROW_SCHEMA.names if name not in table.column_names]
        if missing:
            raise InvalidInputError(f"replicated entries lack the column(s) {missing}")
        columns = {name: table.column(name).to_pylist() for name in ARROW_SCHEMA.names}
        entries = []
        for first, end, written, data, writer_id, sequence in zip(
                *(columns[name] for name in ARROW_SCHEMA.names)):
            if (writer_id is None) != (sequence is None):
                raise InvalidInputError(
                    f"replicated entry at offset {first} has a writer id without a sequence "
                    f"or a sequence without a writer id")
            writer = None if writer_id is None else (writer_id, sequence)
            entries.append(ReplicatedEntry(first, end, data, written, writer))
        return entries
