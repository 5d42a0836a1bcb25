"""The `tally` commands of the lake: `tier` (a tiering process), `lake` (how far each lake
table is) and `set-options` (turn a live table's lake on or off; refused, naming the fix, where nothing could
tier it)."""

from __future__ import annotations

import argparse

from tally.cli.connect_args import add_connection_arguments, open_connection
from tally.cli.output import FORMATS, emit, header_for
from tally.errors import InvalidOptionError


def cmd_tier(args: argparse.Namespace) -> int:
    """Run a tiering process until SIGTERM or Ctrl-C; without deltalake it refuses at once, in
    one line naming the extra to install (before it reaches the cluster)."""
    import json
    import logging
    import signal
    import threading

    from tally.lake import TierService
    from tally.lake.delta_table import deltalake
    from tally.server.process import READY

    deltalake()  # MissingDependencyError: status 1, `tally: ... pip install ...`
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with open_connection(args) as conn:
        service = TierService(conn, tier_id=args.tier_id)
        service.heartbeat()  # a coordinator without a lake is refused here, at once
        print(f"tiering process {service.tier_id} started", flush=True)
        # the line LocalCluster waits for, as for its servers
        print(f"{READY} {json.dumps({'tier_id': service.tier_id, 'address': None})}",
              flush=True)
        service.run(stop)
    return 0


def cmd_lake(args: argparse.Namespace) -> int:
    """Print per table: the lake version, how many records and seconds it is behind, its last
    round, who tiers it, and its state: ERROR where the last round failed, ALERT where the lake
    lags further than the table's retention allows, and a holder that stopped heartbeating.
    In the table format, first what tiering needs (lake_setup); `--setup` prints only that,
    in any format."""
    from tally.cli.lake_setup import emit_setup, setup_lines

    with open_connection(args) as conn:
        setup = conn.coordinator_action("lake_setup")
        if args.setup:
            emit_setup(setup, args.format)
            return 0
        statuses = [conn.admin.lake_status(args.table)] if args.table else \
            conn.admin.lake_statuses()
    if args.format == "table":
        print("\n".join(setup_lines(setup)), flush=True)
    rows = []
    for s in statuses:
        last = s.last_round or {}
        rows.append((s.name, "" if s.snapshot is None else s.snapshot.version,
                     sum(s.lag_records().values()), round(s.lag_seconds, 1),
                     last.get("rows", ""), last.get("duration_ms", ""), s.tier_id or "",
                     s.tiering_epoch, lake_state(s), s.path or ""))
    emit(header_for(("TABLE", "VERSION", "LAG RECORDS", "LAG SECONDS", "LAST ROWS",
                     "LAST MS", "TIERED BY", "EPOCH", "STATE", "PATH"), args.format),
         rows, args.format)
    return 0


def lake_state(status) -> str:
    """`ok`, or what is wrong with a table's tiering, most urgent first, `; ` between."""
    parts = []
    if status.error:
        parts.append("ERROR: " + " ".join(status.error.split()))  # one line per table
    if status.retention_alert:
        parts.append("ALERT: " + status.retention_alert)
    if status.tier_id is None:
        parts.append("no tiering process")
    elif not status.holder_live:
        parts.append(f"tiering process {status.tier_id} is not heartbeating")
    if status.snapshot is None:
        parts.append("not tiered yet")
    return "; ".join(parts) or "ok"


def cmd_set_options(args: argparse.Namespace) -> int:
    options = {}
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidOptionError(f"--set {item!r}: expected KEY=VALUE")
        options[key.strip()] = value.strip()
    for key in args.reset or []:
        options[key.strip()] = None
    if not options:
        raise InvalidOptionError("nothing to change: give --set KEY=VALUE or --reset KEY")
    with open_connection(args) as conn:
        now = conn.admin.set_table_options(args.table, options)
    print(f"{args.table}: " + (", ".join(f"{k}={v}" for k, v in sorted(now.items()))
                               or "no lake options set"))
    return 0


def add_commands(commands, common: argparse.ArgumentParser) -> None:
    tier = commands.add_parser("tier", parents=[common],
                               help="run a tiering process: copy lake-enabled tables into "
                                    "Delta Lake (needs an admin credential)")
    tier.add_argument("--tier-id", help="this process's name (default: made up)")
    add_connection_arguments(tier)
    tier.set_defaults(func=cmd_tier)

    lake = commands.add_parser("lake", parents=[common],
                               help="how far each table's lake copy is: version, lag, last "
                                    "round")
    lake.add_argument("table", nargs="?", help="only this table")
    lake.add_argument("--format", choices=FORMATS, default="table")
    lake.add_argument("--setup", action="store_true",
                      help="only what tiering needs: the lake directory, deltalake, the "
                           "tiering processes")
    add_connection_arguments(lake)
    lake.set_defaults(func=cmd_lake)

    options = commands.add_parser("set-options", parents=[common],
                                  help="change a live table's lake options "
                                       "(table.datalake.*)")
    options.add_argument("table", help="'<database>.<table>'")
    options.add_argument("--set", action="append", metavar="KEY=VALUE")
    options.add_argument("--reset", action="append", metavar="KEY")
    add_connection_arguments(options)
    options.set_defaults(func=cmd_set_options)
