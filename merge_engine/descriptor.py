"""TableDescriptor: a schema plus the table options that decide how writes are merged."""

from __future__ import annotations

import json

from merge_engine.modes import DeleteBehavior
from merge_engine.schema import Schema
from tally.errors import InvalidOptionError, SchemaError
from tally.sizes import parse_size

MERGE_ENGINE = "table.merge-engine"
DELETE_BEHAVIOR = "table.delete.behavior"
CHANGELOG_IMAGE = "table.changelog.image"
COLUMN_LOCK_ENABLED = "table.column-lock.enabled"
KV_SYNC = "table.kv.sync"
KV_BUFFER_SIZE = "table.kv.buffer-size"
DEFAULT_KV_BUFFER_SIZE = 64 << 20
BUCKET_NUM = "bucket.num"

# Changelog retention (the policy: merge_engine/log_retention.py).
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
    "table.partition.dynamic-creation.enabled",
    RETENTION_OFFSETS,
    RETENTION_MS,
    RETENTION_IGNORE_LOCKS,
    EXPIRED_LOCK_RETENTION,
    CONSUMER_RETENTION,
    "table.agg.remove-record-on-empty",
}

AGGREGATION = "aggregation"


def parse_bool_option(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in ("true", "false"):
        raise InvalidOptionError(f"Invalid value for option '{key}': {value!r} (expected true or false)")
    return text == "true"


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

    def bool_option(self, key: str, default: bool = False) -> bool:
        return parse_bool_option(key, self.properties.get(key, default))

    # --- construction from connector options and JSON ---------------------------------------

    @classmethod
    def from_options(cls, arrow_schema, primary_key=(), partition_key=(), options=None):
        """Build a descriptor from an Arrow schema and connector options (`fields.<col>.agg`)."""
        from merge_engine.connector_options import descriptor_from_options

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
