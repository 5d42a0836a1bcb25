"""TableDescriptor: a schema plus the table options that decide how writes are merged."""

from __future__ import annotations

import json

from merge_engine.table.lake_options import LAKE_OPTIONS, LakeSettings, lake_settings
from merge_engine.table.modes import DeleteBehavior
from merge_engine.table.option_values import parse_bool_option
from merge_engine.table.schema import Schema
from merge_engine.table.sequence_groups import (SEQUENCE_FIELD, SequenceGroup, column_orders,
                                                sequence_column_problem, sequence_groups)
from tally.durations import parse_duration_ms
from tally.errors import InvalidOptionError, SchemaError
from tally.sizes import parse_size

MERGE_ENGINE = "table.merge-engine"
DELETE_BEHAVIOR = "table.delete.behavior"
CHANGELOG_IMAGE = "table.changelog.image"
COLUMN_LOCK_ENABLED = "table.column-lock.enabled"
KV_SYNC = "table.kv.sync"
KV_BUFFER_SIZE = "table.kv.buffer-size"
# `table.sequence-field` (SEQUENCE_FIELD): columns whose values order the writes of a key for
# the value-selection functions; `fields.<seq>.sequence-group` gives a group its own.
DEFAULT_KV_BUFFER_SIZE = 64 << 20
# A key not written for longer than this expires (merge_engine/kv/row_ttl.py); unset: never.
ROW_TTL = "table.kv.row-ttl"
BUCKET_NUM = "bucket.num"

# Changelog retention (the policy: merge_engine/kv/log_retention.py).
RETENTION_OFFSETS = "table.log.retention.offsets"
RETENTION_MS = "table.log.retention.ms"
RETENTION_IGNORE_LOCKS = "table.log.retention.ignore-locks"
# How long retention keeps the changelog an expired, unrecovered lock tenure needs for its undo.
EXPIRED_LOCK_RETENTION = "table.log.retention.expired-lock-ms"
DEFAULT_EXPIRED_LOCK_RETENTION_MS = 7 * 24 * 3600 * 1000
# How long a changelog consumer's registered position holds retention back after the consumer
# last registered it (the bound on what an idle or abandoned consumer can keep).
CONSUMER_RETENTION = "table.log.retention.consumer-ms"
DEFAULT_CONSUMER_RETENTION_MS = 7 * 24 * 3600 * 1000

# Every `table.*` option Tally understands; anything else under `table.` is a typo to report.
KNOWN_TABLE_OPTIONS = {
    MERGE_ENGINE,
    DELETE_BEHAVIOR,
    CHANGELOG_IMAGE,
    COLUMN_LOCK_ENABLED,
    KV_SYNC,
    KV_BUFFER_SIZE,
    SEQUENCE_FIELD,
    ROW_TTL,
    "table.partition.dynamic-creation.enabled",
    RETENTION_OFFSETS,
    RETENTION_MS,
    RETENTION_IGNORE_LOCKS,
    EXPIRED_LOCK_RETENTION,
    CONSUMER_RETENTION,
    "table.agg.remove-record-on-empty",
    "table.replication.factor",  # read by the coordinator's placement, not by the tablet
    "table.replication.lag-time-ms",  # read by the coordinator, sent to bucket leaders
    *LAKE_OPTIONS,  # read by the tiering service
}

AGGREGATION = "aggregation"


def sequence_field_problem(descriptor: "TableDescriptor", names: tuple[str, ...]) -> str | None:
    """Why `names` cannot be the sequence field of the table, or None."""
    if not descriptor.is_aggregation:
        return (f"a sequence field orders the writes of aggregation tables; set "
                f"'{MERGE_ENGINE}' = '{AGGREGATION}'")
    if not all(names) or len(set(names)) != len(names):
        return "give distinct column names separated by commas"
    for name in names:
        problem = sequence_column_problem(descriptor.schema, name)
        if problem:
            return problem
    return None


class TableDescriptor:
    """A table: its schema, bucket count and validated properties."""

    def __init__(self, schema: Schema, bucket_count: int | None = None,
                 properties: dict | None = None):
        if not isinstance(schema, Schema):
            raise SchemaError(f"TableDescriptor needs a Schema, got {type(schema).__name__}")
        self.schema = schema
        self.properties = {str(k): str(v) if not isinstance(v, str) else v
                           for k, v in (properties or {}).items()}
        self.bucket_count = self._resolve_bucket_count(bucket_count)
        self._validate()

    # --- validation -------------------------------------------------------------------------

    def _resolve_bucket_count(self, bucket_count: int | None) -> int:
        option = self.properties.pop(BUCKET_NUM, None)
        if option is not None:
            try:
                option = int(option)
            except ValueError:
                raise InvalidOptionError(
                    f"Invalid value for option '{BUCKET_NUM}': {option!r} (expected a positive integer)"
                ) from None
        if bucket_count is not None and option is not None and bucket_count != option:
            raise InvalidOptionError(
                f"bucket_count={bucket_count} and '{BUCKET_NUM}'={option} disagree; give one"
            )
        count = bucket_count if bucket_count is not None else option if option is not None else 1
        if not isinstance(count, int) or count < 1:
            raise InvalidOptionError(f"The bucket count must be a positive integer, got {count!r}")
        return count

    def _validate(self) -> None:
        for key in self.properties:
            if key.startswith("table.") and key not in KNOWN_TABLE_OPTIONS:
                raise InvalidOptionError(
                    f"Unknown table option '{key}'. Known options: {sorted(KNOWN_TABLE_OPTIONS)}"
                )
        engine = self.properties.get(MERGE_ENGINE)
        if engine is not None:
            if engine.strip().lower() != AGGREGATION:
                raise InvalidOptionError(
                    f"Invalid value for option '{MERGE_ENGINE}': {engine!r}. Tally supports "
                    f"'{AGGREGATION}' (or no merge engine for last-write-wins)."
                )
            self.properties[MERGE_ENGINE] = AGGREGATION
        if self.is_aggregation and not self.schema.primary_key:
            raise SchemaError("The aggregation merge engine needs a primary key table")
        if not self.is_aggregation:
            for c in self.schema.columns:
                if c.agg is not None:
                    raise SchemaError(
                        "Aggregation function is only supported for aggregation merge engine "
                        f"tables, but column '{c.name}' has aggregation function "
                        f"'{c.agg.value}'. Set '{MERGE_ENGINE}' = '{AGGREGATION}'."
                    )
        image = self.properties.get(CHANGELOG_IMAGE, "FULL").strip().upper()
        if image != "FULL":
            raise InvalidOptionError(
                f"Invalid value for option '{CHANGELOG_IMAGE}': {image!r}. Tally writes FULL "
                "before and after images only: aggregation tables need them for undo recovery."
            )
        self.delete_behavior  # validates the value
        for key in (RETENTION_OFFSETS, RETENTION_MS, EXPIRED_LOCK_RETENTION, CONSUMER_RETENTION):
            if key in self.properties:
                value = self.properties[key]
                if not str(value).strip().isdigit():
                    raise InvalidOptionError(
                        f"Invalid value for option '{key}': {value!r} (expected a non-negative integer)")
        self.kv_buffer_size  # validates the value
        self.sequence_fields  # validates the columns
        self.sequence_groups  # validates the groups' options
        self.row_ttl_ms  # validates the value
        self.lake  # validates the lake options, and the columns when the lake is enabled
        for key in (COLUMN_LOCK_ENABLED, KV_SYNC, RETENTION_IGNORE_LOCKS,
                    "table.agg.remove-record-on-empty",
                    "table.partition.dynamic-creation.enabled"):
            if key in self.properties:
                parse_bool_option(key, self.properties[key])

    # --- derived settings -------------------------------------------------------------------

    @property
    def is_aggregation(self) -> bool:
        return self.properties.get(MERGE_ENGINE) == AGGREGATION

    @property
    def delete_behavior(self) -> DeleteBehavior:
        value = self.properties.get(DELETE_BEHAVIOR)
        if value is None:
            return DeleteBehavior.IGNORE if self.is_aggregation else DeleteBehavior.ALLOW
        try:
            return DeleteBehavior(value.strip().lower())
        except ValueError:
            raise InvalidOptionError(
                f"Invalid value for option '{DELETE_BEHAVIOR}': {value!r} "
                "(expected allow, ignore or disable)"
            ) from None

    @property
    def column_lock_enabled(self) -> bool:
        return parse_bool_option(
            COLUMN_LOCK_ENABLED, self.properties.get(COLUMN_LOCK_ENABLED, self.is_aggregation)
        )

    @property
    def expired_lock_retention_ms(self) -> int:
        """How long after its expiry an unrecovered lock still holds back retention."""
        value = self.properties.get(EXPIRED_LOCK_RETENTION)
        return DEFAULT_EXPIRED_LOCK_RETENTION_MS if value is None else int(value)

    @property
    def consumer_retention_ms(self) -> int:
        """How long after a consumer last registered its position that position still holds
        back retention."""
        value = self.properties.get(CONSUMER_RETENTION)
        return DEFAULT_CONSUMER_RETENTION_MS if value is None else int(value)

    @property
    def kv_buffer_size(self) -> int:
        """Bytes of merged rows a tablet may hold in memory before writing them to RocksDB."""
        value = self.properties.get(KV_BUFFER_SIZE)
        return DEFAULT_KV_BUFFER_SIZE if value is None else parse_size(KV_BUFFER_SIZE, value)

    @property
    def sequence_fields(self) -> tuple[str, ...]:
        """The columns of `table.sequence-field`, in the order they compare (none: arrival)."""
        value = self.properties.get(SEQUENCE_FIELD)
        if value is None:
            return ()
        names = tuple(n.strip() for n in str(value).split(","))
        problem = sequence_field_problem(self, names)
        if problem:
            raise InvalidOptionError(f"Invalid value for option '{SEQUENCE_FIELD}': {value!r}: "
                                     f"{problem}")
        return names

    @property
    def sequence_groups(self) -> tuple[SequenceGroup, ...]:
        """The `fields.<seq>.sequence-group` options: each a group of columns with its own
        sequence (merge_engine.table.sequence_groups)."""
        return sequence_groups(self.properties, self.schema, self.is_aggregation,
                               self.sequence_fields)

    @property
    def orders_by_sequence(self) -> bool:
        """Whether some column follows a sequence (the table-wide field or a group's)."""
        return bool(self.sequence_fields or self.sequence_groups)

    def aggregators(self) -> list:
        """One aggregator per column, in schema order: the schema's, with the value-selection
        ones (and the sequence columns themselves) ordered by their group's sequence or the
        sequence field if any; a group's other columns know the sequence their writes need."""
        aggregators = self.schema.aggregators(self.is_aggregation)
        if not self.orders_by_sequence:
            return aggregators
        from aggfuncs import AggFunction, make_aggregator
        from aggfuncs.sequenced import SequencedAggregator, require_sequence

        orders = column_orders(self.schema, aggregators, self.sequence_groups,
                               self.sequence_fields)
        wrapped = []
        for agg in aggregators:
            order = orders.get(agg.column)
            if order is not None:
                sequence_type = order.struct_type(self.schema)
                if agg.column in order.fields:
                    # A sequence column shows the sequence of the latest write: its highest value.
                    agg = make_aggregator(AggFunction.LAST_VALUE, agg.column, agg.type)
                if agg.selects_value:
                    agg = SequencedAggregator(agg, sequence_type, order.option)
                else:  # a group's sum (...): every write counts, each must carry the sequence
                    require_sequence(agg, sequence_type, order.option)
            wrapped.append(agg)
        return wrapped

    @property
    def row_ttl_ms(self) -> int | None:
        """How long (ms) a key lives after its last write, or None (rows never expire)."""
        value = self.properties.get(ROW_TTL)
        if value is None:
            return None
        ttl = parse_duration_ms(ROW_TTL, value)
        if ttl <= 0:
            raise InvalidOptionError(
                f"Invalid value for option '{ROW_TTL}': {value!r} (expected a positive duration; "
                "leave the option out for rows that never expire)")
        return ttl

    @property
    def lake(self) -> LakeSettings:
        return lake_settings(self.properties, self.schema.to_arrow())

    def bool_option(self, key: str, default: bool = False) -> bool:
        return parse_bool_option(key, self.properties.get(key, default))

    # --- construction from connector options and JSON ---------------------------------------

    @classmethod
    def from_options(cls, arrow_schema, primary_key=(), partition_key=(), options=None):
        """Build a descriptor from an Arrow schema and connector options (`fields.<col>.agg`)."""
        from merge_engine.table.connector_options import descriptor_from_options

        return descriptor_from_options(cls, arrow_schema, primary_key, partition_key, options)

    def to_json(self) -> str:
        return json.dumps(
            {"schema": json.loads(self.schema.to_json()), "bucket_count": self.bucket_count,
             "properties": self.properties},
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | dict) -> "TableDescriptor":
        try:
            d = json.loads(text) if isinstance(text, str) else text
            return cls(Schema.from_json(d["schema"]), d.get("bucket_count"), d.get("properties"))
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"Malformed table descriptor JSON: {exc}") from None

    def __eq__(self, other) -> bool:
        return isinstance(other, TableDescriptor) and self.to_json() == other.to_json()

    def __repr__(self) -> str:
        return f"TableDescriptor({self.schema!r}, buckets={self.bucket_count}, {self.properties})"
