"""How much memory an Arrow IPC stream will take to decode, read from its metadata alone.

A compressed record batch is tiny on the wire and can declare gigabytes: Arrow allocates each
buffer at the uncompressed length written in its first 8 bytes, then decompresses into it, so a
server that decodes first and measures after has already paid. Here every message of a stream
is inspected before anything is decoded: its flatbuffer header (the Arrow format's Message,
RecordBatch and DictionaryBatch tables, read by hand: pyarrow exposes no accessor for them)
gives the body's buffers, and a compressed buffer's 8-byte prefix gives what decompressing it
allocates. The sum, and the row count, are checked against the caller's limits; only then does
pyarrow decode the stream, and it allocates no more than was counted (uncompressed buffers are
slices of the bytes already received).

Every offset in the header comes from the sender, so each is checked against the bytes it
points into; anything out of range is a malformed stream, refused like any other.
"""

from __future__ import annotations

import dataclasses
import struct

import pyarrow as pa

from tally.errors import InvalidInputError

# MessageHeader union tags of the Arrow format (Message.fbs)
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
_NOT_COMPRESSED = -1  # the prefix of a buffer the writer left uncompressed


@dataclasses.dataclass(frozen=True)
class StreamSize:
    """What a stream declares: its rows, the bytes decoding it allocates or maps, and its
    length on the wire."""

    rows: int
    decoded_bytes: int
    wire_bytes: int


class _Table:
    """One flatbuffer table inside `data` at `pos`, every read bounds-checked."""

    def __init__(self, data: bytes, pos: int) -> None:
        self.data, self.pos = data, pos
        vtable = pos - _unpack(data, "<i", pos)
        self.vtable = vtable
        self.vtable_len = _unpack(data, "<H", vtable)

    def _slot(self, index: int) -> int:
        at = 4 + 2 * index
        if at + 2 > self.vtable_len:
            return 0
        return _unpack(self.data, "<H", self.vtable + at)

    def scalar(self, index: int, fmt: str, default: int) -> int:
        offset = self._slot(index)
        return default if offset == 0 else _unpack(self.data, fmt, self.pos + offset)

    def target(self, index: int) -> int | None:
        """Where an offset field (table or vector) points, or None when it is absent."""
        offset = self._slot(index)
        if offset == 0:
            return None
        at = self.pos + offset
        return at + _unpack(self.data, "<I", at)

    def table(self, index: int) -> "_Table | None":
        at = self.target(index)
        return None if at is None else _Table(self.data, at)

    def structs(self, index: int, width: int) -> list[tuple[int, int]]:
        """A vector of structs of two int64s (FieldNode, Buffer)."""
        at = self.target(index)
        if at is None:
            return []
        count = _unpack(self.data, "<I", at)
        if at + 4 + count * width > len(self.data):
            raise _malformed(f"a vector of {count} entries runs past the message header")
        return [struct.unpack_from("<qq", self.data, at + 4 + i * width) for i in range(count)]


def _unpack(data: bytes, fmt: str, pos: int) -> int:
    if pos < 0 or pos + struct.calcsize(fmt) > len(data):
        raise _malformed("an offset points outside the message header")
    return struct.unpack_from(fmt, data, pos)[0]


def _malformed(why: str) -> InvalidInputError:
    return InvalidInputError(f"malformed Arrow IPC payload: {why}")


def _batch_size(batch: _Table, body: pa.Buffer | None) -> tuple[int, int]:
    """(rows, bytes decoding it allocates or maps) of a RecordBatch table and its body."""
    rows = batch.scalar(0, "<q", 0)
    body_len = 0 if body is None else body.size
    compressed = batch.target(3) is not None
    total = 0
    for offset, length in batch.structs(2, 16):
        if offset < 0 or length < 0 or offset + length > body_len:
            raise _malformed(f"a buffer ({offset}, {length}) lies outside the {body_len}-byte "
                             "message body")
        if not compressed or length == 0:
            total += length
            continue
        if length < 8:
            raise _malformed("a compressed buffer is shorter than its length prefix")
        declared = struct.unpack_from("<q", memoryview(body)[offset:offset + 8])[0]
        if declared == _NOT_COMPRESSED:
            total += length - 8
        elif declared < 0:
            raise _malformed(f"a compressed buffer declares {declared} bytes")
        else:
            total += declared
    if rows < 0:
        raise _malformed(f"a record batch declares {rows} rows")
    return rows, total


def measure_stream(data: pa.Buffer | bytes, *, max_rows: int, max_bytes: int,
                   what: str) -> StreamSize:
    """The size of the IPC stream in `data`, read before anything is decoded; InvalidInputError
    naming `what` and the limit as soon as the rows or decoded bytes pass `max_rows` or
    `max_bytes`."""
    source = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    rows = decoded = 0
    for _, _, batch_rows, batch_bytes in _measured(source, max_rows, max_bytes, what):
        rows += batch_rows
        decoded += batch_bytes
    return StreamSize(rows, decoded, source.size)


def read_stream(data: pa.Buffer | bytes, *, max_rows: int, max_bytes: int,
                what: str) -> pa.Table:
    """The table in the IPC stream `data`, each message measured (as by measure_stream)
    before any is decoded, and the messages read once: a small request (a lookup's key) pays
    for reading its stream once, not once to measure and once to decode."""
    source = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    schema, batches, dictionaries = None, [], False
    for kind, message, _, _ in _measured(source, max_rows, max_bytes, what):
        if kind == _SCHEMA:
            if schema is not None:
                raise _malformed("the stream holds a second schema")
            schema = message
        elif kind == _RECORD_BATCH:
            batches.append(message)
        else:
            dictionaries = True
    try:
        if dictionaries:  # measured above; the stream reader resolves the dictionaries
            return pa.ipc.open_stream(source).read_all()
        schema = pa.ipc.read_schema(schema)
        return pa.Table.from_batches([pa.ipc.read_record_batch(m, schema) for m in batches],
                                     schema)
    except (pa.ArrowException, OSError) as e:
        raise _malformed(str(e)) from None


def _measured(source: pa.Buffer, max_rows: int, max_bytes: int, what: str):
    """(kind, message, rows, decoded bytes) of each message of the stream, checked against
    the limits (the totals so far) before the next is read."""
    rows = decoded = 0
    first = True
    try:
        reader = pa.ipc.MessageReader.open_stream(source)
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            meta = message.metadata.to_pybytes()
            root = _Table(meta, _unpack(meta, "<I", 0))
            kind = root.scalar(1, "<B", 0)
            if first and kind != _SCHEMA:
                raise _malformed("the stream does not start with a schema")
            first = False
            if kind == _RECORD_BATCH:
                header = root.table(2)
            elif kind == _DICTIONARY_BATCH:
                dictionary = root.table(2)
                header = None if dictionary is None else dictionary.table(1)
            elif kind == _SCHEMA:
                yield kind, message, 0, 0
                continue
            else:
                raise _malformed(f"unexpected message type {kind}")
            if header is None:
                raise _malformed("a batch message has no header")
            batch_rows, batch_bytes = _batch_size(header, message.body)
            if kind == _RECORD_BATCH:
                rows += batch_rows
            decoded += batch_bytes
            if rows > max_rows:
                raise InvalidInputError(
                    f"{what} holds more than the limit of {max_rows:,} rows")
            if decoded > max_bytes:
                raise InvalidInputError(
                    f"{what} exceeds the server's limit of {max_bytes} bytes once decoded "
                    f"(at least {decoded:,} bytes); send smaller batches")
            yield kind, message, batch_rows if kind == _RECORD_BATCH else 0, batch_bytes
    except (pa.ArrowException, OSError) as e:
        raise _malformed(str(e)) from None
    if first:
        raise _malformed("the stream is empty")
