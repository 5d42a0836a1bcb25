"""A tablet server's key lookups: the actions `lookup` (one key) and `lookup_many` (many).

Both read a bucket this server leads, and both answer only what is acknowledged: the rows are
read with the bucket's log end offset under its lock, and the answer waits until the high
watermark reaches that offset (at once when it already has, or when the bucket has no
followers), so no row a failover could take back is ever shown.

`lookup` is the lean path: it reads its own request in one pass; a key sent as the bucket
function's canonical bytes (tally.wire.key_bytes) is checked and turned into the storage key
without Arrow, any other key (an Arrow IPC stream) is checked column by column
(tally.wire.point_keys), neither through the write-input validation; the tablet reads it
straight from its row buffer or RocksDB as a visible row (merge_engine.format.visible_row: a stored
row's bytes less their bookkeeping, or a buffered row encoded a column at a time), answered
behind a head made once per schema (tally.wire.lookup_answer). A table with a nested column
is answered with its schema's IPC message, made once per schema, and the row's one record
batch. Requests and answers carry the lookup wire version: another is a WireVersionError.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from merge_engine.format.visible_row import fingerprint
from merge_engine.write.keys import key_array
from tally.errors import InvalidInputError, WireVersionError
from tally.wire.key_bytes import KeyDecoder
from tally.wire.lookup_answer import ARROW_ROWS, LOOKUP_VERSION, NO_ROW, VISIBLE_ROW, answer_head
from tally.wire.messages import (FOUND_COLUMN, MAX_FRAMED_BYTES, SCAN_OFFSET_KEY, field,
                                 table_to_ipc, unframe)
from tally.wire.point_keys import (CANONICAL_HEAD, CANONICAL_MARK, IPC_END, VERSION_FIELD,
                                   checked_key, ipc_of_batch)

_SCHEMA_MESSAGES = 64  # answers' heads (and IPC messages) kept, one per schema
_DECODERS = 64  # key decoders kept, one per table routing


class KeyLookups:
    """Adds `lookup` (an action that reads its own request) and `lookup_many` (a binary
    action) to a TabletServer."""

    def __init__(self, server) -> None:
        self.server = server
        # one per open bucket schema and table routing, in practice a few: answers' heads per
        # visible row layout, and per schema of a table answered in Arrow (with its message)
        self._heads = _MadeOnce(lambda visible: {
            kind: answer_head(kind, visible.fingerprint) for kind in (NO_ROW, VISIBLE_ROW)},
            _SCHEMA_MESSAGES)
        self._arrow_heads = _MadeOnce(lambda schema: (
            answer_head(ARROW_ROWS, fingerprint(schema)), schema.serialize().to_pybytes()),
            _SCHEMA_MESSAGES)
        self._decoders = _MadeOnce(KeyDecoder, _DECODERS)
        server.binary_actions["lookup_many"] = self.lookup_many
        server.raw_actions["lookup"] = self.lookup

    def lookup(self, request: pa.Buffer | bytes) -> bytes:
        """The row of one key, as a lookup answer (tally.wire.lookup_answer). `request`:
        CANONICAL_HEAD and the key's canonical bytes, or the JSON header (with VERSION_FIELD),
        '\\n', and a one-row Arrow IPC stream of the primary-key columns."""
        if len(request) > MAX_FRAMED_BYTES:
            raise InvalidInputError(f"a lookup request of {len(request):,} bytes exceeds the "
                                    f"limit of {MAX_FRAMED_BYTES:,} bytes")
        data = request.to_pybytes() if isinstance(request, pa.Buffer) else request
        server = self.server
        if data.startswith(CANONICAL_MARK):
            if len(data) < CANONICAL_HEAD.size:
                raise InvalidInputError("a lookup request ends inside its head")
            _, version, table_id, partition_id, bucket = CANONICAL_HEAD.unpack_from(data)
            _check_version(version)
            hosted = server.tablet(table_id, partition_id, bucket)
            key = self._decoders.get(hosted.routing).storage_key(
                data[CANONICAL_HEAD.size:], bucket, hosted.partition, _Label(hosted))
        else:
            if data[:1] == b"\x00":  # a canonical head, but not this version's
                raise WireVersionError("a lookup request of another version of Tally's wire "
                                       "format: client and server are of different versions")
            # read (and bounded) before any bucket is touched
            header, payload = unframe(data, "a lookup request", max_rows=1)
            if not isinstance(header, dict):
                raise InvalidInputError("lookup must start with a JSON object")
            _check_version(header.get(VERSION_FIELD))
            if payload is None or payload.num_rows != 1:
                raise InvalidInputError("a lookup carries exactly one key")
            hosted = server.addressed(header)
            key = key_array(checked_key(hosted.routing, payload, hosted.key.bucket,
                                        hosted.partition, hosted.label))
        lead = server.leadership(hosted)
        with hosted.lock:
            tablet = hosted.tablet
            visible = tablet.visible_rows
            row = tablet.lookup_key(key) if visible is None else tablet.lookup_visible(key)
            seen = tablet.log_end_offset
            schema = tablet.arrow_schema
        lead.wait_replicated(seen, writing=False)
        if visible is not None:
            heads = self._heads.get(visible)
            return heads[NO_ROW] if row is None else heads[VISIBLE_ROW] + row
        head, message = self._arrow_heads.get(schema)
        return head + (message + IPC_END if row is None else ipc_of_batch(message, row))

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


def _check_version(version) -> None:
    if version != LOOKUP_VERSION:
        raise WireVersionError(f"a lookup request of wire version {version}; this server "
                               f"speaks version {LOOKUP_VERSION}: client and server are of "
                               f"different Tally versions")


class _Label:
    """A hosted bucket's label, made only when a refusal names it (its text costs a lookup)."""

    def __init__(self, hosted) -> None:
        self.hosted = hosted

    def __str__(self) -> str:
        return self.hosted.label


class _MadeOnce:
    """What `make` makes of an object (a schema, a table routing), kept while that very
    object is in use: keyed by its id and checked by identity, because an id may be reused
    once its object is gone. At most `limit` are kept; past it they are made again."""

    def __init__(self, make, limit: int) -> None:
        self._make = make
        self._limit = limit
        self._made: dict[int, tuple[object, object]] = {}

    def get(self, source):
        made = self._made.get(id(source))
        if made is not None and made[0] is source:
            return made[1]
        if len(self._made) >= self._limit:
            self._made.clear()
        value = self._make(source)
        self._made[id(source)] = (source, value)
        return value
