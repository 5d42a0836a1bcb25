"""The `tally` commands on the catalog: `tables`, `describe`, `create`, `drop`.

`create` takes the Spark sink's table options (`primary-key`, `partition-key`, `bucket.num`,
`fields.<column>.agg`, `fields.<column>.<function>.<parameter>`, `table.*`) as `-o KEY=VALUE`,
so a table is declared the same way from a shell and from a Spark job.
"""

from __future__ import annotations

import argparse
import datetime
import json

from tally.cli.connect_args import add_connection_arguments, open_connection
from tally.cli.output import FORMATS, emit, header_for
from tally.errors import AlreadyExistsError, InvalidOptionError, NotFoundError

# The sink's option names that declare a table (the sink's own keys, repeated here because the
# sink package loads Spark and the CLI must run without it).
PRIMARY_KEY, PARTITION_KEY, BUCKET_NUM = "primary-key", "partition-key", "bucket.num"
CREATE_KEYS = (PRIMARY_KEY, PARTITION_KEY, BUCKET_NUM)


def cmd_tables(args: argparse.Namespace) -> int:
    with open_connection(args) as conn:
        databases = [args.database] if args.database else conn.admin.list_databases()
        names = [f"{db}.{t}" for db in databases for t in conn.admin.list_tables(db)]
    if not names and args.format == "table":
        print("no tables" + (f" in database '{args.database}'" if args.database else ""))
        return 0
    emit(header_for(("TABLE",), args.format), ([n] for n in names), args.format)
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    with open_connection(args) as conn:
        info = conn.admin.describe_table(args.table)
        replicas = conn.admin.bucket_replicas(args.table)
    described = describe(info)
    described["under_replicated"] = under_replicated(replicas)
    if args.format == "json":
        print(json.dumps(described, indent=2))
        return 0
    header = ("COLUMN", "TYPE", "NULLABLE", "KEY", "FUNCTION", "PARAMETERS")
    rows = [(c["name"], c["type"], "yes" if c["nullable"] else "no", c["key"],
             c["function"] or "", ", ".join(f"{k}={json.dumps(v)}"
                                            for k, v in c["parameters"].items()))
            for c in described["columns"]]
    emit(header, rows, "table",
         title=f"{info.name} (table id {info.table_id}, created {described['created_at']})")
    print(f"primary key:   {', '.join(described['primary_key'])}")
    print(f"partition key: {', '.join(described['partition_key']) or '(none)'}")
    print(f"buckets:       {described['buckets']}")
    if described["partition_key"]:
        print(f"partitions:    {', '.join(described['partitions']) or '(none yet)'}")
    options = described["options"]
    print("options:       " + (", ".join(f"{k}={v}" for k, v in sorted(options.items()))
                               or "(none)"))
    lagging = described["under_replicated"]
    print("in sync:       " + ("every copy of every bucket" if not lagging else
                               "UNDER-REPLICATED " + "; ".join(
                                   f"{b['bucket']}: out of sync {', '.join(b['out_of_sync'])}"
                                   for b in lagging)))
    for spec in info.rollups:
        print(f"rollup:        {spec}")
    if info.rollup_of is not None:
        print(f"rollup of:     {info.rollup_of}")
    return 0


def under_replicated(replicas: dict) -> list[dict]:
    """The buckets with copies out of their in-sync set: which bucket, which servers."""
    out = []
    for (partition, bucket), r in sorted(replicas.items(),
                                         key=lambda kv: (kv[0][0] or "", kv[0][1])):
        lagging = [s for s in r["replicas"] if s not in r["isr"]]
        if lagging:
            where = f"bucket {bucket}" + (f" of partition {partition}" if partition else "")
            out.append({"bucket": where, "out_of_sync": lagging})
    return out


def describe(info) -> dict:
    """A table as `describe` shows it: every column with its function and all its parameters
    (defaults included: what the table does, not only what was asked)."""
    from aggfuncs import make_aggregator

    schema = info.descriptor.schema
    columns = []
    for c in schema.columns:
        params = make_aggregator(c.agg, c.name, c.type, c.params).params if c.agg else {}
        key = [k for k, keys in (("primary", schema.primary_key),
                                 ("partition", schema.partition_key)) if c.name in keys]
        columns.append({"name": c.name, "type": str(c.type), "nullable": c.nullable,
                        "key": ", ".join(key), "function": c.agg.value if c.agg else None,
                        "parameters": {k: _plain(v) for k, v in sorted(params.items())}})
    return {"name": info.name, "table_id": info.table_id,
            "created_at": datetime.datetime.fromtimestamp(
                info.created_at, datetime.timezone.utc).isoformat(timespec="seconds"),
            "columns": columns, "primary_key": list(schema.primary_key),
            "partition_key": list(schema.partition_key), "buckets": info.bucket_count,
            "partitions": list(info.partitions), "options": dict(info.descriptor.properties),
            "rollups": [s.to_json() for s in info.rollups],
            "rollup_of": None if info.rollup_of is None else info.rollup_of.to_json()}


def _plain(value):
    return value if isinstance(value, (str, int, float, bool, type(None), list)) else str(value)


def cmd_create(args: argparse.Namespace) -> int:
    descriptor = table_descriptor(args.columns, args.option)
    if args.table.count(".") != 1 or not all(args.table.split(".")):
        raise InvalidOptionError(f"name the table as '<database>.<table>', got {args.table!r}")
    with open_connection(args) as conn:
        if args.if_not_exists:
            try:
                existing = conn.admin.describe_table(args.table)
            except NotFoundError:
                existing = None
            if existing is not None:
                # Succeeding on a table declared otherwise would hide the contradiction.
                if existing.descriptor != descriptor:
                    raise AlreadyExistsError(
                        f"{args.table} exists with another declaration (columns, functions, "
                        f"keys, buckets or options differ; see tally describe {args.table})")
                print(f"{args.table} exists already as declared (table id "
                      f"{existing.table_id}); nothing changed")
                return 0
        conn.admin.create_database(args.table.split(".")[0], ignore_if_exists=True)
        table_id = conn.admin.create_table(args.table, descriptor)
    print(f"created {args.table} (table id {table_id}, {descriptor.bucket_count} buckets)")
    return 0


def table_descriptor(column_specs: list[str], option_pairs: list[str]):
    """The descriptor `create` makes: columns from `NAME:TYPE`, the rest from sink options
    (merge engine `aggregation` unless `table.merge-engine` says otherwise, as the sink)."""
    from merge_engine import TableDescriptor
    from tally.cli.column_types import parse_columns

    options: dict[str, str] = {}
    for pair in option_pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InvalidOptionError(f"an option is given as -o KEY=VALUE, got {pair!r}")
        if key in options:
            raise InvalidOptionError(f"option '{key}' is given twice")
        if key not in CREATE_KEYS and not key.startswith(("fields.", "table.")):
            raise InvalidOptionError(
                f"option '{key}' does not declare a table; `tally create` takes "
                f"{', '.join(CREATE_KEYS)}, fields.<column>.agg, "
                "fields.<column>.<function>.<parameter> and table.*")
        options[key] = value.strip()
    arrow = parse_columns(column_specs)
    primary_key = _names(options.pop(PRIMARY_KEY, ""))
    partition_key = _names(options.pop(PARTITION_KEY, ""))
    if not primary_key:
        raise InvalidOptionError("give the primary key: -o primary-key=COLUMN[,COLUMN...]")
    for key in primary_key + partition_key:
        if key not in arrow.names:
            raise InvalidOptionError(f"key column '{key}' is not among the columns "
                                     f"{arrow.names}")
    options.setdefault("table.merge-engine", "aggregation")
    return TableDescriptor.from_options(arrow, primary_key=primary_key,
                                        partition_key=partition_key, options=options)


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def cmd_add_column(args: argparse.Namespace) -> int:
    from tally.cli.column_types import parse_columns

    field = parse_columns([args.column])[0]
    params = {}
    for pair in args.param or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidOptionError(f"a parameter is given as -p KEY=VALUE, got {pair!r}")
        params[key.strip()] = value.strip()
    with open_connection(args) as conn:
        column_id = conn.admin.add_column(args.table, field.name, field.type, agg=args.agg,
                                          **params)
    print(f"added column {field.name} to {args.table} (column id {column_id})")
    return 0


def cmd_drop(args: argparse.Namespace) -> int:
    with open_connection(args) as conn:
        conn.admin.drop_table(args.table, ignore_if_not_exists=args.if_exists,
                              purge_lake=args.purge_lake)
    print(f"dropped {args.table}" + (" and its lake table" if args.purge_lake else ""))
    return 0


def add_commands(commands, common: argparse.ArgumentParser) -> None:
    """Add the catalog commands to `tally`'s subparsers (`common`: the shared --verbose)."""
    tables = commands.add_parser("tables", parents=[common],
                                 help="list the tables of one database or of all")
    tables.add_argument("database", nargs="?", help="only this database's tables")
    tables.add_argument("--format", choices=FORMATS, default="table")
    add_connection_arguments(tables)
    tables.set_defaults(func=cmd_tables)

    describe_ = commands.add_parser(
        "describe", parents=[common],
        help="a table's columns (type, key, function and all its parameters), keys, buckets, "
             "partitions and options")
    describe_.add_argument("table", help="'<database>.<table>'")
    describe_.add_argument("--format", choices=("table", "json"), default="table")
    add_connection_arguments(describe_)
    describe_.set_defaults(func=cmd_describe)

    create = commands.add_parser(
        "create", parents=[common],
        help="create a table from NAME:TYPE columns and the Spark sink's table options")
    create.add_argument("table", help="'<database>.<table>' (the database is created if "
                                      "missing)")
    create.add_argument("columns", nargs="+", metavar="NAME:TYPE",
                        help="the columns in order, e.g. product:string revenue:'decimal(18,2)'")
    create.add_argument("-o", "--option", action="append", metavar="KEY=VALUE",
                        help="primary-key=a,b (required), partition-key=..., bucket.num=N, "
                             "fields.<column>.agg=<function>, "
                             "fields.<column>.<function>.<parameter>=..., table.*=... "
                             "(repeatable)")
    create.add_argument("--if-not-exists", action="store_true",
                        help="succeed when the table exists already as declared (declared "
                             "otherwise: status 1)")
    add_connection_arguments(create)
    create.set_defaults(func=cmd_create)

    add_column = commands.add_parser(
        "add-column", parents=[common],
        help="add a nullable column to a live table (existing rows read null)")
    add_column.add_argument("table", help="'<database>.<table>'")
    add_column.add_argument("column", metavar="NAME:TYPE", help="e.g. pages:string")
    add_column.add_argument("--agg", metavar="FUNCTION",
                            help="its aggregation function (default: last_value_ignore_nulls)")
    add_column.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                            help="a parameter of the function, e.g. delimiter=; (repeatable)")
    add_connection_arguments(add_column)
    add_column.set_defaults(func=cmd_add_column)

    drop = commands.add_parser("drop", parents=[common], help="drop a table and its data")
    drop.add_argument("table", help="'<database>.<table>'")
    drop.add_argument("--if-exists", action="store_true", help="succeed when it is absent")
    drop.add_argument("--purge-lake", action="store_true",
                      help="delete its lake table too (by default the lake table stays)")
    add_connection_arguments(drop)
    drop.set_defaults(func=cmd_drop)
