"""A table's lake copy in Delta Lake, through delta-rs (no JVM).

Every commit Tally makes carries, in its commit metadata, the table id, the tiering epoch, the
per-bucket offsets the lake holds from then on and those it held before (so the history is a
chain: each commit starts where the one before ended), and an app transaction under one app id.
The app transaction is what fences: Delta refuses a commit carrying the app id when another
commit carrying it landed since the version the writer read, so of two tiering processes that
read the same version only one commits. A process that takes a table over first writes a claim
commit under its new tiering epoch; an older holder then either conflicts with the claim or
reads the newer epoch from the lake and stops.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pyarrow as pa

from locks.lease import offsets_from_json, offsets_to_json
from tally.errors import LakeError, MissingDependencyError, TieringFencedError
from tally.lake.changelog_fold import DELETED

log = logging.getLogger(__name__)

APP_ID = "tally-tiering"
TABLE_ID, EPOCH, OFFSETS, START, KIND = ("tally.table_id", "tally.tiering_epoch",
                                         "tally.offsets", "tally.start_offsets", "tally.kind")
Offsets = dict[tuple[str | None, int], int]


def deltalake():
    try:
        import deltalake as module
    except ImportError:
        raise MissingDependencyError("the lake needs the deltalake package, which this Python "
                                     "cannot import: pip install 'tally-aggregates[lake]' "
                                     "(in a clone: pip install -e '.[lake]')") from None
    return module


@dataclasses.dataclass(frozen=True)
class LakeCommit:
    """What one Tally commit of the lake table says."""

    version: int
    table_id: int
    tiering_epoch: int
    offsets: Offsets
    start: Offsets
    kind: str


def lake_commit(entry: dict) -> LakeCommit | None:
    """The Tally commit a Delta history entry is, or None (a commit of another writer)."""
    if OFFSETS not in entry:
        return None
    return LakeCommit(int(entry["version"]), int(entry[TABLE_ID]), int(entry[EPOCH]),
                      offsets_from_json(json.loads(entry[OFFSETS])),
                      offsets_from_json(json.loads(entry.get(START) or "[]")),
                      entry.get(KIND, "round"))


class DeltaLakeTable:
    """One lake table, opened at its newest version."""

    def __init__(self, path: str, table_id: int, primary_key: list[str],
                 partition_key: list[str]) -> None:
        self.path = path
        self.table_id = table_id
        self.primary_key = primary_key
        self.partition_key = partition_key
        self.table = None          # the DeltaTable, None before the first commit
        self.last: LakeCommit | None = None  # the newest Tally commit

    def load(self) -> "DeltaLakeTable":
        """Read the newest version and the newest Tally commit of the lake table."""
        dl = deltalake()
        try:
            self.table = dl.DeltaTable(self.path)
        except dl.exceptions.TableNotFoundError:
            self.table, self.last = None, None  # a create killed midway leaves no commit
            return self
        self.last = self._newest_commit()
        if self.last is not None and self.last.table_id != self.table_id:
            raise LakeError(f"the lake table at {self.path} belongs to table id "
                            f"{self.last.table_id}, not {self.table_id} (the table was dropped "
                            "and re-created): move it away or drop with purge_lake")
        return self

    def _newest_commit(self) -> LakeCommit | None:
        limit = 8
        while True:
            entries = self.table.history(limit)
            for entry in entries:  # newest first
                found = lake_commit(entry)
                if found is not None:
                    return found
            if len(entries) < limit:
                raise LakeError(f"the lake table at {self.path} has no commit of Tally's: it "
                                "was not made by tiering (move it away)")
            limit *= 4

    @property
    def version(self) -> int | None:
        return None if self.table is None else self.table.version()

    def offsets(self) -> Offsets | None:
        return None if self.last is None else self.last.offsets

    def check_epoch(self, epoch: int) -> None:
        """Refuse to go on under `epoch` when the lake was claimed under a newer one."""
        if self.last is not None and self.last.tiering_epoch > epoch:
            raise TieringFencedError(
                f"the lake table at {self.path} was claimed under tiering epoch "
                f"{self.last.tiering_epoch}, past this process's {epoch}: it no longer tiers "
                "this table")

    # --- commits ----------------------------------------------------------------------------

    def _properties(self, epoch: int, offsets: Offsets, start: Offsets, kind: str):
        dl = deltalake()
        return dl.CommitProperties(
            app_transactions=[dl.Transaction(APP_ID, epoch)],
            custom_metadata={TABLE_ID: str(self.table_id), EPOCH: str(epoch),
                             OFFSETS: json.dumps(offsets_to_json(offsets)),
                             START: json.dumps(offsets_to_json(start)), KIND: kind})

    def claim(self, epoch: int, schema: pa.Schema) -> None:
        """Take the lake table under `epoch`: create it (empty, with `schema`) or commit an
        empty append under the new epoch, holding the offsets it holds."""
        dl = deltalake()
        offsets = self.offsets() or {}
        properties = self._properties(epoch, offsets, offsets, "claim")
        try:
            if self.table is None:
                dl.DeltaTable.create(self.path, schema, mode="error",
                                     partition_by=self.partition_key or None,
                                     commit_properties=properties)
            else:
                dl.write_deltalake(self.table, schema.empty_table(), mode="append",
                                   schema_mode="merge", commit_properties=properties)
        except (dl.exceptions.CommitFailedError, FileExistsError) as e:
            self._conflicted(epoch, e)
        self.load()

    def merge(self, changes: pa.Table, epoch: int, offsets: Offsets, *,
              full: bool = False) -> int:
        """Apply net changes (rows with DELETED) as one commit that moves the lake's offsets
        to `offsets`; with `full`, `changes` is the whole table and every other row goes.
        The version committed."""
        dl = deltalake()
        start = self.offsets() or {}
        properties = self._properties(epoch, offsets, start, "full" if full else "round")
        before = self.version
        try:
            if changes.num_rows or full:
                self._merger(changes, properties, full).execute()
                self.load()
            if self.version == before:
                # a MERGE that changes no row (nothing to merge, or only removals of rows the
                # lake never had) makes no commit: the offsets must move all the same
                empty = changes.drop_columns([DELETED]).schema.empty_table()
                dl.write_deltalake(self.table, empty, mode="append", schema_mode="merge",
                                   commit_properties=properties)
        except dl.exceptions.CommitFailedError as e:
            self._conflicted(epoch, e)
        self.load()
        return self.version

    def _conflicted(self, epoch: int, error: Exception):
        """A commit under `epoch` lost to a concurrent one: fenced when that one claimed a
        newer epoch, else (another writer, such as a compaction) worth trying again."""
        self.load()
        if self.last is not None and self.last.tiering_epoch > epoch:
            raise TieringFencedError(f"the lake table at {self.path} was claimed under tiering "
                                     f"epoch {self.last.tiering_epoch}, past this process's "
                                     f"{epoch}: its commit was refused ({error})") from None
        raise LakeError(f"a commit to the lake table at {self.path} conflicted with a "
                        f"concurrent commit; the round is tried again ({error})") from None

    def _merger(self, changes: pa.Table, properties, full: bool):
        on = " AND ".join(f"t.{_quote(k)} = s.{_quote(k)}" for k in self.primary_key)
        values = [c for c in changes.column_names if c != DELETED]
        assign = {_quote(c): f"s.{_quote(c)}" for c in values}
        merger = self.table.merge(changes, on, source_alias="s", target_alias="t",
                                  merge_schema=True, commit_properties=properties)
        merger = merger.when_matched_delete(predicate=f"s.{DELETED}")
        merger = merger.when_matched_update(assign, predicate=f"NOT s.{DELETED}")
        merger = merger.when_not_matched_insert(assign, predicate=f"NOT s.{DELETED}")
        if full:
            merger = merger.when_not_matched_by_source_delete()
        return merger

    # --- reads ------------------------------------------------------------------------------

    def history(self) -> list[LakeCommit]:
        """Every Tally commit, oldest first."""
        return sorted((c for c in map(lake_commit, self.table.history()) if c is not None),
                      key=lambda c: c.version)


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"
