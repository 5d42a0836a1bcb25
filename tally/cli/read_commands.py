"""The `tally` commands that read a table: `lookup`, `scan`, `changelog`, `offsets`.

Each command's data access is one small function (`scan_batches`, `changelog_batches`), the
only place that knows which client calls fetch the rows. Both hand out record batches as they
are read, and the rows are printed as they come (tally.cli.output): the first page of a scan
is on the screen while the rest of the table is still being read.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys

from tally.cli.connect_args import add_connection_arguments, open_connection
from tally.cli.exit_codes import NoRowError
from tally.cli.output import DEFAULT_PAGE_ROWS, FORMATS, emit, emit_arrow, header_for
from tally.errors import InvalidInputError, InvalidOptionError

# The changelog's row-state columns a reader rarely wants (`--hidden` shows them).
HIDDEN = ("_unwritten", "_contributions", "_tokens")
# Records per changelog read: a bucket is read in ranges of this many offsets, so that its first
# records are printed while the rest are read, and only one range is held at a time.
CHANGELOG_READ_RECORDS = 10_000


def cmd_lookup(args: argparse.Namespace) -> int:
    from tally.cli.column_types import parse_key

    if args.prefix and args.key:
        raise InvalidInputError("give either the whole key (COLUMN=VALUE ...) or --prefix "
                                "COLUMN=VALUE ..., not both")
    if not args.prefix and not args.key:
        raise InvalidInputError("give the key as COLUMN=VALUE ..., or its leading columns "
                                "as --prefix COLUMN=VALUE ...")
    with open_connection(args) as conn:
        table = conn.table(args.table)
        meta = table.meta
        if args.prefix:
            return _lookup_prefix(args, table, meta.routing.arrow_schema)
        key = parse_key(args.table, meta.routing.arrow_schema, meta.routing.primary_key,
                        args.key)
        row = table.lookup(key)
    if row is None:
        raise NoRowError(f"no row with key {', '.join(f'{k}={v}' for k, v in key.items())} "
                         f"in {args.table}")
    emit(list(row), [list(row.values())], args.format)
    return 0


def _lookup_prefix(args: argparse.Namespace, table, schema) -> int:
    """Every row under the key prefix (`--prefix`, leading primary-key columns), in key
    order; status 3 when there is none."""
    from tally.cli.column_types import typed_value

    prefix = {}
    for pair in args.prefix:
        column, sep, value = pair.partition("=")
        column = column.strip()
        if not sep or not column:
            raise InvalidInputError(f"a key prefix is given as COLUMN=VALUE, got {pair!r}")
        if column in prefix:
            raise InvalidInputError(f"key prefix column '{column}' is given twice")
        if column not in schema.names:
            raise InvalidInputError(f"{args.table} has no column '{column}'; its primary key "
                                    f"is {list(table.meta.routing.primary_key)}")
        prefix[column] = typed_value(column, schema.field(column).type, value)
    rows = table.prefix_lookup(prefix)
    if rows.num_rows == 0:
        raise NoRowError(f"no row under key prefix "
                         f"{', '.join(f'{k}={v}' for k, v in prefix.items())} in {args.table}")
    emit_arrow(rows.schema, rows.to_batches(), args.format)
    return 0


def scan_batches(table, columns: list[str] | None, filter: dict | None, limit: int | None):
    """(schema, record batches) of the table's rows of `filter`, projected to `columns`, cut
    after `limit` rows: streamed bucket by bucket (Table.scan), so `--limit 10` reads about
    one batch, not the table."""
    scan = table.scan(columns, filter, batch_size=min(limit or 65536, 65536) or 1)

    def batches():
        left = limit
        for batch in scan:
            if left is not None:
                if left <= 0:
                    return
                batch = batch.slice(0, left)
                left -= batch.num_rows
            yield batch

    return scan.schema, batches()


def cmd_scan(args: argparse.Namespace) -> int:
    from tally.cli.column_types import parse_filter

    with open_connection(args) as conn:
        table = conn.table(args.table)
        schema = table.meta.routing.arrow_schema
        columns = _columns(args.columns, schema.names, args.table)
        filter = parse_filter(args.table, schema, args.filter or [])
        out = sys.stdout
        with _activity(f"reading {args.table}"):
            schema, batches = scan_batches(table, columns, filter or None, args.limit)
            emit_arrow(schema, batches, args.format, stream=out, page_rows=args.page_rows)
    return 0


def _columns(text: str | None, names: list[str], table: str) -> list[str] | None:
    if text is None:
        return None
    columns = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in columns if c not in names]
    if unknown or not columns:
        raise InvalidInputError(f"{table} has no column {', '.join(map(repr, unknown))}; its "
                                f"columns: {', '.join(names)}" if unknown else
                                "--columns names no column")
    return columns


def changelog_batches(table, buckets, start: int | None, limit: int | None, on_bucket=None,
                      read_records: int = CHANGELOG_READ_RECORDS):
    """Record batches of the changelog of each (partition, bucket) in `buckets`, in order,
    from offset `start` (default: each bucket's log start) to its end, `limit` records in all;
    each with `partition` (partitioned tables) and `bucket` columns in front. A bucket is read
    `read_records` offsets at a time, each range handed out before the next is read."""
    from tally.client.changelog_reader import read_range

    partitioned = table.meta.routing.partitioned
    log = table.connection.admin.list_log_offsets(table.name, table.table_id)
    remaining = limit
    for partition, bucket in buckets:
        if remaining is not None and remaining <= 0:
            return
        log_start, log_end = log[(partition, bucket)]
        position = log_start if start is None else start
        end = log_end if remaining is None else min(log_end, position + remaining)
        while position < end and (remaining is None or remaining > 0):
            upto = min(end, position + read_records)
            records = read_range(table, partition, bucket, position, upto)
            position = upto
            if remaining is not None:
                records = records.slice(0, remaining)
                remaining -= records.num_rows
            if not records.num_rows:
                continue
            records = records.add_column(0, "bucket", _repeated(bucket, records.num_rows))
            if partitioned:
                records = records.add_column(0, "partition",
                                             _repeated(partition, records.num_rows))
            yield from records.to_batches()
        if on_bucket is not None:
            on_bucket()


def _repeated(value: int | str, n: int):
    """`value` n times, as an int32 (a bucket) or string (a partition) Arrow array, built from
    its buffers: pa.array of a Python list imports pandas (half a second of start-up)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(value, int):
        return pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(
            np.full(n, value, np.int32))])
    data = value.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(data * n)])


def cmd_changelog(args: argparse.Namespace) -> int:
    import itertools

    import pyarrow as pa

    with open_connection(args) as conn:
        table = conn.table(args.table)
        meta = table.meta
        buckets = _buckets(meta, args.table, args.bucket, args.partition)
        out = sys.stdout
        with _progress(len(buckets), f"reading {args.table}'s changelog") as advance:
            batches = (b if args.hidden else b.drop_columns([c for c in HIDDEN
                                                             if c in b.schema.names])
                       for b in changelog_batches(table, buckets, args.start, args.limit,
                                                  advance))
            first = next(batches, None)
            if first is None and args.format == "table":
                print("no changelog records")
                return 0
            if first is not None:
                schema = first.schema  # every bucket's records have the table's columns
            else:  # the columns a record would have, for the CSV header
                names = (["partition"] if meta.routing.partitioned else []) + \
                    ["bucket", "_offset", "_change_type"] + list(meta.routing.arrow_schema.names)
                schema = pa.schema([pa.field(n, pa.null()) for n in names])
            # Streamed: each range's records are printed before the next range is read.
            emit_arrow(schema, itertools.chain([first] if first else [], batches), args.format,
                       stream=out, page_rows=args.page_rows)
    return 0


def _buckets(meta, table: str, wanted: list[int] | None, partition: str | None):
    every = meta.all_buckets()
    if partition is not None:
        every = [(p, b) for p, b in every if p == partition]
        if not every:
            from tally.errors import NotFoundError

            raise NotFoundError(f"{table} has no partition {partition!r}")
    if wanted is None:
        return every
    numbers = sorted({b for text in wanted for b in _bucket_numbers(text)})
    bad = [b for b in numbers if not 0 <= b < meta.routing.bucket_count]
    if bad:
        raise InvalidOptionError(f"{table} has buckets 0..{meta.routing.bucket_count - 1}, "
                                 f"not {', '.join(map(str, bad))}")
    return [(p, b) for p, b in every if b in numbers]


def _bucket_numbers(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise InvalidOptionError(f"--bucket takes bucket numbers (0, 1, ...), got {text!r}") \
            from None


def cmd_offsets(args: argparse.Namespace) -> int:
    with open_connection(args) as conn:
        table = conn.table(args.table)
        partitioned = table.meta.routing.partitioned
        log = conn.admin.list_log_offsets(args.table, table.table_id)
        consumers = conn.admin.consumer_positions(args.table, table.table_id)
    order = sorted(log, key=lambda key: (key[0] or "", key[1]))
    where = ["PARTITION"] if partitioned else []
    if not args.consumers:
        rows = [([key[0]] if partitioned else []) + [key[1], *log[key], log[key][1] - log[key][0]]
                for key in order]
        emit(header_for(where + ["BUCKET", "LOG START", "LOG END", "RECORDS"], args.format),
             rows, args.format)
    if args.consumers or (args.format == "table" and consumers):
        emit(header_for(["CONSUMER"] + where + ["BUCKET", "POSITION", "LAG", "HOLDING",
                                               "UPDATED"], args.format),
             _consumer_rows(consumers, log, order, partitioned), args.format,
             title="changelog consumers" if args.format == "table" else None)
    return 0


def _consumer_rows(consumers, log, order, partitioned: bool) -> list[list]:
    """A row per consumer and bucket: its next offset (the log start where it has none yet:
    a new bucket is read from there), the records it has not read, whether it still holds
    retention back, and when it last registered (ISO time)."""
    rows = []
    for consumer in consumers:
        lag = consumer.lag(log)
        updated = datetime.datetime.fromtimestamp(consumer.updated_at, datetime.timezone.utc)
        for key in order:
            rows.append([consumer.consumer] + ([key[0]] if partitioned else []) + [
                key[1], consumer.positions.get(key, log[key][0]), lag[key],
                "yes" if consumer.holding else "no", updated.isoformat(timespec="seconds")])
    return rows


@contextlib.contextmanager
def _activity(label: str):
    """A spinner on a terminal's stderr while a scan runs and its rows go to a file or a pipe
    (nothing in a log; on the terminal itself the rows, printed as they come, show it)."""
    if not sys.stderr.isatty() or sys.stdout.isatty():
        yield
        return
    from rich.console import Console

    with Console(file=sys.stderr).status(label):
        yield


@contextlib.contextmanager
def _progress(total: int, label: str):
    """A progress bar over `total` steps on a terminal's stderr while the output goes to a
    file or a pipe (on the same terminal the bar would tear the rows it is printed between);
    yields the advance callback."""
    if not sys.stderr.isatty() or sys.stdout.isatty() or total < 2:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(file=sys.stderr), transient=True, redirect_stdout=False,
                  redirect_stderr=False) as progress:
        task = progress.add_task(label, total=total)
        yield lambda: progress.advance(task)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {text!r}")
    return value


def _page_rows(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _add_page_rows(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--page-rows", type=_page_rows, default=DEFAULT_PAGE_ROWS, metavar="N",
                        help="--format table: rows per printed table, each with its own header "
                             f"and column widths (default {DEFAULT_PAGE_ROWS:,})")


def add_commands(commands, common: argparse.ArgumentParser) -> None:
    """Add the read commands to `tally`'s subparsers (`common`: the shared --verbose)."""
    lookup = commands.add_parser("lookup", parents=[common],
                                 help="the row with a primary key, or the rows under its "
                                      "leading columns (exit 3 when there is none)")
    lookup.add_argument("table", help="'<database>.<table>'")
    lookup.add_argument("key", nargs="*", metavar="COLUMN=VALUE",
                        help="every primary-key column, values as text in the column's type")
    lookup.add_argument("--prefix", action="append", default=[], metavar="COLUMN=VALUE",
                        help="instead of the key: its leading columns (repeat for each), "
                             "every row under them in key order")
    lookup.add_argument("--format", choices=FORMATS, default="table")
    add_connection_arguments(lookup)
    lookup.set_defaults(func=cmd_lookup)

    scan = commands.add_parser("scan", parents=[common],
                               help="a table's rows, bucket by bucket (in no key order)")
    scan.add_argument("table", help="'<database>.<table>'")
    scan.add_argument("--columns", metavar="A,B,...", help="only these columns, in this order")
    scan.add_argument("--filter", action="append", metavar="COLUMN=VALUE",
                      help="only rows with this value (repeatable; a column given twice "
                           "matches either value); on the key or partition key it prunes")
    scan.add_argument("--limit", type=_positive, metavar="N", help="at most N rows")
    scan.add_argument("--format", choices=FORMATS, default="table")
    _add_page_rows(scan)
    add_connection_arguments(scan)
    scan.set_defaults(func=cmd_scan)

    changelog = commands.add_parser(
        "changelog", parents=[common],
        help="a table's changelog records (+I, -U, +U, -D with row images), bucket by bucket")
    changelog.add_argument("table", help="'<database>.<table>'")
    changelog.add_argument("--bucket", action="append", metavar="B[,B...]",
                           help="only these buckets (repeatable; default: every bucket)")
    changelog.add_argument("--partition", metavar="NAME", help="only this partition's buckets")
    changelog.add_argument("--from", dest="start", type=_positive, metavar="OFFSET",
                           help="start at this offset in each bucket (default: its log start)")
    changelog.add_argument("--limit", type=_positive, metavar="N", help="at most N records")
    changelog.add_argument("--hidden", action="store_true",
                           help="also the row-state columns (_unwritten, _contributions, ...)")
    changelog.add_argument("--format", choices=FORMATS, default="table")
    _add_page_rows(changelog)
    add_connection_arguments(changelog)
    changelog.set_defaults(func=cmd_changelog)

    offsets = commands.add_parser(
        "offsets", parents=[common],
        help="each bucket's changelog log start and end offsets, and its consumers' positions")
    offsets.add_argument("table", help="'<database>.<table>'")
    offsets.add_argument("--consumers", action="store_true",
                         help="only the changelog consumers' positions (one row per bucket)")
    offsets.add_argument("--format", choices=FORMATS, default="table")
    add_connection_arguments(offsets)
    offsets.set_defaults(func=cmd_offsets)
