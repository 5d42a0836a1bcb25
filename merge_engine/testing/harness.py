"""TabletHarness: one real KvTablet and one ReferenceTable driven by the same writes.

After each operation the harness checks that both agree: the same return value or the same
error class (and then no trace of the write), the same rows in key order, the same lookups, the
same log offsets, the same changelog record by record, and that replaying the tablet's
changelog into a fresh model gives the tablet's rows back.
"""

from __future__ import annotations

from typing import Any

from merge_engine.testing.model import ReferenceTable
from merge_engine.testing.ops import Delete, Put, Reopen, engine_mode
from merge_engine.testing.records import diff_records, records_from_arrow
from merge_engine.testing.spec import TableSpec
from merge_engine.testing.values import same_row
from tally.errors import TallyError


class TabletHarness:
    """Drive `KvTablet.open(path, descriptor)` and a `ReferenceTable` side by side.

    `table` is a TableSpec or an engine TableDescriptor. Use as a context manager, or call
    `close()`. `check_changelog=False` skips the record-by-record changelog comparison (the
    replay check still runs).
    """

    def __init__(self, table: Any, path: str, check_changelog: bool = True):
        from merge_engine.kv.tablet import KvTablet

        self.spec = TableSpec.of(table)
        self.descriptor = table if not isinstance(table, TableSpec) else table.descriptor()
        self.path = str(path)
        self.model = ReferenceTable(self.spec)
        self.check_changelog = check_changelog
        self._open = KvTablet.open
        self.tablet = KvTablet.open(self.path, self.descriptor)
        self.history: list[Any] = []

    def __enter__(self) -> "TabletHarness":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.tablet is not None:
            self.tablet.close()
            self.tablet = None

    def reopen(self) -> None:
        self.tablet.close()
        self.tablet = self._open(self.path, self.descriptor)

    # --- running operations -----------------------------------------------------------------

    def apply(self, op: Put | Delete | Reopen, check: bool = True) -> bool:
        """Run one operation on both sides, compare the outcomes (then the states).

        Returns whether the write was accepted (both sides agree on that, or this fails).
        """
        self.history.append(op)
        accepted = True
        if isinstance(op, Reopen):
            self.reopen()
        else:
            start = self.model.log_end_offset
            expected = self._outcome(lambda: op.apply(self.model))
            try:
                actual = self._outcome(lambda: self._apply_to_tablet(op))
            except Exception as exc:  # every error a user can meet must be a TallyError
                raise AssertionError(
                    f"{self._where(op)}the engine raised {type(exc).__module__}."
                    f"{type(exc).__name__}({exc}), which is not a TallyError; the model gave "
                    f"{expected[1]!r}"
                ) from exc
            self._compare_outcomes(op, expected, actual, start)
            accepted = expected[0] == "ok"
        if check:
            self.check()
        return accepted

    def run(self, ops) -> None:
        for op in ops:
            self.apply(op)

    def _apply_to_tablet(self, op: Put | Delete) -> int:
        if isinstance(op, Put) and op.arrow:
            return op.apply(self.tablet, engine_mode(op.mode), convert=self.spec.arrow_rows)
        return op.apply(self.tablet, engine_mode(op.mode))

    @staticmethod
    def _outcome(call) -> tuple[str, Any]:
        try:
            return "ok", call()
        except TallyError as exc:
            return "error", exc

    def _compare_outcomes(self, op, expected, actual, start: int) -> None:
        where = self._where(op)
        if expected[0] == "error":
            assert actual[0] == "error", (
                f"{where}the model raised {type(expected[1]).__name__}({expected[1]}) "
                f"but the engine returned {actual[1]!r}"
            )
            assert isinstance(actual[1], type(expected[1])), (
                f"{where}the model raised {type(expected[1]).__name__}({expected[1]}) "
                f"but the engine raised {type(actual[1]).__name__}({actual[1]})"
            )
        else:
            assert actual[0] == "ok", (
                f"{where}the engine raised {type(actual[1]).__name__}({actual[1]}) but the model "
                f"accepted the write (log end offset {expected[1]})"
            )
            if actual[1] != expected[1]:
                written = records_from_arrow(self.tablet.changelog(start), self.spec.names)
                problem = diff_records(self.model.changelog_records(start), written)
                raise AssertionError(
                    f"{where}the engine returned offset {actual[1]}, the model {expected[1]}; "
                    f"records of this write: {problem}"
                )

    def _where(self, op=None) -> str:
        last = op if op is not None else (self.history[-1] if self.history else None)
        return f"after {len(self.history)} operations (last: {last!r}):\n"

    # --- comparing states -------------------------------------------------------------------

    def check(self) -> None:
        """Assert that the tablet and the model agree on everything observable."""
        rows = self.check_rows()
        self.check_lookups(rows)
        self.check_offsets()
        records = records_from_arrow(self.tablet.changelog(), self.spec.names)
        if self.check_changelog:
            self.check_changelog_records(records)
        self.check_replay(records, rows)

    def check_rows(self) -> list[dict]:
        """to_arrow: the schema's columns and types, the model's rows in key order."""
        where = self._where()
        table = self.tablet.to_arrow()
        assert table.schema.names == self.spec.names, (
            f"{where}to_arrow columns {table.schema.names} != schema order {self.spec.names}"
        )
        for column in self.spec.columns:
            actual_type = table.schema.field(column.name).type
            assert actual_type == column.type, (
                f"{where}to_arrow column {column.name} has type {actual_type}, not {column.type}"
            )
        actual_rows = table.to_pylist()
        expected_rows = self.model.rows()
        assert len(actual_rows) == len(expected_rows) and all(
            same_row(a, e) for a, e in zip(actual_rows, expected_rows)
        ), f"{where}to_arrow rows differ:\n  expected {expected_rows}\n  actual   {actual_rows}"
        return actual_rows

    def check_lookups(self, rows: list[dict]) -> None:
        """lookup finds every row, and finds nothing for keys the model has deleted."""
        where = self._where()
        for row in rows:
            key = {k: row[k] for k in self.spec.primary_key}
            found = self.tablet.lookup(key)
            assert same_row(found, row), f"{where}lookup({key}) gave {found}, expected {row}"
        for rec in self.model.changelog:
            key = {k: rec.image[k] for k in self.spec.primary_key}
            if self.model.lookup(key) is None:
                found = self.tablet.lookup(key)
                assert found is None, f"{where}lookup({key}) of a deleted key gave {found}"

    def check_offsets(self) -> None:
        where = self._where()
        assert self.tablet.log_start_offset == self.model.log_start_offset, (
            f"{where}log_start_offset {self.tablet.log_start_offset} != {self.model.log_start_offset}"
        )
        assert self.tablet.log_end_offset == self.model.log_end_offset, (
            f"{where}log_end_offset {self.tablet.log_end_offset} != {self.model.log_end_offset}"
        )

    def check_changelog_records(self, records) -> None:
        """The whole changelog record by record, and a tail read with `changelog(start)`."""
        where = self._where()
        problem = diff_records(self.model.changelog, records)
        assert problem is None, f"{where}{problem}"
        middle = self.model.log_end_offset // 2
        if middle:
            tail = records_from_arrow(self.tablet.changelog(middle), self.spec.names)
            problem = diff_records(self.model.changelog_records(middle), tail)
            assert problem is None, f"{where}changelog({middle}): {problem}"

    def check_replay(self, records, rows: list[dict]) -> None:
        """Replaying the tablet's changelog gives the tablet's rows and the model's written bits."""
        where = self._where()
        replayed = ReferenceTable(self.spec).replay(records)
        replay_rows = replayed.rows()
        assert len(replay_rows) == len(rows) and all(
            same_row(a, e) for a, e in zip(replay_rows, rows)
        ), f"{where}the replay of the changelog differs from KV:\n  replay {replay_rows}\n  KV     {rows}"
        for got, want in zip(replayed.states(), self.model.states()):
            assert got.unwritten == want.unwritten, (
                f"{where}replayed unwritten columns {sorted(got.unwritten)} != model "
                f"{sorted(want.unwritten)} for row {want.values}"
            )
