"""The rollups a Spark write feeds: for each rollup of the source, the columns the write feeds,
the plan of writing them and the owner that locks them.

A rollup's rows are the source rows projected (its key: source columns and time buckets; its
aggregate columns: the inputs of source columns), one per source row, folded and written like
any write. The write of rollup R by source owner O runs under its own owner id, derived from
O, so a restarted O gets R's lock back with its own and recovers both, and two writers of the
source that feed disjoint columns of R lock disjoint columns of R too. Aggregating writes feed
every rollup; a MERGE_STATE write feeds only rollups whose columns merge the same states; an
OVERWRITE write cannot be rolled up and is refused (the rollup definition decides).
"""

from __future__ import annotations

import dataclasses
import hashlib

import pyarrow as pa

from merge_engine import MergeMode
from sink.owner import lock_columns
from sink.plan import WritePlan, info_routing
from tally.errors import InvalidInputError
from tally.meta import node_name


@dataclasses.dataclass(frozen=True)
class RollupFeed:
    """One rollup a write feeds (picklable: Spark ships it to the tasks that project rows)."""

    spec_json: dict
    plan: WritePlan            # the write into the rollup table
    fed: tuple[str, ...]       # its aggregate columns this write feeds
    # The source write's string columns mapped through dictionaries (sink.dictionary_ids):
    # a rollup over such a column takes the same ids the source does.
    dictionaries: tuple = ()

    @property
    def table(self) -> str:
        return self.plan.table

    @property
    def spec(self):
        cached = self.__dict__.get("_spec")
        if cached is None:
            from merge_engine.table.rollups import RollupSpec

            cached = RollupSpec.from_json(self.spec_json)
            object.__setattr__(self, "_spec", cached)
        return cached

    def project(self, rows: pa.Table | pa.RecordBatch) -> pa.Table:
        """The rollup's rows of table-named source rows (the sink's own columns dropped)."""
        if self.dictionaries:
            from sink.dictionary_ids import map_ids

            batches = rows.to_batches() if isinstance(rows, pa.Table) else [rows]
            label = f"the rows of rollup {self.table}"
            if batches:
                rows = pa.Table.from_batches([map_ids(self.dictionaries, b, label)
                                              for b in batches])
        if isinstance(rows, pa.RecordBatch):
            rows = pa.Table.from_batches([rows])
        extra = [n for n in rows.column_names if n.startswith("__tally_")]
        if extra:
            rows = rows.drop_columns(extra)
        return self.spec.project(rows, list(self.fed))

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_spec", None)
        return state


def rollup_feeds(conn, source: WritePlan) -> list[RollupFeed]:
    """The feeds of every rollup the source's catalog lists now that this write feeds (a
    rollup none of whose columns the write's columns reach is left alone)."""
    rollups = list(getattr(conn.admin.describe_table(source.table), "rollups", None) or ())
    if not rollups:
        return []
    written = [c for c in source.target_columns if c not in source.key_columns]
    feeds = []
    for spec in rollups:
        fed = tuple(spec.fed_columns(written))
        if not fed:
            continue
        spec.check_mode(source.mode, source.descriptor.schema, written)
        plan = rollup_plan(conn.admin.describe_table(spec.name), spec, fed, source.mode)
        feeds.append(RollupFeed(spec.to_json(), plan, fed, tuple(source.dictionaries)))
    return feeds


def rollup_plan(info, spec, fed: tuple[str, ...], mode: MergeMode) -> WritePlan:
    """The plan of writing a rollup's key and its `fed` columns: its rows come projected, under
    the rollup's own names, so the write selects nothing."""
    schema = info.descriptor.schema
    wanted = set(schema.primary_key) | set(fed)
    missing = sorted(wanted - set(schema.names))
    if missing:
        raise InvalidInputError(
            f"Rollup {spec.name} lacks column(s) {missing} its definition names; drop and "
            "create it again")
    targets = tuple(n for n in schema.names if n in wanted)
    bucket_key, partitioned = info_routing(info)
    return WritePlan(
        table=info.name, table_id=int(info.table_id),
        descriptor_json=info.descriptor.to_json(), bucket_count=info.descriptor.bucket_count,
        input_columns=targets, table_columns=targets, target_columns=targets,
        lock_columns=tuple(lock_columns(schema, None if len(targets) == len(schema.names)
                                        else targets)),
        key_columns=tuple(schema.primary_key), bucket_key=bucket_key, partitioned=partitioned,
        mode=mode, sequence_column=None, dataframe_columns=targets)


def rollup_owner_id(source_owner: str, rollup: str) -> str:
    """The owner id under which source owner `source_owner` writes rollup `rollup`: the same
    on every run of that owner, distinct per rollup."""
    owner = f"{source_owner}/rollup/{rollup}"
    try:
        node_name(owner)
        return owner
    except InvalidInputError:
        digest = hashlib.sha256(owner.encode()).hexdigest()[:32]
        return f"rollup:{rollup}/sha256-{digest}"
