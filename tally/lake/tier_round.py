"""One tiering round of one table: the lake moves from its offsets to the stable offsets in one
Delta commit.

A round reads the lake's newest Tally commit (its offsets and tiering epoch), claims the lake
table first when the epoch is new, asks the coordinator for the stable offsets (nothing below
them can be undone any more), reads each bucket's changelog between the two, folds it to the
net change per key and merges that into the lake as one commit carrying the new offsets. A
kill at any point leaves the lake at a commit whose offsets say exactly what it holds: the next
round starts from them, so nothing is lost or applied twice.

A bucket whose changelog no longer reaches back to the lake's offset (or a lake that has no
copy yet of a table whose log was truncated) is copied whole instead: a scan of the table,
rewound to the stable offsets with the first before-image of each key changed since, merged so
that every other lake row goes.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import pyarrow as pa

from locks.lease import offsets_from_json
from merge_engine.table.lake_options import lake_schema
from tally.errors import LakeError
from tally.lake.changelog_fold import DELETED, apply_changes, net_changes, start_images
from tally.lake.delta_table import DeltaLakeTable
from tally.meta.store import CrashPoints

log = logging.getLogger(__name__)

CHUNK_RECORDS = 50_000       # changelog records per request
ROUND_RECORDS = 2_000_000    # records one round reads at most (the rest waits for the next)


class TierCrashPoints(CrashPoints):
    """Kill the tiering process at a named step of a round (TALLY_TIER_CRASH_AT=<step>:<n>)."""

    ENV = "TALLY_TIER_CRASH_AT"


CRASH_STEPS = frozenset({
    "claim.commit",      # about to claim the lake table under a new tiering epoch
    "claim.committed",   # claimed, nothing copied yet
    "round.read",        # the changelog read and folded, nothing committed
    "round.committed",   # the lake commit made, not yet reported to the coordinator
    "round.reported",    # reported
    "full.read",         # a whole-table copy read, nothing committed
})
crash_point = TierCrashPoints(CRASH_STEPS)


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A table this process holds, as the coordinator's heartbeat answer gave it."""

    table_id: int
    name: str
    tiering_epoch: int
    path: str
    freshness_ms: int

    @classmethod
    def from_json(cls, doc: dict) -> "Assignment":
        return cls(int(doc["table_id"]), doc["name"], int(doc["tiering_epoch"]), doc["path"],
                   int(doc["freshness_ms"]))


@dataclasses.dataclass(frozen=True)
class RoundResult:
    version: int | None      # the lake version after the round
    offsets: dict            # the lake's offsets after the round
    records: int             # changelog records read
    rows: int                # rows merged into the lake (net changes)
    committed: bool          # whether the round made a commit
    full_copy: bool
    duration_ms: float

    def to_json(self) -> dict:
        return {"records": self.records, "rows": self.rows, "committed": self.committed,
                "full_copy": self.full_copy, "duration_ms": round(self.duration_ms, 1),
                "finished_at": time.time()}


def run_round(conn, assignment: Assignment, tier_id: str) -> RoundResult:
    """One round of `assignment`'s table (see the module docstring); TieringFencedError when
    another process took the table, LakeError when the lake table cannot be continued."""
    began = time.perf_counter()
    table = conn.table(assignment.name)
    if table.table_id != assignment.table_id:
        raise LakeError(f"table {assignment.name} is now table id {table.table_id}, not "
                        f"{assignment.table_id}: its tiering has ended")
    routing = table.routing
    schema = lake_schema(routing.arrow_schema)
    lake = DeltaLakeTable(assignment.path, assignment.table_id, list(routing.primary_key),
                          list(routing.partition_key)).load()
    lake.check_epoch(assignment.tiering_epoch)
    if lake.last is None or lake.last.tiering_epoch < assignment.tiering_epoch:
        crash_point("claim.commit")
        lake.claim(assignment.tiering_epoch, schema)
        crash_point("claim.committed")
    stable_answer = conn.coordinator_action("lake_stable_offsets", {
        "name": assignment.name, "table_id": assignment.table_id})
    stable = offsets_from_json(stable_answer["stable"])
    log_offsets = {(p, int(b)): (int(s), int(e)) for p, b, s, e in stable_answer["log_offsets"]}
    held = lake.offsets() or {}
    if any(held.get(key, 0) < start for key, (start, _end) in log_offsets.items()):
        return _full_copy(conn, table, lake, assignment, schema, stable, began)
    targets, records = {}, []
    budget = ROUND_RECORDS
    for key, (_start, end) in sorted(log_offsets.items(), key=lambda kv: (kv[0][0] or "",
                                                                         kv[0][1])):
        begin = held.get(key, 0)
        if end < begin:
            raise LakeError(f"table {assignment.name} {_where(key)}: its changelog ends at "
                            f"{end}, before the lake's offset {begin} (the bucket was restored "
                            "from an older copy): the lake holds changes the table lost")
        stop = min(stable[key], begin + max(budget, 0))
        targets[key] = max(begin, stop)
        if stop > begin:
            records.append(_read(table, key, begin, stop))
            budget -= stop - begin
    moved = any(targets[key] != held.get(key, 0) for key in targets) or \
        set(targets) != set(held)
    count = sum(r.num_rows for r in records)
    if not moved:
        return RoundResult(lake.version, held, 0, 0, False, False,
                           (time.perf_counter() - began) * 1000)
    changes = _changes(records, routing, schema)
    crash_point("round.read")
    version = lake.merge(changes, assignment.tiering_epoch, {**held, **targets})
    crash_point("round.committed")
    return RoundResult(version, {**held, **targets}, count, changes.num_rows, True, False,
                       (time.perf_counter() - began) * 1000)


def _where(key) -> str:
    partition, bucket = key
    return f"bucket {bucket}" if partition is None else f"partition '{partition}' bucket {bucket}"


def _read(table, key, start: int, stop: int) -> pa.Table:
    """The records [start, stop) of one bucket, all of them: a leader that serves fewer (a
    new leader whose followers have not confirmed them yet) fails the round, which is tried
    again, rather than the lake claiming offsets it does not hold."""
    partition, bucket = key
    parts = []
    for begin in range(start, stop, CHUNK_RECORDS):
        end = min(stop, begin + CHUNK_RECORDS)
        part = table.changelog(bucket, begin, end, partition=partition)
        if part.num_rows != end - begin:
            raise LakeError(f"table {table.name} {_where(key)}: its leader served "
                            f"{part.num_rows} of the records [{begin}, {end}) (not all "
                            "acknowledged there yet); the round is tried again")
        parts.append(part)
    return pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]


def _changes(records: list[pa.Table], routing, schema: pa.Schema) -> pa.Table:
    """The net change per key of every bucket's records, in the lake's types."""
    target = pa.schema([*schema, pa.field(DELETED, pa.bool_(), nullable=False)])
    if not records:
        return target.empty_table()
    columns = list(routing.arrow_schema.names)
    merged = pa.concat_tables([r.select(["_change_type", "_offset", *columns])
                               for r in records], promote_options="default")
    return net_changes(merged, list(routing.primary_key), columns).cast(target)


def _full_copy(conn, table, lake: DeltaLakeTable, assignment: Assignment, schema: pa.Schema,
               stable: dict, began: float) -> RoundResult:
    """Copy the whole table: the lake's offsets no longer meet the changelog."""
    routing = table.routing
    columns = list(routing.arrow_schema.names)
    scan = table.scan(columns)
    rows = scan.to_arrow()
    scanned = dict(scan.offsets)
    targets, rewinds = {}, []
    for key, at in scanned.items():
        target = min(at, stable.get(key, at))
        targets[key] = target
        if target < at:  # undoable changes in the scan: back to the stable offset
            rewinds.append(_read(table, key, target, at))
    if rewinds:
        merged = pa.concat_tables([r.select(["_change_type", "_offset", *columns])
                                   for r in rewinds], promote_options="default")
        rows = apply_changes(rows, start_images(merged, list(routing.primary_key), columns),
                             list(routing.primary_key))
    target_schema = pa.schema([*schema, pa.field(DELETED, pa.bool_(), nullable=False)])
    source = rows.append_column(DELETED, pa.array([False] * rows.num_rows, pa.bool_()))
    crash_point("full.read")
    version = lake.merge(source.cast(target_schema), assignment.tiering_epoch, targets,
                         full=True)
    crash_point("round.committed")
    log.warning("table %s: copied whole into the lake (%d rows) at version %d: its changelog "
                "no longer reached back to the lake's offsets", assignment.name, rows.num_rows,
                version)
    return RoundResult(version, targets, sum(t.num_rows for t in rewinds), rows.num_rows, True,
                       True, (time.perf_counter() - began) * 1000)
