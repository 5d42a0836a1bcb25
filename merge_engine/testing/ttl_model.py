"""The reference model of the row TTL (`table.kv.row-ttl`): a ReferenceTable plus when each key
was last written, judged by a clock the test moves.

The rule it states, in plain Python: a row written at t is visible while now < t + ttl; a write
of an expired key starts it anew; every write of a key (put, or a delete that resets columns)
refreshes it; an undo to a baseline gives the baseline's rows with their baseline write times,
less those expired by now. When the -D of an expired row is written (lazily or by a sweep) is
invisible to readers, so the model need not know.
"""

from __future__ import annotations

import copy
from typing import Any

from merge_engine.testing.model import ReferenceTable


class ExpiringTable:
    """`ReferenceTable` with a row TTL of `ttl_ms`; `now_ms` is the model's clock."""

    def __init__(self, table: Any, ttl_ms: int, now_ms: int = 0):
        self.table = ReferenceTable(table)
        self.ttl_ms = ttl_ms
        self.now_ms = now_ms
        self.touched: dict[tuple, int] = {}

    def _key(self, row: dict) -> tuple:
        return tuple(row[k] for k in self.table.key_names)

    def _purge(self) -> None:
        """Forget expired keys (their rows are invisible, and a write starts them anew)."""
        gone = [k for k, t in self.touched.items() if self.now_ms >= t + self.ttl_ms]
        if gone:
            keys = [dict(zip(self.table.key_names, k)) for k in gone]
            self.table.delete(keys, mode="overwrite")
            for k in gone:
                del self.touched[k]

    def advance(self, ms: int) -> None:
        self.now_ms += ms

    def put(self, rows: list[dict], **kwargs) -> None:
        self._purge()
        self.table.put(rows, **kwargs)
        for row in rows:
            self.touched[self._key(row)] = self.now_ms

    def delete(self, keys: list[dict], **kwargs) -> None:
        self._purge()
        self.table.delete(keys, **kwargs)
        for key in keys:
            k = self._key(key)
            if self.table.lookup(key) is None:
                self.touched.pop(k, None)
            else:
                self.touched[k] = self.now_ms

    def rows(self) -> list[dict]:
        """The visible rows in key order (what `KvTablet.to_arrow()` gives)."""
        self._purge()
        return self.table.rows()

    def lookup(self, key: dict) -> dict | None:
        self._purge()
        return self.table.lookup(key)

    def baseline(self) -> "ExpiringTable":
        """A copy to undo to later (`undo_to`)."""
        return copy.deepcopy(self)

    def undo_to(self, baseline: "ExpiringTable") -> None:
        """The effect of undoing every write since `baseline` was taken."""
        self.table = copy.deepcopy(baseline.table)
        self.touched = dict(baseline.touched)
        self._purge()
