"""The `tally` command: parses arguments and hands off to the packages that do the work.

Imports of those packages happen inside each command so `tally version` starts instantly and a
command only loads what it uses (pyarrow and the engine are slow to import).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from tally.cli import (catalog_commands, cluster_commands, exit_codes, lake_commands,
                       read_commands, rollup_commands, server_commands)


class CommandParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`tally: <message>`) and exit status 2, like
    every other failure of a command."""

    def error(self, message: str):
        print(f"tally: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(exit_codes.USAGE)


def positive_int(text: str) -> int:
    value = int(text.replace("_", "").replace(",", ""))
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


# The names `--only` takes, for its help: tally.bench.suite's list, which a test keeps these
# equal to (the CLI must not import the bench package to print its help).
BENCHMARK_NAMES = ("ingest", "rollups", "cluster", "undo", "spark", "spark_read", "replication", "tiering",
                   "faults")


def benchmark_name(text: str) -> str:
    """A name from tally.bench.suite's list, imported only when --only is given (`tally version`
    must not import the bench package)."""
    from tally.bench.suite import NAMES

    if text not in NAMES:
        raise argparse.ArgumentTypeError(f"unknown benchmark {text!r}; choose from {', '.join(NAMES)}")
    return text


def cmd_version(args: argparse.Namespace) -> int:
    import tally

    print(tally.__version__)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from tally.bench.suite import Sizes, run_suite

    sizes = Sizes.scaled(rows=args.rows, keys=args.keys, batch=args.batch, repeat=args.repeat,
                         seed=args.seed, fault_trials=args.fault_trials)
    return run_suite(only=args.only, sizes=sizes, report=args.report,
                     command="tally " + shlex.join(args.argv))


def cmd_demo(args: argparse.Namespace) -> int:
    from tally.demo.run import run

    return run(zookeeper=args.zookeeper)


def build_parser() -> argparse.ArgumentParser:
    # --verbose is accepted before or after the command (`tally -v scan` and `tally scan -v`);
    # SUPPRESS keeps a subcommand's default from overwriting the top level's value.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="on failure, print the traceback too; log every retry")
    parser = CommandParser(prog="tally", description="Tally: a table store for real-time aggregates.",
                           epilog="Exit status: 0 ok, 1 failed, 2 usage, 3 not found, "
                                  "4 cluster unreachable, 5 access denied, 130 interrupted.")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="on failure, print the traceback too; log every retry")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=CommandParser)

    version = commands.add_parser("version", help="print the version")
    version.set_defaults(func=cmd_version)

    bench = commands.add_parser("bench", help="run every benchmark (ingest, rollups, cluster, undo, Spark streaming and reads, replication, tiering, faults); --report writes markdown + plots")
    bench.add_argument("--rows", type=positive_int, default=1_000_000, help="input rows per case (default 1,000,000)")
    bench.add_argument("--keys", type=positive_int, default=100_000, help="distinct keys of case (a) (default 100,000)")
    bench.add_argument("--batch", type=positive_int, default=100_000, help="rows per Arrow batch (default 100,000)")
    bench.add_argument("--repeat", type=positive_int, default=3, help="ingest runs per side, alternating the engine, the floor, DuckDB and the naive loop; the median counts (default 3)")
    bench.add_argument("--seed", type=int, default=42, help="seed of the generated data (default 42)")
    bench.add_argument("--fault-trials", type=positive_int, default=5, help="trials per fault kind of the faults benchmark; its p50 and p99 are over these (default 5)")
    bench.add_argument("--only", action="append", type=benchmark_name, metavar="NAME", help="run only this benchmark (repeatable): " + ", ".join(BENCHMARK_NAMES))
    bench.add_argument("--report", metavar="FILE", help="also write the results as markdown to FILE, with PNG plots in the directory beside it named like FILE (docs/benchmarks.md -> docs/benchmarks/)")
    bench.set_defaults(func=cmd_bench)

    demo = commands.add_parser("demo", help="the end-to-end exactly-once demo: a Spark streaming job, a crash, an undo, a check")
    demo.add_argument("--zookeeper", metavar="HOST:PORT", help="keep the cluster's metadata in this ZooKeeper")
    demo.set_defaults(func=cmd_demo)

    server_commands.add_commands(commands)  # serve, local-cluster
    cluster_commands.add_commands(commands, common)  # servers, locks
    catalog_commands.add_commands(commands, common)  # tables, describe, create, drop
    read_commands.add_commands(commands, common)  # lookup, scan, changelog, offsets
    lake_commands.add_commands(commands, common)  # tier, lake, set-options
    rollup_commands.add_commands(commands, common)  # rollup add, drop, list, backfill
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status (tally.cli.exit_codes). A failure prints one line,
    `tally: <message>`, and with --verbose its traceback."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2, already printed)
        return e.code if isinstance(e.code, int) else exit_codes.USAGE
    args.argv = argv
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return exit_codes.INTERRUPTED
    except BrokenPipeError:  # `tally scan ... | head`: the reader has what it wanted
        # Point stdout at /dev/null so the interpreter's final flush does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return exit_codes.OK
    except Exception as e:  # noqa: BLE001 - every failure becomes one line and a status
        return exit_codes.report(e, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
