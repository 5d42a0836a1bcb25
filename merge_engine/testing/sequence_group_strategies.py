"""Hypothesis strategies for tables with sequence groups (`fields.<seq>.sequence-group`): the
specs; their writes come from `merge_engine.testing.strategies` (whose target columns draw
one group's partial writers, with their sequences, for such a spec)."""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa
from hypothesis import strategies as st

from aggfuncs import AggFunction as F
from merge_engine.table.descriptor import KV_BUFFER_SIZE
from merge_engine.testing.spec import (DELETE_BEHAVIOR, MERGE_ENGINE, SEQUENCE_FIELD,
                                       SEQUENCE_GROUP, SEQUENCED, ColumnSpec, TableSpec)
from merge_engine.testing.strategies import value_columns


@st.composite
def sequence_group_specs(draw, functions: Iterable[F | None] = SEQUENCED + (None, F.SUM),
                         min_groups: int = 1, max_groups: int = 3) -> TableSpec:
    """An aggregation table with 1-3 sequence groups (`fields.<seq>.sequence-group`): an int64
    key `k`; group g has the sequence `s{g}` (int64; now and then a second one, `t{g}`, a
    string) and one to three columns `g{g}v{i}`; now and then a column in no group (`free`),
    itself ordered by a table-wide sequence field `ts` or by arrival."""
    columns = [ColumnSpec("k", pa.int64(), nullable=False)]
    properties = {MERGE_ENGINE: "aggregation",
                  DELETE_BEHAVIOR: draw(st.sampled_from(["allow", "ignore"]))}
    for g in range(draw(st.integers(min_groups, max_groups))):
        sequence = [ColumnSpec(f"s{g}", pa.int64())]
        if draw(st.integers(0, 4)) == 0:
            sequence.append(ColumnSpec(f"t{g}", pa.string()))
        members = [draw(value_columns(f"g{g}v{i}", functions))
                   for i in range(draw(st.integers(1, 3)))]
        columns += sequence + members
        key = "fields." + ",".join(c.name for c in sequence) + SEQUENCE_GROUP
        properties[key] = ",".join(c.name for c in members)
    if draw(st.integers(0, 2)) == 0:
        columns.append(draw(value_columns("free", functions)))
        if draw(st.booleans()):
            columns.append(ColumnSpec("ts", pa.int64()))
            properties[SEQUENCE_FIELD] = "ts"
    buffer_size = draw(st.sampled_from([None, "0", "600"]))
    if buffer_size is not None:
        properties[KV_BUFFER_SIZE] = buffer_size
    return TableSpec(tuple(columns), ("k",), properties)
