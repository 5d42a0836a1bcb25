"""A tablet server's key lookups: the actions `lookup` (one key) and `lookup_many` (many).

Both read a bucket this server leads, and both answer only what is acknowledged: the rows are
read with the bucket's log end offset under its lock, and the answer waits until the high
watermark reaches that offset (at once when it already has, or when the bucket has no
followers), so no row a failover could take back is ever shown.

`lookup` is the lean path: it reads its own request in one pass; a key sent as the bucket
function's canonical bytes (tally.wire.key_bytes) is checked and turned into the storage key
without Arrow, any other key (an Arrow IPC stream) is checked column by column
(tally.wire.point_keys), neither through the write-input validation; the tablet reads it
straight from its row buffer or RocksDB as Arrow; and the answer is assembled from the schema's
IPC message, made once per schema, and the row's one record batch.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from merge_engine.keys import key_array
from tally.errors import InvalidInputError
from tally.wire.ipc_guard import read_stream
from tally.wire.key_bytes import KeyDecoder
from tally.wire.messages import (FOUND_COLUMN, MAX_FRAMED_BYTES, MAX_REQUEST_JSON_BYTES,
                                 SCAN_OFFSET_KEY, field, loads, table_to_ipc)
from tally.wire.point_keys import (CANONICAL_HEAD, CANONICAL_MARK, IPC_END, checked_key,
                                   ipc_of_batch)

_SCHEMA_MESSAGES = 64  # answer schemas kept (one per open bucket schema, in practice a few)
_DECODERS = 64  # key decoders kept, one per table routing


class KeyLookups:
    """Adds `lookup` (an action that reads its own request) and `lookup_many` (a binary
    action) to a TabletServer."""

    def __init__(self, server) -> None:
        self.server = server
        # answer schema -> (schema, its IPC message): keyed by identity, checked by identity
        self._schema_messages: dict[int, tuple[pa.Schema, bytes]] = {}
        # table routing -> (routing, its key decoder): keyed by identity, checked by identity
        self._decoders: dict[int, tuple[object, KeyDecoder]] = {}
        server.binary_actions["lookup_many"] = self.lookup_many
        server.raw_actions["lookup"] = self.lookup

    def lookup(self, request: pa.Buffer | bytes) -> bytes:
        """The row of one key, as Arrow IPC with 0 or 1 row. `request`: CANONICAL_HEAD and
        the key's canonical bytes, or the JSON header, '\\n', and a one-row Arrow IPC stream
        of the primary-key columns."""
        if len(request) > MAX_FRAMED_BYTES:
            raise InvalidInputError(f"a lookup request of {len(request):,} bytes exceeds the "
                                    f"limit of {MAX_FRAMED_BYTES:,} bytes")
        data = request.to_pybytes() if isinstance(request, pa.Buffer) else request
        server = self.server
        if data.startswith(CANONICAL_MARK):
            if len(data) < CANONICAL_HEAD.size:
                raise InvalidInputError("a lookup request ends inside its head")
            _, table_id, partition_id, bucket = CANONICAL_HEAD.unpack_from(data)
            hosted = server.tablet(table_id, partition_id, bucket)
            key = self._decoder(hosted.routing).storage_key(
                data[CANONICAL_HEAD.size:], bucket, hosted.partition, _Label(hosted))
        else:
            head, sep, rest = data.partition(b"\n")
            header = loads(head, MAX_REQUEST_JSON_BYTES, "a lookup request")
            if not isinstance(header, dict):
                raise InvalidInputError("lookup must start with a JSON object")
            if not sep:
                raise InvalidInputError("a lookup carries exactly one key")
            # read (and bounded) before any bucket is touched
            payload = read_stream(rest, max_rows=1, max_bytes=MAX_FRAMED_BYTES,
                                  what="the key of a lookup request")
            if payload.num_rows != 1:
                raise InvalidInputError("a lookup carries exactly one key")
            hosted = server.addressed(header)
            key = key_array(checked_key(hosted.routing, payload, hosted.key.bucket,
                                        hosted.partition, hosted.label))
        lead = server.leadership(hosted)
        with hosted.lock:
            tablet = hosted.tablet
            row = tablet.lookup_key(key)
            seen = tablet.log_end_offset
            schema = tablet.arrow_schema
        lead.wait_replicated(seen, writing=False)
        message = self._schema_message(schema)
        return message + IPC_END if row is None else ipc_of_batch(message, row)

    def _decoder(self, routing) -> KeyDecoder:
        cached = self._decoders.get(id(routing))
        if cached is not None and cached[0] is routing:
            return cached[1]
        if len(self._decoders) >= _DECODERS:
            self._decoders.clear()
        decoder = KeyDecoder(routing)
        self._decoders[id(routing)] = (routing, decoder)
        return decoder

    def _schema_message(self, schema: pa.Schema) -> bytes:
        cached = self._schema_messages.get(id(schema))
        if cached is not None and cached[0] is schema:
            return cached[1]
        if len(self._schema_messages) >= _SCHEMA_MESSAGES:
            self._schema_messages.clear()
        message = schema.serialize().to_pybytes()
        self._schema_messages[id(schema)] = (schema, message)
        return message

    def lookup_many(self, header: dict, payload: pa.Table | None) -> bytes:
        """The rows of up to MAX_LOOKUP_KEYS keys of one bucket, one per key in input order,
        with the boolean column FOUND_COLUMN (false: no such key; its other cells are null)
        and, when `unwritten` is true, the hidden `_unwritten` column, as Arrow IPC. The
        schema metadata holds the offset they were read at."""
        if payload is None:
            raise InvalidInputError("a lookup_many carries its keys as an Arrow table")
        server = self.server
        hosted = server.addressed(header)
        server.check_rows(hosted, payload)
        unwritten = field(header, "unwritten", bool, False)
        lead = server.leadership(hosted)
        with hosted.lock:
            rows, present = hosted.tablet.lookup_many(payload, unwritten)
            offset = hosted.tablet.log_end_offset
        lead.wait_replicated(offset, writing=False)
        found = pa.array(present, type=pa.bool_())
        rows = pa.Table.from_arrays(
            [pc.if_else(found, c, pa.nulls(len(found), c.type)) for c in rows.columns]
            + [found], schema=rows.schema.append(pa.field(FOUND_COLUMN, pa.bool_(), False)))
        return table_to_ipc(rows.replace_schema_metadata(
            {SCAN_OFFSET_KEY: str(offset).encode()}))


class _Label:
    """A hosted bucket's label, made only when a refusal names it (its text costs a lookup)."""

    def __init__(self, hosted) -> None:
        self.hosted = hosted

    def __str__(self) -> str:
        return self.hosted.label
