"""One server process: `tally serve` (and `python -m tally.server`) land here.

Roles: `coordinator` (metadata store + catalog), `tablet` (KvTablets), or `all` (both in one
process, sharing one port: the embedded default). The process binds its port, wires the roles,
prints one `TALLY-READY {json}` line on stdout (LocalCluster waits for it), then serves until
SIGTERM or SIGINT and shuts down cleanly: heartbeats stop, the Flight server drains, tablets
close, the metadata store is released.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import signal
import sys
import threading

from tally.errors import InvalidOptionError, TallyError, UnavailableError
from tally.server.clock import lock_clock
from tally.server.flight_service import TallyFlightServer
from tally.server.metrics import ServerMetrics
from tally.server.serve_args import add_serve_arguments
from tally.server.startup_checks import (StartupError, check_port, check_tls, flight_refusal,
                                         native_stderr, prepare_data_dir)
from tally.server.tablet.server import TabletServer
from tally.wire.channel import ChannelPool, FlightChannel
from tally.wire.tls import TLS_SCHEME, TlsFiles

log = logging.getLogger("tally.server")
READY = "TALLY-READY"


class CoordinatorLink:
    """How a tablet server reaches its coordinator: a fixed URL, or the address the coordinator
    published in ZooKeeper (re-read whenever a call fails, since it moves on restart)."""

    def __init__(self, token: str | None, url: str | None = None, store=None,
                 tls: TlsFiles | None = None) -> None:
        """`token`: the cluster credential (None when the cluster has no credentials)."""
        self._token = token
        self._tls = tls
        self._url = url
        self._store = store
        self._channel: FlightChannel | None = None
        self._lock = threading.Lock()

    def _resolve(self) -> FlightChannel:
        with self._lock:
            if self._channel is None:
                url = self._url
                if url is None:
                    from tally.server.membership import COORDINATOR

                    node = self._store.get(COORDINATOR)
                    if node is None:
                        raise UnavailableError("no coordinator has registered in ZooKeeper yet")
                    url = node.value["address"]
                self._channel = FlightChannel(url, self._token, tls=self._tls)
            return self._channel

    def __call__(self, action: str, body: dict):
        channel = self._resolve()
        try:
            return channel.action(action, body)
        except UnavailableError:
            # a fresh channel next time: the coordinator may have moved (ZooKeeper), and a
            # channel that failed reconnects only after gRPC's growing backoff, seconds after
            # a restarted coordinator is back, while the leader leases of its servers lapse
            with self._lock:
                if self._channel is channel:
                    self._channel = None
            raise


def tls_files(args: argparse.Namespace) -> TlsFiles | None:
    """The process's TLS files: its certificate to serve with, and to present when it calls
    the cluster's other servers; None when it serves plaintext."""
    if not (args.tls_cert or args.tls_key):
        if args.tls_ca or args.tls_verify_clients:
            raise InvalidOptionError("--tls-ca and --tls-verify-clients need --tls-cert and "
                                     "--tls-key")
        return None
    files = TlsFiles(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key,
                     verify_clients=args.tls_verify_clients)
    check_tls(files.cert, files.key, files.ca)
    return files


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def load_credentials(args: argparse.Namespace):
    """The server's Credentials, or None; a server without credentials that would be reachable
    beyond this machine is refused unless the operator said so explicitly."""
    from tally.server.credentials import Credentials

    if args.auth_file:
        try:
            return Credentials.load(args.auth_file)
        except OSError as e:  # a directory, a file it may not read
            raise InvalidOptionError(f"--auth-file {args.auth_file}: cannot read it: "
                                     f"{e.strerror or e}") from None
    if not is_loopback(args.host) and not args.allow_unauthenticated:
        raise InvalidOptionError(
            f"refusing to serve {args.host} without credentials: anyone who reaches the port "
            "could read, write and drop every table. Give --auth-file PATH (or "
            "$TALLY_AUTH_FILE), bind 127.0.0.1, or pass --allow-unauthenticated")
    return None


def serve_metrics(metrics: ServerMetrics, host: str, port: int) -> str:
    """The endpoint's URL; a port that cannot be bound ends the process with one line."""
    check_port("metrics", host, port)
    try:
        return metrics.serve(host, port)
    except OSError as e:  # taken since the check
        raise InvalidOptionError(f"cannot serve metrics on {host}:{port}: "
                                 f"{e.strerror or e}") from None


def check_ports(args: argparse.Namespace) -> None:
    """Every port the roles will bind, before any of them starts (a taken one is one line)."""
    check_port("Flight", args.host, args.port)
    if args.role in ("all", "tablet"):
        check_port("part reads", args.host, args.part_read_port)


class ServerProcess:
    """The roles of one process, started and stopped together."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.coordinator = self.tablet_server = self.registration = self.part_reads = None
        self.metrics = self.flight = None
        self._stores = []
        try:
            self._start(args)
        except BaseException:
            self.close()  # what had started, so an in-process caller is left with nothing
            raise

    def _start(self, args: argparse.Namespace) -> None:
        from tally.meta import open_store

        if args.role == "tablet" and not (args.coordinator or args.zookeeper):
            raise InvalidOptionError("a tablet server needs --coordinator URL or --zookeeper")
        credentials = load_credentials(args)
        cluster_token = credentials.cluster if credentials else None
        prepare_data_dir(args.data_dir)
        tls = tls_files(args)
        check_ports(args)
        self.metrics = ServerMetrics(per_bucket=args.metrics_per_bucket)
        # first, so a port that is taken stops the process before anything else runs; the
        # roles register what they show as they start
        self.metrics_address = None if args.metrics_port is None else \
            serve_metrics(self.metrics, args.metrics_host, args.metrics_port)
        scheme = TLS_SCHEME if tls is not None else "grpc"
        location = f"{scheme}://{args.host}:{args.port}"
        try:
            with native_stderr(replay=getattr(args, "verbose", False)) as held:
                self.flight = TallyFlightServer(location, credentials=credentials, tls=tls,
                                                metrics=self.metrics)
        except TallyError:
            raise
        except Exception as e:  # pyarrow's "Server did not start properly": gRPC logged why
            raise flight_refusal("Flight", f"{args.host}:{args.port}", held) from e
        self.address = f"{scheme}://{args.host}:{self.flight.port}"
        if args.role in ("all", "coordinator"):
            from tally.server.coordinator.coordinator import Coordinator

            store = self._store(open_store(zookeeper=args.zookeeper, data_dir=args.data_dir))
            self.coordinator = Coordinator(
                store, self.address, cluster_token, tls=tls,
                clock=lock_clock(args.lock_clock_file), metrics=self.metrics,
                session_timeout=args.session_timeout,
                default_replication_factor=args.default_replication_factor,
                replica_replace_after=args.replica_replace_after,
                replica_lag_time=args.replica_lag_time,
                datalake_dir=args.datalake_dir, tier_timeout=args.tier_timeout)
            self.flight.attach(coordinator=self.coordinator)
        if args.role in ("all", "tablet"):
            zk = self._store(open_store(zookeeper=args.zookeeper)) if args.zookeeper else None
            if args.role == "all":
                link = self.flight.call_action
            elif args.coordinator or zk is not None:
                link = CoordinatorLink(cluster_token, url=args.coordinator, store=zk, tls=tls)
            else:
                raise InvalidOptionError("a tablet server needs --coordinator URL or "
                                         "--zookeeper")
            remote = None
            if args.remote_dir:
                from tally.server.remote.snapshots import RemoteSnapshots

                remote = RemoteSnapshots(args.remote_dir, keep=args.snapshot_keep)
            self.tablet_server = TabletServer(args.data_dir, self.address, link,
                                              max_batch_bytes=args.max_batch_bytes,
                                              memory_budget=args.memory_budget,
                                              clock=lock_clock(args.lock_clock_file),
                                              metrics=self.metrics,
                                              peers=ChannelPool(cluster_token, tls=tls),
                                              remote=remote,
                                              snapshot_interval=args.snapshot_interval,
                                              segment_interval=args.segment_interval)
            from tally.server.tablet.part_reads import PartReads

            # before attach: it adds the read_tickets action the Flight server then serves
            try:
                self.part_reads = PartReads(self.tablet_server, args.host,
                                            args.part_read_port, credentials, tls, self.metrics)
            except OSError as e:  # taken since the check
                raise StartupError(f"cannot serve part reads on {args.host}:"
                                   f"{args.part_read_port}: {e.strerror or e}") from None
            self.flight.attach(tablet_server=self.tablet_server)
            if zk is not None:
                from tally.server.membership import EphemeralRegistration, live_path

                self.registration = EphemeralRegistration(
                    zk, live_path(self.tablet_server.server_id), {"address": self.address})
            if args.role == "all":
                # in-process, so it cannot fail for want of a coordinator: the server is live
                # before the ready line, and a client that connects at once finds it
                self.tablet_server.send_heartbeat()
            self.tablet_server.start()

    def _store(self, store):
        self._stores.append(store)
        return store

    def ready_line(self) -> str:
        info = {"role": self.args.role, "address": self.address, "pid": os.getpid(),
                "server_id": self.tablet_server.server_id if self.tablet_server else None,
                "metrics": self.metrics_address}
        return f"{READY} {json.dumps(info)}"

    def close(self) -> None:
        if self.registration is not None:
            self.registration.close()
        if self.tablet_server is not None:
            self.tablet_server._heartbeat.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.part_reads is not None:
            self.part_reads.close()
        if self.flight is not None:
            self.flight.shutdown()
        if self.tablet_server is not None:
            self.tablet_server.close()
        if self.coordinator is not None:
            self.coordinator.close()
        for store in self._stores:
            store.close()


def serve(args: argparse.Namespace) -> int:
    """Run one server process until SIGTERM / SIGINT."""
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    kazoo = logging.getLogger("kazoo")
    # While it starts, a ZooKeeper that cannot be reached is one line after the bounded wait,
    # not a warning per retry; once serving, a dropped connection is worth its warning.
    kazoo.setLevel(logging.WARNING if getattr(args, "verbose", False) else logging.CRITICAL)
    # A lookup waiting for the GIL behind a long write would wait the default 5 ms switch
    # interval; a shorter one bounds the tail latency of reads under concurrent writes.
    sys.setswitchinterval(0.001)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    process = ServerProcess(args)
    kazoo.setLevel(logging.WARNING)
    print(process.ready_line(), flush=True)
    log.info("serving %s on %s (data dir %s, metadata %s, metrics %s)", args.role,
             process.address, args.data_dir, args.zookeeper or "embedded",
             process.metrics_address or "off")
    stop.wait()
    log.info("shutting down")
    process.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m tally.server`: a start-up failure is its one line on stderr (the last line of
    a LocalCluster server's log) and status 1; `tally serve` gives the CLI's statuses."""
    parser = add_serve_arguments(argparse.ArgumentParser(prog="python -m tally.server",
                                                         description="Run a Tally server."))
    args = parser.parse_args(argv)
    try:
        return serve(args)
    except (TallyError, OSError) as e:
        if getattr(args, "verbose", False):
            raise
        print(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__,
              file=sys.stderr)
        return 1
