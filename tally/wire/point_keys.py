"""One key of a point lookup: checked, bucketed and framed on the client; checked on the server.

A point lookup is one small request, so per-request costs decide its latency: the key skips the
write-input validation (only the primary-key columns are looked at) and travels as the bytes the
client hashed to find its bucket (tally.wire.key_bytes), or, for a key with a boolean or
floating column, as an Arrow IPC stream assembled from the key schema's message, serialized
once per table, and the key's one record batch (the bytes are those an IPC stream writer
makes, without making one). The server checks an Arrow key exactly as strictly as before: the
primary-key columns and nothing else, each castable without loss to its column's type, none
null, and the key in the addressed partition and bucket (canonical bytes: tally.wire.key_bytes).
Every refusal is an InvalidInputError naming the column.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from tally.errors import InvalidInputError
from tally.wire import key_bytes
from tally.wire.bucket_hash import bucket_ids, fnv_fmix
from tally.wire.lookup_answer import LOOKUP_VERSION, LookupAnswers
from tally.wire.messages import dumps
from tally.wire.routing import TableRouting, partition_names

# The end-of-stream marker of the Arrow IPC stream format (a continuation token, length 0).
IPC_END = b"\xff\xff\xff\xff\x00\x00\x00\x00"
# A lookup whose key travels as canonical bytes (tally.wire.key_bytes) starts with this head,
# not with JSON (whose text never starts with a NUL byte): a marker, the lookup wire version
# (one byte), then the table id, the partition id and the bucket as little-endian int64s; the
# key's bytes follow. Any other lookup is the JSON header (holding VERSION_FIELD), '\n', and the
# key as an Arrow IPC stream.
CANONICAL_MARK = b"\x00TLV"
CANONICAL_HEAD = struct.Struct("<4sBqqq")
VERSION_FIELD = "lookup_version"


def ipc_of_batch(schema_message: bytes, batch: pa.RecordBatch) -> bytes:
    """An Arrow IPC stream of `batch` alone, `schema_message` being `schema.serialize()` of its
    schema (made once by the caller): byte for byte what an IPC stream writer produces."""
    return schema_message + batch.serialize().to_pybytes() + IPC_END


class PointKeys:
    """The point-lookup keys of one table (one routing): a client's key encoder."""

    def __init__(self, routing: TableRouting) -> None:
        self.routing = routing
        self.names = list(routing.primary_key)
        self.schema = pa.schema([routing.arrow_schema.field(c).with_nullable(False)
                                 for c in self.names])
        self._integer = [pa.types.is_integer(f.type) for f in self.schema]
        self._schema_message = self.schema.serialize().to_pybytes()
        self.answers = LookupAnswers(routing.arrow_schema)
        self.canonical = key_bytes.canonical_keys(routing)
        self._plain = key_bytes.PlainValues(routing) \
            if self.canonical and not routing.partitioned else None
        self._bucket_positions = [self.names.index(c) for c in routing.bucket_key]

    def prepare(self, key: dict) -> tuple[str | None, int, bytes]:
        """(partition, bucket, the key as a request carries it) of a lookup key (see
        `key_batch` for what a key is); InvalidInputError naming what does not fit."""
        parts = self._plain.parts(key) if self._plain is not None and type(key) is dict \
            else None
        if parts is not None:
            return None, self._bucket(parts), b"".join(parts)
        batch = self.key_batch(key)
        routing = self.routing
        partition = partition_names(batch, routing.partition_key)[0] \
            if routing.partitioned else None
        if not self.canonical:
            bucket = int(bucket_ids(batch, list(routing.bucket_key), routing.bucket_count)[0])
            return partition, bucket, ipc_of_batch(self._schema_message, batch)
        parts = key_bytes.encode(batch)
        return partition, self._bucket(parts), b"".join(parts)

    def _bucket(self, parts: list[bytes]) -> int:
        return fnv_fmix(b"".join([parts[i] for i in self._bucket_positions])) \
            % self.routing.bucket_count

    def head(self, route) -> bytes:
        """The bytes a lookup request to `route` (a tally.client.metadata.Route of this
        routing) starts with; its key follows."""
        if self.canonical:
            return CANONICAL_HEAD.pack(CANONICAL_MARK, LOOKUP_VERSION, route.table_id,
                                       route.partition_id, route.bucket)
        return dumps({**route.header(), VERSION_FIELD: LOOKUP_VERSION}) + b"\n"

    def key_batch(self, key: dict) -> pa.RecordBatch:
        """`key` (a dict holding at least the primary-key columns; others are ignored, so a
        whole row is a key too) as a one-row batch typed like the key columns."""
        if not isinstance(key, dict):
            raise InvalidInputError(f"a lookup key is a dict of primary-key values, not {key!r}")
        missing = [c for c in self.names if c not in key]
        if missing:
            raise InvalidInputError(f"lookup key of table {self.routing.name} is missing "
                                    f"primary-key column(s) {missing}")
        arrays = []
        for f, integer in zip(self.schema, self._integer):
            value = key[f.name]
            if value is None:
                raise InvalidInputError(f"primary-key column(s) {[f.name]} of the key are null")
            if integer and isinstance(value, float):  # Arrow would truncate 1.5 to 1
                raise InvalidInputError(f"key column {f.name!r} of table {self.routing.name} "
                                        f"is {f.type}: {value!r} is not an integer")
            try:
                arrays.append(pa.array([value], f.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
                raise InvalidInputError(
                    f"key column {f.name!r} of table {self.routing.name} is {f.type}: "
                    f"{_short(value)} does not fit ({e})") from None
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def answer_row(self, answer: pa.Buffer) -> dict | None:
        """The row of a lookup's answer (tally.wire.lookup_answer), or None."""
        return self.answers.row(answer)


def checked_key(routing: TableRouting, key: pa.Table | pa.RecordBatch, bucket: int,
                partition: str | None, where: str) -> list[pa.Array]:
    """The key columns of a one-row lookup `key` sent to (`partition`, `bucket`), in
    primary-key order and typed like them; InvalidInputError, naming the column, when the key
    has other columns or lacks one, a value is null or does not fit its column's type, or the
    key belongs to another partition or bucket (`where` names the bucket)."""
    names = key.schema.names
    pk = routing.primary_key
    if len(names) != len(pk) or set(names) != set(pk):
        missing = [c for c in pk if c not in names]
        other = [c for c in names if c not in pk]
        raise InvalidInputError(
            f"a lookup key of {where} holds the primary-key columns {list(pk)} and nothing "
            f"else" + (f"; it lacks {missing}" if missing else "")
            + (f"; {other} are not primary-key columns" if other else ""))
    columns = []
    for name in pk:
        column = key.column(name)
        if isinstance(column, pa.ChunkedArray):
            column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
        if column.null_count:
            raise InvalidInputError(f"primary-key column {name!r} of the key is null")
        wanted = routing.arrow_schema.field(name).type
        if column.type != wanted:
            try:
                column = column.cast(wanted, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                raise InvalidInputError(f"key column {name!r} of {where} is {wanted}, not "
                                        f"{column.type}: {e}") from None
        columns.append(column)
    batch = pa.RecordBatch.from_arrays(columns, names=list(pk))
    if routing.partitioned:
        named = partition_names(batch, routing.partition_key)[0]
        if named != partition:
            raise InvalidInputError(f"the key belongs to partition '{named}', not to {where}")
    found = int(bucket_ids(batch, list(routing.bucket_key), routing.bucket_count)[0])
    if found != bucket:
        key_text = {c: batch.column(c)[0].as_py() for c in routing.bucket_key}
        raise InvalidInputError(f"the key {key_text} belongs to bucket {found}, not to {where}")
    return columns


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
