"""`tally rollup add|drop|list|backfill`: the rollups of a table (docs/rollups.md).

`add` takes the rollup's keys as `--key` expressions (a column, `col AS name`,
`date_trunc('hour', ts) AS hour`) and its aggregate columns as `--column NAME=EXPRESSION`
(`clicks=sum(clicks)`, `n=count(*)`), the same text `admin.create_rollup` takes.
"""

from __future__ import annotations

import argparse
import json

from tally.cli.connect_args import add_connection_arguments, open_connection
from tally.cli.output import FORMATS, emit, header_for
from tally.errors import InvalidInputError


def rollup_columns(pairs: list[str]) -> dict[str, str]:
    """{name: expression} from `NAME=EXPRESSION` texts, each name once."""
    columns: dict[str, str] = {}
    for pair in pairs:
        name, sep, expression = pair.partition("=")
        name = name.strip()
        if not sep or not name or not expression.strip():
            raise InvalidInputError(f"a rollup column is given as --column NAME=EXPRESSION "
                                    f"(e.g. clicks=sum(clicks)), got {pair!r}")
        if name in columns:
            raise InvalidInputError(f"rollup column '{name}' is given twice")
        columns[name] = expression.strip()
    return columns


def cmd_add(args: argparse.Namespace) -> int:
    columns = rollup_columns(args.column)
    with open_connection(args) as conn:
        spec = conn.admin.create_rollup(args.source, args.name, args.key, columns,
                                        start=args.start, bucket_count=args.buckets,
                                        wait=args.wait)
    how = "backfilled from its rows" if args.start == "backfill" else "empty, fed from now on"
    print(f"created rollup {spec.name} of {spec.source} ({how}; {spec.state})")
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    with open_connection(args) as conn:
        spec = conn.admin.backfill_rollup(args.name, wait=args.wait)
    print(f"rebuilt rollup {spec.name} of {spec.source} from its rows ({spec.state})")
    return 0


def cmd_drop(args: argparse.Namespace) -> int:
    with open_connection(args) as conn:
        conn.admin.drop_rollup(args.name, ignore_if_not_exists=args.if_exists)
    print(f"dropped rollup {args.name}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with open_connection(args) as conn:
        specs = conn.admin.list_rollups(args.source)
    if args.format == "json":
        print(json.dumps([s.to_json() for s in specs], indent=2))
        return 0
    if not specs and args.format == "table":
        print(f"no rollups of {args.source}")
        return 0
    rows = ([s.name, s.state, s.start, ", ".join(k.expression for k in s.keys),
             ", ".join(f"{c.name}={c.expression}" for c in s.columns)] for s in specs)
    emit(header_for(("ROLLUP", "STATE", "START", "KEY", "COLUMNS"), args.format), rows,
         args.format)
    return 0


def add_commands(commands, common: argparse.ArgumentParser) -> None:
    """Add `tally rollup ...` to `tally`'s subparsers (`common`: the shared --verbose)."""
    rollup = commands.add_parser("rollup", parents=[common],
                                 help="add, drop, list or rebuild the rollups of a table")
    actions = rollup.add_subparsers(dest="rollup_command", required=True, metavar="ACTION",
                                    parser_class=type(rollup))

    add = actions.add_parser("add", parents=[common],
                             help="create a rollup of a table, backfilled or from now on")
    add.add_argument("source", help="the source table, '<database>.<table>'")
    add.add_argument("name", help="the rollup table, '<database>.<table>'")
    add.add_argument("--key", action="append", required=True, metavar="EXPRESSION",
                     help="a key: a source column, 'COLUMN AS NAME' or "
                          "\"date_trunc('hour', ts) AS hour\" (repeatable, in order)")
    add.add_argument("--column", action="append", required=True, metavar="NAME=EXPRESSION",
                     help="an aggregate column, e.g. clicks=sum(clicks), n='count(*)' "
                          "(repeatable)")
    add.add_argument("--start", choices=("backfill", "from-now"), default="backfill",
                     help="backfill: built from the source's rows now (epochs on the source "
                          "wait meanwhile); from-now: empty, fed by writes from now on")
    add.add_argument("--buckets", type=int, help="its bucket count (default: the source's)")
    add.add_argument("--wait", type=float, default=60.0,
                     help="seconds a backfill waits for epochs in flight on the source (60)")
    add_connection_arguments(add)
    add.set_defaults(func=cmd_add)

    backfill = actions.add_parser("backfill", parents=[common],
                                  help="rebuild a rollup from its source's rows (after a "
                                       "backfill that died)")
    backfill.add_argument("name", help="the rollup table")
    backfill.add_argument("--wait", type=float, default=60.0,
                          help="seconds it waits for epochs in flight on the source (60)")
    add_connection_arguments(backfill)
    backfill.set_defaults(func=cmd_backfill)

    drop = actions.add_parser("drop", parents=[common], help="drop a rollup and its table")
    drop.add_argument("name", help="the rollup table")
    drop.add_argument("--if-exists", action="store_true", help="succeed when it is absent")
    add_connection_arguments(drop)
    drop.set_defaults(func=cmd_drop)

    list_ = actions.add_parser("list", parents=[common], help="the rollups of a table")
    list_.add_argument("source", help="the source table")
    list_.add_argument("--format", choices=FORMATS, default="table")
    add_connection_arguments(list_)
    list_.set_defaults(func=cmd_list)
