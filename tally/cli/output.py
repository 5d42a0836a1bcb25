"""How the `tally` commands print rows: a rich table for people, CSV or JSON Lines for scripts.

Every listing command goes through `emit`, so `--format` means the same everywhere: `table`
(aligned, for a terminal), `csv` (a header line, then one line per row) and `json` (one JSON
object per row and line, so a long scan streams and `jq` reads it line by line).
"""

from __future__ import annotations

import base64
import csv
import datetime
import decimal
import json
import sys
from typing import Iterable, Sequence

FORMATS = ("table", "csv", "json")


def console(stream=None):
    """A rich console on stdout (or `stream`). Off a terminal it does not wrap at 80 columns:
    a table piped to a file keeps one line per row."""
    from rich.console import Console

    stream = stream or sys.stdout
    terminal = getattr(stream, "isatty", lambda: False)()
    return Console(file=stream, width=None if terminal else 100_000, highlight=False,
                   soft_wrap=not terminal)


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


def header_for(names: Sequence[str], fmt: str) -> list[str]:
    """Upper-case titles for people; snake_case keys for CSV and JSON readers."""
    return list(names) if fmt == "table" else [n.lower().replace(" ", "_") for n in names]


def emit(header: Sequence[str], rows: Iterable[Sequence], fmt: str = "table",
         title: str | None = None, stream=None) -> int:
    """Print rows (sequences of values in `header` order) in `fmt`; the number printed."""
    stream = stream or sys.stdout
    count = 0
    if fmt == "json":
        for row in rows:
            stream.write(json.dumps(dict(zip(header, row)), default=_json_value,
                                    ensure_ascii=False) + "\n")
            count += 1
    elif fmt == "csv":
        writer = csv.writer(stream, lineterminator="\n")
        writer.writerow(header)
        for row in rows:
            writer.writerow([text(v) for v in row])
            count += 1
    else:
        from rich.table import Table

        table = Table(title=title, show_edge=False, header_style="bold", title_justify="left")
        for name in header:
            table.add_column(name, overflow="fold")
        for row in rows:
            table.add_row(*(_cell(v) for v in row))
            count += 1
        console(stream).print(table)
    stream.flush()
    return count


def emit_arrow(schema, batches, fmt: str = "table", title: str | None = None,
               stream=None) -> int:
    """Print Arrow record batches (or tables) of `schema` in `fmt`, converting one batch at a
    time; the number of rows printed."""

    def rows():
        for batch in batches:
            columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
            yield from zip(*columns)

    return emit(list(schema.names), rows(), fmt, title, stream)


def _cell(value):
    from rich.text import Text

    return Text("null", style="dim") if value is None else Text(text(value))
