"""The ingest workload: one table shape and deterministic Arrow batches for it.

Every measurement runs in its own process, so the data must be regenerated identically in each
one: each batch comes from its own seeded generator (seed, batch index), which also lets a
process make one batch at a time and never hold the whole data set (the peak RSS we report is
then the engine's, not the input's).

Keys are scrambled with an odd multiplier modulo 2**40, a bijection: key numbers 0..K-1 map to
distinct ids spread over a wide range, so key order differs from arrival order as in real data,
without keeping a table of ids in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

KEY_BITS = 40
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd, so multiplication mod 2**40 is a bijection
_MASK = np.uint64((1 << KEY_BITS) - 1)

TAGS = pa.array([f"t{i}" for i in range(1000)], pa.string())
STATUSES = pa.array(["new", "paid", "packed", "shipped", "delivered", "returned"], pa.string())
TAG_NULL_SHARE = 0.05  # string_agg must skip null inputs
STATUS_NULL_SHARE = 0.3  # last_value_ignore_nulls must keep the stored value on a null

ARROW_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("qty", pa.int64()),
        pa.field("price", pa.float64()),
        pa.field("tag", pa.string()),
        pa.field("status", pa.string()),
    ]
)


def key_ids(numbers: np.ndarray) -> np.ndarray:
    """The int64 id of each key number (a bijection on 0..2**40-1)."""
    scrambled = (numbers.astype(np.uint64) * _MULTIPLIER) & _MASK
    return scrambled.astype(np.int64)


@dataclass(frozen=True)
class Workload:
    """`rows` input rows in batches of `batch` over `keys` keys (None: every row a new key)."""

    rows: int
    keys: int | None
    batch: int = 100_000
    seed: int = 42

    @property
    def distinct_keys(self) -> int:
        return self.rows if self.keys is None else self.keys

    @property
    def label(self) -> str:
        if self.keys is None:
            return f"{self.rows:,} unique keys"
        return f"{self.rows:,} rows over {self.keys:,} keys"

    def batch_count(self) -> int:
        return -(-self.rows // self.batch)

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The input, one RecordBatch at a time, identical in every process."""
        for index in range(self.batch_count()):
            yield self.make_batch(index)

    def make_batch(self, index: int) -> pa.RecordBatch:
        start = index * self.batch
        n = min(self.batch, self.rows - start)
        rng = np.random.default_rng([self.seed, index])
        if self.keys is None:
            # each row a new key; shuffled within the batch so ids do not arrive in key order
            numbers = rng.permutation(np.arange(start, start + n, dtype=np.int64))
        else:
            numbers = rng.integers(0, self.keys, size=n, dtype=np.int64)
        ids = key_ids(numbers)
        qty = rng.integers(-100, 1000, size=n, dtype=np.int64)
        price = np.round(rng.random(n) * 1000.0, 2)
        tag_index = pa.array(rng.integers(0, len(TAGS), size=n), mask=rng.random(n) < TAG_NULL_SHARE)
        status_index = pa.array(
            rng.integers(0, len(STATUSES), size=n), mask=rng.random(n) < STATUS_NULL_SHARE
        )
        return pa.RecordBatch.from_arrays(
            [
                pa.array(ids, pa.int64()),
                pa.array(qty, pa.int64()),
                pa.array(price, pa.float64()),
                pc.take(TAGS, tag_index),  # a null index gives a null string
                pc.take(STATUSES, status_index),
            ],
            schema=ARROW_SCHEMA,
        )

    def sample_ids(self, count: int) -> list[int]:
        """`count` key ids spread over the key space, the same in every process."""
        rng = np.random.default_rng([self.seed, 1_000_003])
        total = self.distinct_keys
        numbers = rng.choice(total, size=min(count, total), replace=False)
        return [int(i) for i in key_ids(np.sort(numbers))]


def table_schema():
    """The engine's schema: id key; qty sum, price max, tag string_agg(','), status last
    non-null.

    Imported lazily so the naive runner's process never loads the engine.
    """
    from aggfuncs import AggFunction
    from merge_engine import Schema

    return (
        Schema.builder()
        .column("id", pa.int64(), nullable=False)
        .agg_column("qty", pa.int64(), AggFunction.SUM)
        .agg_column("price", pa.float64(), AggFunction.MAX)
        .agg_column("tag", pa.string(), AggFunction.STRING_AGG, delimiter=",")
        .agg_column("status", pa.string(), AggFunction.LAST_VALUE_IGNORE_NULLS)
        .primary_key("id")
        .build()
    )


def table_descriptor():
    """The engine's table (`table_schema`) with the aggregation merge engine."""
    from merge_engine import TableDescriptor

    return TableDescriptor(table_schema(), properties={"table.merge-engine": "aggregation"})
