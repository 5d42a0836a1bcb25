"""The `tally` commands that run servers: `serve` and `local-cluster`.

Kept free of heavy imports (pyarrow, kazoo) so `tally --help` stays instant; each command
imports what it runs.
"""

from __future__ import annotations

import argparse

from tally.server.serve_args import add_serve_arguments, positive_count


def cmd_serve(args: argparse.Namespace) -> int:
    from tally.server.process import serve

    return serve(args)


def cmd_local_cluster(args: argparse.Namespace) -> int:
    """Run a LocalCluster in the foreground until Ctrl-C (a multi-process cluster on one box)."""
    import signal
    import threading

    from tally.server.local_cluster import LocalCluster
    from tally.server.startup_checks import prepare_data_dir

    prepare_data_dir(args.data_dir)  # a bad --data-dir is one line, before any server starts
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with LocalCluster(args.data_dir, tablet_servers=args.tablet_servers,
                      zookeeper=args.zookeeper, authenticate=args.authenticate,
                      metrics=args.metrics) as cluster:
        print(f"coordinator: {cluster.url}", flush=True)
        if args.metrics:
            print(f"coordinator metrics: {cluster.coordinator.metrics}", flush=True)
        if cluster.tokens:
            print(f"auth file (client tokens per role): {cluster.data_dir}/auth.toml",
                  flush=True)
        for handle in cluster.tablet_servers:
            print(f"tablet server {handle.info['server_id']}: {handle.address}", flush=True)
            if args.metrics:
                print(f"tablet server {handle.info['server_id']} metrics: {handle.metrics}",
                      flush=True)
        print("Ctrl-C stops the cluster", flush=True)
        stop.wait()
    return 0


def add_commands(commands) -> None:
    """Add the server commands to `tally`'s subparsers."""
    serve = commands.add_parser("serve", help="run a Tally server (coordinator and/or tablets)")
    add_serve_arguments(serve).set_defaults(func=cmd_serve)

    local = commands.add_parser("local-cluster",
                                help="run a coordinator and N tablet servers as local processes")
    local.add_argument("--data-dir", required=True)
    local.add_argument("--tablet-servers", type=positive_count, default=2, metavar="N")
    local.add_argument("--zookeeper", metavar="HOST:PORT[/CHROOT]")
    local.add_argument("--authenticate", action="store_true",
                       help="make an auth file in the data dir (a cluster credential and a "
                            "client token per role) and require it")
    local.add_argument("--metrics", action="store_true",
                       help="give every server a Prometheus endpoint on a free loopback port "
                            "(printed)")
    local.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="on a failure to start, print the traceback too")
    local.set_defaults(func=cmd_local_cluster)
