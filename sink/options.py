"""The sink's options: one parser for TallySink(options=...), `.option(...)` on the data source,
and the defaults that make a job run with nothing but `url` and `table`.

Spark lower-cases every option key it hands a Python data source (`fields.Revenue.agg` arrives as
`fields.revenue.agg`), so keys are matched case-insensitively everywhere and column names named
inside keys are resolved against the DataFrame's columns case-insensitively too.
"""

from __future__ import annotations

import dataclasses
import os

from merge_engine import MergeMode
from merge_engine.table.option_values import parse_bool_option
from tally.errors import InvalidOptionError
from tally.sizes import parse_size
from tally.wire.tls import TlsFiles

URL = "url"
TABLE = "table"
TOKEN = "token"
TOKEN_FILE = "token-file"
COLUMNS = "columns"
MERGE_MODE = "merge-mode"
CREATE_TABLE = "create-table"
PRIMARY_KEY = "primary-key"
PARTITION_KEY = "partition-key"
BUCKET_NUM = "bucket.num"
OWNER_ID = "client.column-lock.owner-id"
LOCK_TTL = "client.column-lock.ttl"
SEQUENCE_COLUMN = "sequence-column"
EPOCH = "epoch"
FAIL_HOOK = "fail-hook"
DELIVERY = "delivery"
DRIVER_MAX_BYTES = "delivery.driver-max-bytes"
DICTIONARY_PREFIX = "dictionary."  # dictionary.<column>: string ids mapped through that table
TLS_CA, TLS_CERT, TLS_KEY = "tls.ca", "tls.cert", "tls.key"  # PEM paths on every executor
# A read's client deadlines (tally.connect's options of the same names, in seconds or with a
# unit): read options of the data source, not sink options
CLIENT_TIMEOUTS = {"client.request-timeout": "request_timeout",
                   "client.retry-timeout": "retry_timeout",
                   "client.stream-idle-timeout": "stream_idle_timeout"}

DEFAULT_TTL = 60.0

# How TallySink brings an epoch's rows to the buckets: a Spark job with one task per bucket,
# the driver (the rows collected to it, for small batches), or the choice by the batch's size.
DELIVERIES = ("auto", "tasks", "driver")
# `auto` takes the driver when Spark's size estimate of the batch is at most this.
DEFAULT_DRIVER_MAX_BYTES = 4 << 20

# Keys the sink itself understands; `fields.*` and `table.*` are table options for create-table.
SINK_KEYS = {URL, TABLE, TOKEN, TOKEN_FILE, COLUMNS, MERGE_MODE, CREATE_TABLE, PRIMARY_KEY,
             PARTITION_KEY, BUCKET_NUM, OWNER_ID, LOCK_TTL, SEQUENCE_COLUMN, EPOCH, FAIL_HOOK,
             TLS_CA, TLS_CERT, TLS_KEY, DELIVERY, DRIVER_MAX_BYTES}
# Keys Spark adds to a data source's options on its own.
SPARK_KEYS = {"path", "checkpointlocation"}


def tls_option(raw: dict) -> TlsFiles | None:
    files = {k: str(raw[o]).strip() or None for k, o in
             (("ca", TLS_CA), ("cert", TLS_CERT), ("key", TLS_KEY)) if raw.get(o)}
    return TlsFiles(**files) if files else None


def token_option(raw: dict) -> str | None:
    """The client token: the `token` option, else the first line of the `token-file` option's
    file (read on the driver, so executors need no copy of the file), else $TALLY_TOKEN. A
    Spark option may show in the query plan and the UI; a file or the environment does not."""
    if raw.get(TOKEN) and raw.get(TOKEN_FILE):
        raise InvalidOptionError(f"Give the sink option '{TOKEN}' or '{TOKEN_FILE}', not both")
    if raw.get(TOKEN_FILE):
        path = str(raw[TOKEN_FILE])
        try:
            with open(path) as f:
                token = f.readline().strip()
        except OSError as e:
            raise InvalidOptionError(f"Option '{TOKEN_FILE}' {path}: {e.strerror}") from None
        if not token:
            raise InvalidOptionError(f"Option '{TOKEN_FILE}' {path} holds no token on its first "
                                     "line")
        return token
    return raw.get(TOKEN) or os.environ.get("TALLY_TOKEN") or None


def client_timeouts(raw: dict) -> tuple[tuple[str, float], ...]:
    """The `client.*-timeout` options of lowered options, as (tally.connect keyword, seconds)
    pairs (picklable, hashable: a worker's shared connection is keyed by them)."""
    return tuple(sorted((keyword, _duration(key, raw[key]))
                        for key, keyword in CLIENT_TIMEOUTS.items() if raw.get(key) is not None))


def _duration(key: str, value) -> float:
    text = str(value).strip().lower()
    scale = 1.0
    for suffix, factor in (("ms", 0.001), ("min", 60.0), ("s", 1.0)):
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)].strip(), factor
            break
    try:
        seconds = float(text) * scale
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidOptionError(f"Option '{key}' must be a positive duration in seconds (e.g. "
                                 f"10, 10s, 500ms, 1min), got {value!r}")
    return seconds


def lowered(options) -> dict:
    """Spark's option keys are case-insensitive: every key trimmed and lower-cased."""
    return {str(k).strip().lower(): v for k, v in dict(options or {}).items()}


def connection_options(raw: dict, needs: str) -> tuple[str, str, str | None, TlsFiles | None]:
    """(url, table, token, TLS files) of lowered options, for any use of the data source;
    InvalidOptionError naming the missing option (`needs`: who needs it, for the message)."""
    for required in (URL, TABLE):
        if not raw.get(required):
            raise InvalidOptionError(f"{needs} needs the option '{required}'")
    return str(raw[URL]).strip(), str(raw[TABLE]).strip(), token_option(raw), tls_option(raw)


def _split_list(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in str(value).split(",")]
    items = [v for v in items if v]
    return items or None


@dataclasses.dataclass(frozen=True)
class SinkOptions:
    """Parsed, validated sink options. Picklable: executors receive a copy."""

    url: str
    table: str
    token: str | None = dataclasses.field(default=None, repr=False)  # never in logs
    columns: tuple[str, ...] | None = None      # partial-update targets (key added later)
    merge_mode: MergeMode = MergeMode.AGGREGATE  # what the DataFrame's values are
    create_table: bool = False
    primary_key: tuple[str, ...] = ()
    partition_key: tuple[str, ...] = ()
    bucket_num: int | None = None
    owner_id: str | None = None
    ttl: float = DEFAULT_TTL
    sequence_column: str | None = None
    epoch: int | None = None
    table_options: tuple[tuple[str, str], ...] = ()   # fields.* and table.* for create-table
    checkpoint_location: str | None = None
    fail_hook: str | None = None   # tests only: "module:function", see sink.task.write_bucket
    tls: TlsFiles | None = None    # a grpc+tls:// cluster: its CA, our certificate and key
    delivery: str = "auto"         # TallySink only: one of DELIVERIES
    driver_max_bytes: int = DEFAULT_DRIVER_MAX_BYTES
    # (column, dictionary table) of each `dictionary.<column>` option (sink.dictionary_ids)
    dictionaries: tuple[tuple[str, str], ...] = ()

    @property
    def database(self) -> str:
        return self.table.split(".", 1)[0]

    @classmethod
    def parse(cls, options: dict | None, url: str | None = None, table: str | None = None,
              columns=None) -> "SinkOptions":
        raw = lowered(options)
        if url is not None:
            raw[URL] = url
        if table is not None:
            raw[TABLE] = table
        if columns is not None:
            raw[COLUMNS] = ",".join(columns) if not isinstance(columns, str) else columns
        unknown = sorted(k for k in raw if k not in SINK_KEYS and k not in SPARK_KEYS
                         and not k.startswith("fields.") and not k.startswith("table.")
                         and not k.startswith(DICTIONARY_PREFIX))
        if unknown:
            raise InvalidOptionError(
                f"Unknown Tally sink option(s) {unknown}. Known options: {sorted(SINK_KEYS)}, "
                "fields.<column>.agg, fields.<column>.<function>.<parameter>, "
                "dictionary.<column> and table.*")
        url, name, token, tls = connection_options(raw, "The Tally sink")
        if name.count(".") != 1 or not all(name.split(".")):
            raise InvalidOptionError(
                f"Option 'table' must name a table as '<database>.<table>', got {name!r}")
        return cls(
            url=url,
            table=name,
            token=token,
            columns=tuple(_split_list(raw.get(COLUMNS)) or ()) or None,
            merge_mode=_merge_mode(raw.get(MERGE_MODE)),
            create_table=parse_bool_option(CREATE_TABLE, raw.get(CREATE_TABLE, "false")),
            primary_key=tuple(_split_list(raw.get(PRIMARY_KEY)) or ()),
            partition_key=tuple(_split_list(raw.get(PARTITION_KEY)) or ()),
            bucket_num=_positive_int(BUCKET_NUM, raw.get(BUCKET_NUM)),
            owner_id=_owner_id(raw.get(OWNER_ID)),
            ttl=_ttl(raw.get(LOCK_TTL)),
            sequence_column=(str(raw[SEQUENCE_COLUMN]).strip() or None)
            if raw.get(SEQUENCE_COLUMN) is not None else None,
            epoch=_non_negative_int(EPOCH, raw.get(EPOCH)),
            table_options=tuple(sorted((k, str(v)) for k, v in raw.items()
                                       if k.startswith("fields.") or k.startswith("table."))),
            checkpoint_location=raw.get("checkpointlocation"),
            fail_hook=str(raw[FAIL_HOOK]).strip() or None if raw.get(FAIL_HOOK) else None,
            tls=tls,
            delivery=_delivery(raw.get(DELIVERY)),
            driver_max_bytes=_byte_count(DRIVER_MAX_BYTES, raw.get(DRIVER_MAX_BYTES)),
            dictionaries=_dictionaries(raw),
        )


def _dictionaries(raw: dict) -> tuple[tuple[str, str], ...]:
    """`dictionary.<column> = <db>.<table>`: the bitmap column fed the table's ids."""
    out = []
    for key, value in sorted(raw.items()):
        if not key.startswith(DICTIONARY_PREFIX):
            continue
        column, name = key[len(DICTIONARY_PREFIX):], str(value).strip()
        if not column or name.count(".") != 1 or not all(name.split(".")):
            raise InvalidOptionError(f"Option '{key}' names a column and a dictionary table as "
                                     f"'<database>.<table>', got {value!r}")
        out.append((column, name))
    return tuple(out)


def _delivery(value) -> str:
    if value is None:
        return "auto"
    text = str(value).strip().lower()
    if text not in DELIVERIES:
        raise InvalidOptionError(
            f"Option '{DELIVERY}' must be one of {', '.join(DELIVERIES)}, got {value!r}")
    return text


def _byte_count(key: str, value) -> int:
    return DEFAULT_DRIVER_MAX_BYTES if value is None else parse_size(key, value)


def _merge_mode(value) -> MergeMode:
    if value is None:
        return MergeMode.AGGREGATE
    mode = MergeMode.parse(str(value))
    return mode


def _positive_int(key: str, value) -> int | None:
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise InvalidOptionError(f"Option '{key}' must be a positive integer, got {value!r}")
    return number


def _non_negative_int(key: str, value) -> int | None:
    if value is None:
        return None
    try:
        number = int(str(value).strip())
    except ValueError:
        number = -1
    if number < 0:
        raise InvalidOptionError(f"Option '{key}' must be a non-negative integer, got {value!r}")
    return number


def _ttl(value) -> float:
    if value is None:
        return DEFAULT_TTL
    text = str(value).strip().lower()
    scale = 1.0
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("min", 60.0)):
        if text.endswith(suffix):
            text, scale = text[: -len(suffix)].strip(), factor
            break
    try:
        ttl = float(text) * scale
    except ValueError:
        ttl = 0.0
    if ttl <= 0:
        raise InvalidOptionError(
            f"Option '{LOCK_TTL}' must be a positive duration in seconds (e.g. 60, 30s, "
            f"500ms), got {value!r}")
    return ttl


def _owner_id(value) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    if not text:
        raise InvalidOptionError(f"Option '{OWNER_ID}' must not be empty")
    return text
