"""A scan's filter: which rows it keeps, and which buckets or keys it needs to read at all.

The form is deliberately simple: a dict of column -> value, or column -> list (tuple, set) of
values, every entry required (AND), each an equality or an IN list. It says enough to read
less, and no more:

- equality (or IN) on every primary-key column: the rows are the candidate keys' rows, read
  by key lookups (at most MAX_FILTER_KEYS keys, the product of the lists; more falls back to
  a scan);
- equality (or IN) on every partition-key column: only those partitions are read;
- equality (or IN) on every bucket-key column: only those keys' buckets are read.

Whatever was read, every batch is filtered by the whole filter on the client, so pruning can
only save reading, never change the answer.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tally.errors import InvalidInputError
from tally.wire.bucket_hash import bucket_ids
from tally.wire.routing import TableRouting, partition_names

MAX_FILTER_KEYS = 100_000  # candidate keys read by lookups; a wider filter scans instead


@dataclasses.dataclass(frozen=True)
class ScanFilter:
    """A parsed filter: per column, the Arrow array of values it accepts."""

    values: dict[str, pa.Array]

    @classmethod
    def parse(cls, given, schema: pa.Schema) -> "ScanFilter":
        """`given` (None, or a dict of column -> value or list of values) checked against the
        table's schema: InvalidInputError naming the column or value that does not fit."""
        if given is None:
            return cls({})
        if not isinstance(given, dict):
            raise InvalidInputError(
                f"a scan filter is a dict of column -> value or list of values, not {given!r}")
        values: dict[str, pa.Array] = {}
        for column, accepted in given.items():
            if column not in schema.names:
                raise InvalidInputError(f"the filter names column {column!r}, which the table "
                                        f"does not have (it has {schema.names})")
            items = list(accepted) if isinstance(accepted, (list, tuple, set, frozenset)) \
                else [accepted]
            if any(v is None for v in items):
                raise InvalidInputError(
                    f"the filter of column {column!r} holds null: a filter matches values, "
                    "and null equals nothing")
            values[column] = _typed(items, column, schema.field(column).type)
        return cls(values)

    @property
    def columns(self) -> list[str]:
        return list(self.values)

    def __bool__(self) -> bool:
        return bool(self.values)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of `batch` the filter keeps (the batch holds every filtered column)."""
        if not self.values or batch.num_rows == 0:
            return batch
        mask = None
        for column, accepted in self.values.items():
            keep = pc.is_in(batch.column(column), value_set=accepted)
            mask = keep if mask is None else pc.and_(mask, keep)
        return batch.filter(pc.fill_null(mask, False))

    # --- what to read -----------------------------------------------------------------------

    def candidate_keys(self, routing: TableRouting) -> pa.Table | None:
        """Every key the filter allows, when it pins each primary-key column and there are at
        most MAX_FILTER_KEYS of them; else None."""
        return self._product(routing, routing.primary_key, MAX_FILTER_KEYS)

    def partitions(self, routing: TableRouting) -> set[str] | None:
        """The partition names the filter allows, or None when it does not pin every
        partition-key column (or the table is not partitioned)."""
        if not routing.partitioned:
            return None
        combos = self._product(routing, routing.partition_key, MAX_FILTER_KEYS)
        if combos is None:
            return None
        return set(partition_names(combos, routing.partition_key)) if combos.num_rows else set()

    def buckets(self, routing: TableRouting) -> set[int] | None:
        """The buckets the filter allows, or None when it does not pin every bucket-key
        column."""
        combos = self._product(routing, routing.bucket_key, MAX_FILTER_KEYS)
        if combos is None:
            return None
        if combos.num_rows == 0:
            return set()
        return set(np.unique(bucket_ids(combos, list(routing.bucket_key),
                                        routing.bucket_count)).tolist())

    def _product(self, routing: TableRouting, columns, limit: int) -> pa.Table | None:
        if not columns or any(c not in self.values for c in columns):
            return None
        lists = [self.values[c] for c in columns]
        if int(np.prod([len(v) for v in lists], dtype=np.float64)) > limit:
            return None
        rows = list(itertools.product(*(v.to_pylist() for v in lists)))
        return pa.table({c: pa.array([r[i] for r in rows], routing.arrow_schema.field(c).type)
                         for i, c in enumerate(columns)})


def _typed(items: list, column: str, data_type: pa.DataType) -> pa.Array:
    """The distinct filter values of `column` as its type. Text that does not convert directly
    is cast exactly (a safe cast), so that JSON (a Spark option) can name dates, timestamps
    with their zone and decimals: "2026-11-23", "2026-11-23T10:00:00Z", "12.50"."""
    if pa.types.is_integer(data_type) and any(isinstance(v, (float, bool)) for v in items):
        # pyarrow would truncate 1.5 to 1 and take True for 1: a filter matches exactly
        raise InvalidInputError(f"the filter value(s) {items!r} of integer column {column!r} "
                                "must be integers")
    try:
        array = pa.array(items, type=data_type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
        try:
            if not all(isinstance(v, str) for v in items):
                raise TypeError("only text is cast")
            array = pa.array(items, pa.string()).cast(data_type, safe=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError,
                OverflowError):
            raise InvalidInputError(f"the filter value(s) {items!r} of column {column!r} do "
                                    f"not fit its type {data_type}: {e}") from None
    return pc.unique(array) if len(array) else array
