"""A dictionary table's ids from the client: `assign_ids` (insert-if-absent) and `lookup_ids`.

Keys are grouped by bucket and sent as `assign_ids` requests of at most MAX_LOOKUP_KEYS keys
(buckets in parallel) to each bucket's leader, which assigns the absent ones (see the tablet
server's id assignment). A request is retried like any other call: asking again for keys
whose answer was lost gives the same ids, because the leader finds them assigned.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from merge_engine.table.dictionary import ID_COLUMN, KEY_COLUMN, DictionarySpec, dictionary_spec
from tally.client.key_lookups import lookup_aligned, requests
from tally.errors import InvalidInputError, SchemaError

_POSITION = "_position"  # the column key_lookups.requests adds with positions


def spec_of(table) -> DictionarySpec:
    """The dictionary a table handle holds; InvalidInputError when it is no dictionary."""
    try:
        return dictionary_spec(table.meta.descriptor, f"table {table.name}")
    except SchemaError as e:
        raise InvalidInputError(str(e)) from None


def key_array(spec: DictionarySpec, keys, name: str) -> pa.Array:
    """`keys` (a list of str or bytes, or an Arrow array) as an array of the dictionary's key
    type; InvalidInputError naming the first null or ill-typed key."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if isinstance(keys, pa.Array):
        if keys.type != spec.key_type:
            # only the large form of the key type is taken (a number is no string id)
            large = pa.large_string() if pa.types.is_string(spec.key_type) else pa.large_binary()
            if keys.type != large:
                raise InvalidInputError(f"the keys of dictionary {name} are {spec.key_type}, "
                                        f"not {keys.type}")
            keys = keys.cast(spec.key_type)
    elif isinstance(keys, (list, tuple)):
        want = str if pa.types.is_string(spec.key_type) else bytes
        wrong = next((i for i, k in enumerate(keys) if k is not None
                      and not isinstance(k, want)), None)
        if wrong is not None:
            raise InvalidInputError(f"key {wrong} ({keys[wrong]!r}) is not {want.__name__}: the "
                                    f"keys of dictionary {name} are {spec.key_type}")
        keys = pa.array(keys, spec.key_type)
    else:
        raise InvalidInputError(f"dictionary keys are a list or an Arrow array, not "
                                f"{type(keys).__name__}")
    if keys.null_count:
        row = int(pc.index(pc.is_null(keys), True).as_py())
        raise InvalidInputError(f"key {row} is null: dictionary {name} has no id for null "
                                f"(nothing was assigned)")
    return keys


def assign_ids(table, keys) -> pa.Array:
    """Every key's id, in input order, assigning ids to the absent ones (see the module
    docstring); the ids' type is the dictionary's (uint32 or int64)."""
    spec = spec_of(table)
    keys = key_array(spec, keys, table.name)
    if len(keys) == 0:
        return pa.array([], spec.id_arrow_type)
    conn = table.connection
    batch = requests(table.routing, pa.table({KEY_COLUMN: keys}), with_positions=True)

    def ask(request) -> pa.Table:
        def attempt() -> pa.Table:
            route = conn.route(table.name, None, request.bucket, table.table_id)
            return conn.server(route.address).binary_action(
                "assign_ids", route.header(), request.keys.select([KEY_COLUMN]))

        ids = conn.retry(attempt, refresh=table.name).column(ID_COLUMN)
        return pa.table({ID_COLUMN: ids, _POSITION: request.keys.column(_POSITION)})

    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, len(batch)))) as pool:
        parts = pa.concat_tables(pool.map(ask, batch))
    order = np.empty(parts.num_rows, dtype=np.int64)
    order[parts.column(_POSITION).to_numpy()] = np.arange(parts.num_rows)
    return parts.column(ID_COLUMN).combine_chunks().take(pa.array(order)).cast(spec.id_arrow_type)


def lookup_ids(table, keys) -> pa.Array:
    """Every key's id, in input order, null where the key has none; assigns nothing."""
    spec = spec_of(table)
    keys = key_array(spec, keys, table.name)
    if len(keys) == 0:
        return pa.array([], spec.id_arrow_type)
    rows = lookup_aligned(table, pa.table({KEY_COLUMN: keys}))
    return rows.column(ID_COLUMN).combine_chunks().cast(spec.id_arrow_type)
