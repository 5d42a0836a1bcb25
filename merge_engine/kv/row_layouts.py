"""RowLayouts: the stored rows of a bucket whose table gained columns (add_column).

Stored rows are never rewritten when a column is added: a row keeps the layout it was written
with, and reads widen it, the added columns empty and unwritten (what a key no write has
touched holds), so existing rows read null. Rows written since carry their width (rowcodec's
version 2). A bucket whose columns never changed writes and reads version 1 rows exactly as
before, at the same speed.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from merge_engine.format.rowcodec import VERSION, WIDTH_VERSION, RowCodec
from merge_engine.kv.storage import BASE_WIDTH, DESCRIPTOR, TabletStore
from merge_engine.table.schema import Schema
from merge_engine.write.state import StateBatch
from tally.errors import StorageError


def add_columns(store: TabletStore, saved: Schema, schema: Schema) -> None:
    """A bucket saved with `saved` opens with `schema`, which added columns: remember the width
    of the rows written before the first addition, then the new schema. Any other difference
    is refused."""
    if not schema.extends(saved):
        raise StorageError(f"{store.name} was created with another schema; refusing "
                           f"to open it with {schema!r}")
    batch = store.new_batch()
    if store.get_bytes(BASE_WIDTH) is None:
        TabletStore.put_int(batch, BASE_WIDTH, len(saved.columns))
    batch.put(DESCRIPTOR, schema.to_json().encode())
    store.commit(batch)


class RowLayouts:
    """Encodes rows in the current layout; decodes rows of any layout the bucket has had.

    `base_width`: the number of columns the bucket was created with (its version 1 rows)."""

    def __init__(self, state_schema: pa.Schema, counted: list[int], timed: bool,
                 aggregators, base_width: int):
        self._schema = state_schema
        self._counted = list(counted)
        self._timed = timed
        self._aggregators = aggregators
        self.width = len(state_schema)
        self.base_width = base_width
        version = VERSION if base_width == self.width else WIDTH_VERSION
        self.current = RowCodec(state_schema, counted, timed, version)
        self._codecs = {(version, self.width): self.current}

    def encode(self, batch: StateBatch) -> list[bytes]:
        return self.current.encode(batch)

    def differs(self, a: StateBatch, b: StateBatch) -> np.ndarray:
        return self.current.differs(a, b)

    def decode(self, rows: list[bytes]) -> StateBatch:
        if self.base_width == self.width or not rows:
            return self.current.decode(rows)
        layouts = [self._layout(row) for row in rows]
        if all(layout == layouts[0] for layout in layouts):
            return self._widen(self._codec(*layouts[0]).decode(rows))
        groups: dict[tuple[int, int], list[int]] = {}
        for i, layout in enumerate(layouts):
            groups.setdefault(layout, []).append(i)
        parts, order = [], []
        for layout, members in groups.items():
            parts.append(self._widen(self._codec(*layout).decode([rows[i] for i in members])))
            order.extend(members)
        where = np.empty(len(rows), dtype=np.int64)
        where[np.array(order, dtype=np.int64)] = np.arange(len(rows))
        return StateBatch.concat(*parts).take(where)

    def _layout(self, row: bytes) -> tuple[int, int]:
        if not row:
            raise StorageError("A stored row is empty: the tablet is corrupt")
        if row[0] == VERSION:
            return VERSION, self.base_width
        if row[0] == WIDTH_VERSION and len(row) >= 3:
            return WIDTH_VERSION, int.from_bytes(row[1:3], "little")
        raise StorageError(f"A stored row has an unknown format version {row[0]}")

    def _codec(self, version: int, width: int) -> RowCodec:
        codec = self._codecs.get((version, width))
        if codec is None:
            if not 0 < width <= self.width:
                raise StorageError(f"A stored row has {width} columns, more than the table's "
                                   f"{self.width}: the tablet is corrupt")
            schema = pa.schema(list(self._schema)[:width])
            codec = RowCodec(schema, [i for i in self._counted if i < width], self._timed,
                             version)
            self._codecs[(version, width)] = codec
        return codec

    def _widen(self, states: StateBatch) -> StateBatch:
        """Rows of fewer columns with the added ones empty and unwritten."""
        have = len(states.columns)
        if have == self.width:
            return states
        n = len(states)
        columns = list(states.columns) + [self._aggregators[i].empty(n)
                                          for i in range(have, self.width)]
        written = np.zeros((n, self.width), dtype=bool)
        written[:, :have] = states.written
        counts = np.zeros((n, self.width), dtype=np.int64)
        counts[:, :have] = states.counts()
        return StateBatch(columns, written, counts, states.touched)
