"""What an upsert writer of a source table writes into the source's rollups.

The writer learns the source's rollups when it is made (rollups made later are not fed by it)
and keeps one writer per rollup it feeds. Each upsert's rows are projected onto every rollup
(`RollupSpec.project`) and all parts are validated before any is queued, so a bad row leaves
every table untouched. A flush settles the source's writer and the rollups' together: their
outcomes are joined into one, keyed by each rollup's name in place of the partition, so an
all-or-nothing flush that one table refuses takes back the parts every table applied, exactly
as the source's own buckets are taken back.
"""

from __future__ import annotations

import dataclasses

from tally.client.flush_outcome import FlushOutcome
from tally.errors import RollupBuildingError


@dataclasses.dataclass
class RollupFeed:
    spec: object        # merge_engine.table.rollups.RollupSpec
    fed: list[str]      # its aggregate columns this writer's columns feed
    writer: object      # the UpsertWriter of the rollup table


def feeds_of(table, target_columns, mode, workers: int, atomic: bool) -> list[RollupFeed]:
    """A writer per rollup of `table` that writes of `target_columns` in `mode` feed;
    InvalidInputError when a rollup cannot be fed in that mode, RollupBuildingError while one
    is being backfilled."""
    from merge_engine.table.rollups import BUILDING

    meta = table.connection.table_meta(table.name, refresh=True, table_id=table.table_id)
    schema = meta.descriptor.schema
    written = schema.names if target_columns is None else list(target_columns)
    feeds = []
    for spec in meta.rollups:
        fed = spec.fed_columns(written)
        if not fed:
            continue
        if spec.state == BUILDING:
            raise RollupBuildingError(
                f"rollup {spec.name} of {table.name} is being backfilled: a writer of "
                f"{table.name} is made once it is ready (nothing was written; try again)")
        spec.check_mode(mode, schema, written)
        keys = [k.name for k in spec.keys]
        writer = table.connection.table(spec.name).upsert_writer(
            target_columns=keys + fed, mode=mode, rollups=False, workers=workers,
            atomic=atomic)
        feeds.append(RollupFeed(spec, fed, writer))
    return feeds


def rollup_parts(feeds: list[RollupFeed], rows) -> list[tuple]:
    """(writer, its table's metadata, its validated rows) of every rollup, for the source's
    validated `rows`: all made before the caller queues any."""
    from tally.client.write_tables import write_table

    parts = []
    for feed in feeds:
        writer = feed.writer
        meta = writer._table.meta
        parts.append((writer, meta, write_table(meta, feed.spec.project(rows, feed.fed),
                                                writer.target_columns, writer.mode)))
    return parts


def joined_outcome(outcome: FlushOutcome, undo, feeds: list[RollupFeed]):
    """(one FlushOutcome of the source's and every rollup's flush, the undo of a key of it):
    a rollup's bucket is keyed ("<rollup>[/<partition>]", bucket)."""
    combined = FlushOutcome()
    routes: dict = {}

    def add(name, part: FlushOutcome, part_undo) -> None:
        for key in list(part.buckets) + [k for k in part.refused if k not in part.buckets]:
            partition, bucket = key
            joined = key if name is None else \
                (name if partition is None else f"{name}/{partition}", bucket)
            routes[joined] = (part_undo, key)
            if key in part.buckets:
                combined.buckets[joined] = part.buckets[key]
            if key in part.refused:
                combined.refused[joined] = part.refused[key]

    add(None, outcome, undo)
    for feed in feeds:
        add(feed.spec.name, feed.writer.settle(), feed.writer._undo)

    def undo_joined(key, records):
        part_undo, original = routes[key]
        return part_undo(original, records)

    return combined, undo_joined
