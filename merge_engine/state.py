"""StateBatch: rows as stored, i.e. column values plus one written bit per cell."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass
class StateBatch:
    """`columns` are in schema order; `written[i, j]` says whether a write ever targeted cell
    (i, j). Key columns are always written."""

    columns: list[pa.Array]
    written: np.ndarray

    def __len__(self) -> int:
        return len(self.written)

    def take(self, indices: np.ndarray) -> "StateBatch":
        index = pa.array(np.asarray(indices, dtype=np.int64), type=pa.int64())
        return StateBatch([c.take(index) for c in self.columns], self.written[indices])

    @staticmethod
    def concat(first: "StateBatch", second: "StateBatch") -> "StateBatch":
        columns = [pa.concat_arrays([a, b.cast(a.type)]) for a, b in zip(first.columns, second.columns)]
        return StateBatch(columns, np.concatenate([first.written, second.written]))

    def to_table(self, names: list[str]) -> pa.Table:
        return pa.Table.from_arrays(self.columns, names=names)
