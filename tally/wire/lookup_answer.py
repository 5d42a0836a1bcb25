"""A point lookup's answer: a head, then the row as its visible row bytes, or as Arrow IPC.

The head says which: a marker, the lookup wire version (LOOKUP_VERSION, which requests carry
too), what follows (no row, a visible row, an Arrow IPC stream of 0 or 1 row) and the
fingerprint of the columns the row was encoded with. A table with a nested column (a list, a
map, a struct) has no visible row layout (merge_engine.format.visible_row) and is answered in Arrow IPC
as before; every other row is decoded without Arrow, by a decoder made once per schema. A
reader whose schema's fingerprint differs (a column was added since it read the table's
metadata) gets a StaleMetadataError, so the client refreshes its metadata and asks again.
"""

from __future__ import annotations

import struct

import pyarrow as pa

from merge_engine.format.visible_row import VisibleRowDecoder, fingerprint, flat
from tally.errors import InvalidInputError, StaleMetadataError, WireVersionError
from tally.wire.messages import ipc_to_table

# The lookup wire version: 2 answers visible rows (1, Arrow IPC only, had no version mark).
LOOKUP_VERSION = 2
ANSWER_MARK = b"\x00TLA"
ANSWER_HEAD = struct.Struct("<4sBBI")  # marker, version, what follows, column fingerprint
NO_ROW, VISIBLE_ROW, ARROW_ROWS = 0, 1, 2


def answer_head(kind: int, columns: int) -> bytes:
    """The head of an answer of `kind` whose columns have the fingerprint `columns`."""
    return ANSWER_HEAD.pack(ANSWER_MARK, LOOKUP_VERSION, kind, columns)


class LookupAnswers:
    """The reader of one table's lookup answers (made once per table schema)."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.fingerprint = fingerprint(schema)
        self._decoder = VisibleRowDecoder(schema) if flat(schema) else None

    def row(self, answer: pa.Buffer | bytes) -> dict | None:
        """The row an answer holds, or None. WireVersionError for an answer of another
        version, InvalidInputError for one that is malformed, StaleMetadataError for a row of
        other columns than this reader's."""
        data = answer.to_pybytes() if isinstance(answer, pa.Buffer) else answer
        if len(data) < ANSWER_HEAD.size or not data.startswith(ANSWER_MARK):
            raise WireVersionError("a lookup answer without the lookup answer's head: the "
                                   "server speaks another version of Tally's wire format")
        _, version, kind, columns = ANSWER_HEAD.unpack_from(data)
        if version != LOOKUP_VERSION:
            raise WireVersionError(f"a lookup answer of wire version {version}; this client "
                                   f"reads version {LOOKUP_VERSION}: client and server are of "
                                   f"different Tally versions")
        if kind not in (NO_ROW, VISIBLE_ROW, ARROW_ROWS):
            raise InvalidInputError(f"malformed lookup answer: unknown kind {kind}")
        if columns != self.fingerprint:
            raise StaleMetadataError("the lookup answer's row has other columns than this "
                                     "client knows the table to have")
        body = data[ANSWER_HEAD.size:]
        if kind == NO_ROW:
            if body:
                raise InvalidInputError("malformed lookup answer: no row, yet bytes follow")
            return None
        if kind == ARROW_ROWS:
            rows = ipc_to_table(body)
            return rows.to_pylist()[0] if rows.num_rows else None
        if self._decoder is None:
            raise InvalidInputError("malformed lookup answer: a visible row of a table with "
                                    "nested columns")
        try:
            return self._decoder.decode(body)
        except (ValueError, struct.error, UnicodeDecodeError) as e:
            raise InvalidInputError(f"malformed lookup answer: {e}") from None
