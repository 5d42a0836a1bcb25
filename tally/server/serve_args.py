"""The arguments of one server process, for `tally serve` and `python -m tally.server` alike.

They live beside the process they configure, so the server needs nothing from the command
line tree above it. Kept free of heavy imports (pyarrow, kazoo) so `tally --help` stays instant.
"""

from __future__ import annotations

import argparse
import os

from tally.errors import InvalidOptionError
from tally.server.settings import (DEFAULT_MAX_BATCH_BYTES, DEFAULT_MEMORY_BUDGET, REPLICA_LAG_TIME,
                                   SEGMENT_INTERVAL, SESSION_TIMEOUT, SNAPSHOT_INTERVAL,
                                   SNAPSHOT_KEEP, TIER_TIMEOUT)
from tally.sizes import parse_size

ROLES = ("all", "coordinator", "tablet")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _memory_budget(value: str) -> int:
    try:
        return parse_size("--memory-budget", value)
    except InvalidOptionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def positive_count(value: str) -> int:
    """An option's whole number of at least 1 (argparse's type)."""
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, not {value!r}")
    return number


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"a number of seconds, not {value!r}")
    return number


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, not {value!r}")
    return port


def add_serve_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--data-dir", required=True, help="where this server keeps its data")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=0,
                        help="port to bind (default: a free one)")
    parser.add_argument("--part-read-port", type=_port, default=0, metavar="PORT",
                        help="port of the HTTP(S) part reads of JVM readers, on --host "
                             "(default: a free one; readers learn it when they plan)")
    parser.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]",
                        help="keep metadata in ZooKeeper (default: embedded in the data dir)")
    parser.add_argument("--role", choices=ROLES, default="all",
                        help="all (default: coordinator + one tablet server), coordinator, tablet")
    parser.add_argument("--coordinator", metavar="URL",
                        help="the coordinator of a tablet server (not needed with --zookeeper)")
    parser.add_argument("--auth-file", metavar="PATH", default=os.environ.get("TALLY_AUTH_FILE"),
                        help="the cluster credential and the client tokens with their roles "
                             "(TOML, mode 0600; default: $TALLY_AUTH_FILE). Without it the "
                             "server trusts every caller and binds loopback only")
    parser.add_argument("--allow-unauthenticated", action="store_true",
                        help="serve a non-loopback address without an auth file: anyone who "
                             "reaches the port may do anything")
    parser.add_argument("--tls-cert", metavar="PEM",
                        help="serve grpc+tls:// with this certificate chain (needs --tls-key)")
    parser.add_argument("--tls-key", metavar="PEM", help="the private key of --tls-cert")
    parser.add_argument("--tls-ca", metavar="PEM",
                        help="the CA that verifies the cluster's other servers (and clients, "
                             "with --tls-verify-clients); default: the system's roots")
    parser.add_argument("--tls-verify-clients", action="store_true",
                        help="mutual TLS: refuse callers without a certificate signed by "
                             "--tls-ca")
    parser.add_argument("--max-batch-bytes", type=positive_count, default=DEFAULT_MAX_BATCH_BYTES,
                        help="largest write request a tablet server accepts, as received and "
                             "as declared once decoded, both checked before decoding "
                             "(default 64 MiB)")
    parser.add_argument("--memory-budget", default=DEFAULT_MEMORY_BUDGET, metavar="SIZE",
                        type=_memory_budget,
                        help="write memory shared by all buckets of a tablet server: half caps "
                             "their row buffers, half their RocksDB memtables, e.g. 512mb "
                             f"(default {DEFAULT_MEMORY_BUDGET})")
    parser.add_argument("--metrics-port", type=_port, metavar="PORT",
                        help="expose Prometheus metrics over HTTP at /metrics on this port "
                             "(0: a free one, printed in the ready line; default: off)")
    parser.add_argument("--metrics-host", default="127.0.0.1", metavar="HOST",
                        help="address the metrics endpoint binds (default 127.0.0.1; it has "
                             "no authentication and names every table)")
    parser.add_argument("--metrics-per-bucket", action="store_true",
                        help="label write and memory metrics by partition and bucket too "
                             "(series multiply by the bucket count of every table)")
    parser.add_argument("--default-replication-factor", type=positive_count, default=1, metavar="N",
                        help="copies of each bucket of a table that sets no "
                             "table.replication.factor (coordinator; default 1)")
    parser.add_argument("--replica-replace-after", type=_seconds, default=60.0,
                        metavar="SECONDS",
                        help="how long a tablet server may be gone before the coordinator "
                             "makes its bucket copies again on other servers (default 60)")
    parser.add_argument("--replica-lag-time", type=_seconds, default=REPLICA_LAG_TIME,
                        metavar="SECONDS",
                        help="how long a follower may go without catching up with its leader "
                             "before it leaves the in-sync set, for tables that set no "
                             "table.replication.lag-time-ms (coordinator; default "
                             f"{REPLICA_LAG_TIME:g})")
    parser.add_argument("--session-timeout", type=_seconds, default=SESSION_TIMEOUT,
                        metavar="SECONDS",
                        help="without ZooKeeper: how long a tablet server may miss heartbeats "
                             "before it counts as gone and its buckets' leadership moves; with "
                             "either store: a leader lease lasts three quarters of it "
                             f"(coordinator; default {SESSION_TIMEOUT:g})")
    parser.add_argument("--datalake-dir", metavar="URI",
                        help="the root of the lake tables that `tally tier` writes (coordinator; "
                             "a local path or a pyarrow filesystem URI); a table's lake table "
                             "is <root>/<database>/<table>")
    parser.add_argument("--tier-timeout", type=_seconds, default=TIER_TIMEOUT, metavar="SECONDS",
                        help="how long a tiering process may miss heartbeats before its tables "
                             f"go to another (coordinator; default {TIER_TIMEOUT:g})")
    parser.add_argument("--remote-dir", metavar="URI",
                        help="upload each led bucket's snapshots and changelog segments here "
                             "(a local path or a pyarrow filesystem URI such as s3://...)")
    parser.add_argument("--snapshot-interval", type=_seconds, default=SNAPSHOT_INTERVAL,
                        metavar="SECONDS",
                        help="with --remote-dir: seconds between snapshots of each led bucket "
                             f"whose log moved (default {SNAPSHOT_INTERVAL:g})")
    parser.add_argument("--segment-interval", type=_seconds, default=SEGMENT_INTERVAL,
                        metavar="SECONDS",
                        help="with --remote-dir: seconds between uploads of each led bucket's "
                             "acknowledged changelog; at most this much is lost when every "
                             f"copy of a bucket is (default {SEGMENT_INTERVAL:g})")
    parser.add_argument("--snapshot-keep", type=positive_count, default=SNAPSHOT_KEEP, metavar="N",
                        help=f"with --remote-dir: snapshots kept per bucket (default "
                             f"{SNAPSHOT_KEEP})")
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS,
                        help="the server log's level (default INFO)")
    # as every tally command takes it; SUPPRESS keeps `tally -v serve`'s value
    parser.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="on a failure to start, print the traceback and gRPC's own log "
                             "lines too")
    parser.add_argument("--lock-clock-file", metavar="PATH", help=argparse.SUPPRESS)  # tests
    return parser
