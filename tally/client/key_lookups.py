"""Lookups of many keys: grouped by bucket, sent as `lookup_many` requests, answered in order.

One request per bucket carries at most MAX_LOOKUP_KEYS keys in at most MAX_FRAMED_BYTES (the
server refuses more before decoding anything), so the keys of one bucket are cut into requests
that fit; each request is read at one offset of its bucket. Buckets are asked in parallel.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses

import numpy as np
import pyarrow as pa

from merge_engine.table.hidden_columns import UNWRITTEN
from tally.errors import InvalidInputError
from tally.wire.messages import FOUND_COLUMN, MAX_FRAMED_BYTES, MAX_LOOKUP_KEYS, SCAN_OFFSET_KEY
from tally.wire.routing import TableRouting, group_rows

_POSITION = "_position"  # where each key stood in the caller's input (client side only)


@dataclasses.dataclass(frozen=True)
class KeyRequest:
    """The keys of one lookup_many request: one bucket, at most MAX_LOOKUP_KEYS keys."""

    partition: str | None
    bucket: int
    keys: pa.Table  # the primary-key columns, typed like the table's


def key_table(routing: TableRouting, keys) -> pa.Table:
    """`keys` (a list of dicts, or an Arrow table holding the primary-key columns) as a table
    of exactly the primary-key columns, typed like the table's; InvalidInputError naming the
    key or column that does not fit."""
    pk = list(routing.primary_key)
    if isinstance(keys, (pa.Table, pa.RecordBatch)):
        missing = [c for c in pk if c not in keys.column_names]
        if missing:
            raise InvalidInputError(f"the keys lack primary-key column(s) {missing} of table "
                                    f"{routing.name}")
        columns = []
        for c in pk:
            try:
                columns.append(keys.column(c).cast(routing.arrow_schema.field(c).type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise InvalidInputError(f"key column {c!r} does not fit table {routing.name}: "
                                        f"{e}") from None
        table = pa.Table.from_arrays(columns, names=pk)
    elif isinstance(keys, (list, tuple)):
        for key in keys:
            if not isinstance(key, dict):
                raise InvalidInputError(f"a lookup key is a dict of primary-key values, not "
                                        f"{key!r}")
            routing.check_key(key)
        try:
            table = pa.table({c: pa.array([k[c] for k in keys], routing.arrow_schema.field(c).type)
                              for c in pk})
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
            raise InvalidInputError(f"a key does not fit table {routing.name}: {e}") from None
    else:
        raise InvalidInputError(f"keys are a list of dicts or an Arrow table, not "
                                f"{type(keys).__name__}")
    nulls = [c for c in pk if table.column(c).null_count]
    if nulls:
        raise InvalidInputError(f"primary-key column(s) {nulls} of a key are null")
    return table


def requests(routing: TableRouting, keys: pa.Table, with_positions: bool = False) -> list[KeyRequest]:
    """The requests that ask for `keys`: grouped by bucket, each within the request limits.
    With `with_positions`, each request's keys keep a `_position` column (their input row)."""
    if with_positions:
        keys = keys.append_column(_POSITION, pa.array(np.arange(keys.num_rows, dtype=np.int64)))
    out = []
    for group in group_rows(routing, keys):
        rows = group.rows
        per_key = max(1, rows.nbytes // max(1, rows.num_rows))
        # Half the framed limit leaves room for the IPC framing and the header.
        step = max(1, min(MAX_LOOKUP_KEYS, (MAX_FRAMED_BYTES // 2) // per_key))
        for start in range(0, rows.num_rows, step):
            out.append(KeyRequest(group.partition, group.bucket,
                                  rows.slice(start, min(step, rows.num_rows - start))))
    return out


def ask(table, request: KeyRequest, unwritten: bool = False) -> tuple[pa.Table, int | None]:
    """The rows of one request's keys (FOUND_COLUMN says which exist; columns of the input
    beyond the key, such as `_position`, are kept beside them) and the offset read at; a
    partition that does not exist has none of them (offset None)."""
    conn = table.connection
    keys = request.keys.select(list(table.routing.primary_key))
    if request.partition is not None and not table.meta.has_partition(request.partition):
        meta = conn.table_meta(table.name, refresh=True, table_id=table.table_id)
        if not meta.has_partition(request.partition):
            return _absent(table.routing, request.keys, unwritten), None

    def attempt() -> pa.Table:
        route = conn.route(table.name, request.partition, request.bucket, table.table_id)
        header = {**route.header(), "unwritten": unwritten}
        return conn.server(route.address).lookup_many(header, keys)

    rows = conn.retry(attempt, refresh=table.name)
    offset = int((rows.schema.metadata or {}).get(SCAN_OFFSET_KEY, b"-1"))
    rows = rows.replace_schema_metadata(None)
    for name in request.keys.column_names:
        if name not in rows.column_names:
            rows = rows.append_column(name, request.keys.column(name))
    return rows, offset


def _absent(routing: TableRouting, keys: pa.Table, unwritten: bool) -> pa.Table:
    n = keys.num_rows
    fields = list(routing.arrow_schema)
    if unwritten:
        fields.append(pa.field(UNWRITTEN, pa.list_(pa.string())))
    arrays = [pa.nulls(n, f.type) for f in fields] + [pa.array(np.zeros(n, dtype=bool))]
    rows = pa.Table.from_arrays(arrays, schema=pa.schema(
        fields + [pa.field(FOUND_COLUMN, pa.bool_(), False)]))
    for name in keys.column_names:
        if name not in rows.column_names:
            rows = rows.append_column(name, keys.column(name))
    return rows


def lookup_aligned(table, keys) -> pa.Table:
    """One row per key of `keys`, in input order, with FOUND_COLUMN (absent keys: nulls)."""
    routing = table.routing
    wanted = key_table(routing, keys)
    if wanted.num_rows == 0:
        return routing.arrow_schema.empty_table().append_column(
            pa.field(FOUND_COLUMN, pa.bool_(), False), pa.array([], pa.bool_()))
    batch = requests(routing, wanted, with_positions=True)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(batch)))) as pool:
        parts = list(pool.map(lambda r: ask(table, r)[0], batch))
    # An absent key's row is all null, key columns included.
    schema = pa.schema([f.with_nullable(f.name not in (FOUND_COLUMN, _POSITION))
                        for f in parts[0].schema])
    rows = pa.concat_tables([p.select(schema.names).cast(schema) for p in parts])
    positions = rows.column(_POSITION).to_numpy()
    order = np.empty(len(positions), dtype=np.int64)
    order[positions] = np.arange(len(positions))
    return rows.drop_columns([_POSITION]).take(pa.array(order))
