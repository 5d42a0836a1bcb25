"""How the `tally` commands print rows: aligned tables for people, CSV or JSON Lines for scripts.

Every listing command goes through `emit` (rows of Python values) or `emit_arrow` (Arrow record
batches, as a scan or a changelog read hands them out), so `--format` means the same everywhere:
`table` (aligned, for a terminal), `csv` (a header line, then one line per row) and `json` (one
JSON object per row and line, so `jq` reads it line by line).

Both stream: rows are printed as they come, never gathered first. CSV and JSON Lines are written
and flushed batch by batch; a table is drawn a page at a time (tally.cli.table_pages), a page
being `page_rows` rows (each page with its own header and column widths), or fewer when rows
have waited PAGE_WAIT_SECONDS for the page to fill, so a slow read still shows what it has.
What is held is one batch and one page, never the listing.
"""

from __future__ import annotations

import base64
import csv
import datetime
import decimal
import json
import sys
import time
from typing import Iterable, Sequence

from tally.cli.table_pages import PagePrinter

FORMATS = ("table", "csv", "json")
DEFAULT_PAGE_ROWS = 1000
PAGE_WAIT_SECONDS = 1.0


def text(value) -> str:
    """A value as one cell of a table or CSV line."""
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=_json_value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return str(value)


def _json_value(value):
    """What JSON cannot hold as is: decimals as strings (exact), times as ISO 8601, bytes as
    base64."""
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, set):
        return sorted(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def column_texts(column) -> list[str]:
    """An Arrow column's cells as `text` writes them. Where Arrow's own cast to string reads
    the same (integers, strings, booleans, dates, times, decimals), the column is cast in one
    call, not converted value by value."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_string(kind):
        strings = column.to_pylist()
    elif (pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_date(kind)
          or pa.types.is_time(kind) or pa.types.is_large_string(kind)
          or (pa.types.is_decimal(kind) and kind.scale >= 0)):
        import pyarrow.compute as pc

        strings = pc.cast(column, pa.string()).to_pylist()
    else:
        return [text(v) for v in column.to_pylist()]
    return ["null" if s is None else s for s in strings] if column.null_count else strings


def header_for(names: Sequence[str], fmt: str) -> list[str]:
    """Upper-case titles for people; snake_case keys for CSV and JSON readers."""
    return list(names) if fmt == "table" else [n.lower().replace(" ", "_") for n in names]


def emit(header: Sequence[str], rows: Iterable[Sequence], fmt: str = "table",
         title: str | None = None, stream=None, page_rows: int = DEFAULT_PAGE_ROWS) -> int:
    """Print rows (sequences of values in `header` order) in `fmt` as they come; the number
    printed."""
    stream = stream or sys.stdout
    header = list(header)
    if fmt == "table":
        printer = PagePrinter(stream, header, title)
        count = 0
        for page in _pages(rows, page_rows):
            printer.page([[text(v) for v in column] for column in zip(*page)]
                         if page else [[] for _ in header])
            count += len(page)
        return count
    count = 0
    writer = csv.writer(stream, lineterminator="\n")
    if fmt == "csv":
        writer.writerow(header)
    for page in _pages(rows, page_rows):
        if fmt == "csv":
            writer.writerows([text(v) for v in row] for row in page)
        else:
            stream.write("".join(_json_line(header, row) for row in page))
        count += len(page)
        stream.flush()
    stream.flush()
    return count


def _json_line(header: list[str], row: Sequence) -> str:
    return json.dumps(dict(zip(header, row)), default=_json_value, ensure_ascii=False) + "\n"


def _pages(rows: Iterable[Sequence], page_rows: int):
    """Lists of at most `page_rows` rows; one empty list when there are no rows (a table of
    none still prints its header)."""
    page: list = []
    started = None
    printed = False
    for row in rows:
        page.append(row)
        if started is None:
            started = time.monotonic()
        if len(page) >= page_rows or time.monotonic() - started >= PAGE_WAIT_SECONDS:
            yield page
            printed, page, started = True, [], None
    if page or not printed:
        yield page


def emit_arrow(schema, batches, fmt: str = "table", title: str | None = None, stream=None,
               page_rows: int = DEFAULT_PAGE_ROWS) -> int:
    """Print Arrow record batches of `schema` in `fmt`, each as it comes (CSV and JSON Lines
    flushed per batch, a table per page of `page_rows` rows); the number of rows printed."""
    stream = stream or sys.stdout
    header = list(schema.names)
    if fmt == "table":
        printer = PagePrinter(stream, header, title)
        count = 0
        for page in table_pages(batches, page_rows):
            printer.page([[cell for part in page for cell in column_texts(part.column(i))]
                          for i in range(len(header))])
            count += sum(part.num_rows for part in page)
        return count
    writer = csv.writer(stream, lineterminator="\n")
    if fmt == "csv":
        writer.writerow(header)
        stream.flush()
    count = 0
    for batch in batches:
        if fmt == "csv":
            writer.writerows(zip(*(column_texts(column) for column in batch.columns)))
        else:
            stream.write("".join(_json_line(header, row) for row in
                                 zip(*(column.to_pylist() for column in batch.columns))))
        count += batch.num_rows
        stream.flush()
    return count


def table_pages(batches, page_rows: int):
    """The pages of a stream of record batches: each page a list of batch slices holding
    `page_rows` rows in all, or fewer: the rest at the end, or what has waited
    PAGE_WAIT_SECONDS when the next batch comes. One empty page when there are no rows. Only
    the current batch and the page are held: a page is handed out before the next batch is
    asked for."""
    page: list = []
    rows = 0
    started = None
    printed = False
    for batch in batches:
        if rows and time.monotonic() - started >= PAGE_WAIT_SECONDS:
            yield page
            printed, page, rows, started = True, [], 0, None
        while batch.num_rows:
            take = min(batch.num_rows, page_rows - rows)
            page.append(batch.slice(0, take))
            rows += take
            batch = batch.slice(take)
            if started is None:
                started = time.monotonic()
            if rows == page_rows:
                yield page
                printed, page, rows, started = True, [], 0, None
    if rows or not printed:
        yield page
