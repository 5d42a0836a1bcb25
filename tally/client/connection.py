"""`tally.connect(url)`: a connection to a Tally cluster, shared safely between threads.

The connection keeps one Flight channel per server, a metadata cache per table, and the retry
policy: a call that fails because a server is unavailable or the cached metadata is stale is
retried, with fresh metadata and growing pauses, until `retry_timeout` runs out. Writes carry
the writer's (id, sequence), so a retry of a write that did land is not applied twice.

Each attempt has its own deadline, well inside the retry budget: `request_timeout` for a unary
call (a write, a lookup, a changelog read, a metadata action), `stream_idle_timeout` for each
wait of a scan's stream. A server that does not answer in time (cut off, paused) thus costs one
attempt, not the budget: its channel is replaced (the old connection may be dead), the table's
routing is fetched again and the next attempt goes to whichever server leads the bucket by then.

Writes and reads also carry the table id their handle resolved: the retry follows a bucket to
its new server, never a name to a new table. A table dropped and re-created under the same
name raises TableRecreatedError instead, and nothing reaches the new table.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, TypeVar

import pyarrow as pa

from locks.client import Locks
from tally.client.admin import Admin
from tally.client.metadata import Route, TableMeta
from tally.errors import (AuthenticationError, InvalidOptionError, StaleMetadataError,
                          TableRecreatedError, UnavailableError)
from tally.wire.channel import (DEFAULT_STREAM_IDLE_TIMEOUT, ChannelPool, FlightChannel,
                                normalize_address, timed_out)
from tally.wire.tls import TlsFiles, is_tls

T = TypeVar("T")
RETRYABLE = (UnavailableError, StaleMetadataError)
DEFAULT_RETRY_TIMEOUT = 60.0
DEFAULT_REQUEST_TIMEOUT = 10.0
DEFAULT_ADMIN_TIMEOUT = 30.0
# How long a coordinator may keep closing new connections at once before the client concludes
# that the transport is refused (see Connection._first_contact).
TRANSPORT_REFUSAL_SECONDS = 5.0
# How long the first ping may take: a coordinator that accepts the connection answers a ping in
# milliseconds, so one that stays silent this long is behind a black hole (a firewall dropping
# packets) or wedged, and waiting the whole request timeout would only hide that.
FIRST_PING_SECONDS = 10.0

log = logging.getLogger(__name__)


class Connection:
    """A cluster connection: `admin`, `table(name)`, `close()`; usable as a context manager."""

    def __init__(self, url: str, token: str | None = None, *,
                 retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT, tls: TlsFiles | None = None,
                 connect_timeout: float = 1.0,
                 stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT,
                 admin_timeout: float = DEFAULT_ADMIN_TIMEOUT) -> None:
        """`tls`: for a `grpc+tls://` cluster, the CA that verifies its servers (None: the
        system's roots) and, for mutual TLS, this client's certificate and key. A connection
        to a TLS coordinator talks TLS to every server, never plaintext.

        `connect_timeout`: how long the first contact keeps trying a coordinator that refuses
        connections before it raises UnavailableError naming the address. A wrong address is
        far more common than a coordinator restarting at that very moment, and a user waiting
        `retry_timeout` in silence cannot tell the two apart. Once connected, calls retry for
        `retry_timeout`, logging each retry.

        `request_timeout`: the deadline of one attempt of a unary call (writes, lookups,
        changelog reads, metadata calls); `stream_idle_timeout`: how long a scan's stream may
        wait for its first answer or its next batch (a stream that makes progress may run
        long); `admin_timeout`: one attempt of a catalog or lock call (they may wait on tablet
        servers themselves). Each well below `retry_timeout`, so that a server that stopped
        answering leaves time to retry elsewhere."""
        for option, value in (("retry_timeout", retry_timeout),
                              ("request_timeout", request_timeout),
                              ("stream_idle_timeout", stream_idle_timeout),
                              ("admin_timeout", admin_timeout)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise InvalidOptionError(f"connection option {option} must be a positive "
                                         f"number of seconds, not {value!r}")
        self.url = normalize_address(url)
        self.token = token
        self.tls = tls if tls is not None else (TlsFiles() if is_tls(self.url) else None)
        self.retry_timeout = retry_timeout
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.admin_timeout = admin_timeout
        # the coordinator in a pool of its own: replaced like any channel that timed out
        self._coordinators = ChannelPool(token, timeout=request_timeout, tls=self.tls)
        self._servers = ChannelPool(token, timeout=request_timeout, tls=self.tls,
                                    stream_idle_timeout=stream_idle_timeout)
        self._meta: dict[str, TableMeta] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._on_close: list[Callable[[], None]] = []
        self.admin = Admin(self)
        self.locks = Locks(self)
        self._first_contact()

    @property
    def _coordinator(self) -> FlightChannel:
        return self._coordinators.get(self.url)

    def _first_contact(self) -> None:
        """Ping the coordinator: fail fast on a wrong URL or token.

        A refused connection (nothing listens there, or the host name resolves to nothing) is
        retried for `connect_timeout`, then raised. A server that keeps closing the connection
        the moment it opens is refusing the transport, not restarting: it serves TLS to a
        plaintext caller, or demands a client certificate this connection lacks; that is said
        within seconds too. A ping that gets no answer at all is not retried."""
        started = time.monotonic()
        ping_timeout = min(FIRST_PING_SECONDS, self._coordinator.timeout)
        while True:
            try:
                self._coordinator.action("ping", {}, timeout=ping_timeout)
                return
            except UnavailableError as e:
                elapsed = time.monotonic() - started
                if "Socket closed" in str(e):
                    if elapsed > min(self.retry_timeout, TRANSPORT_REFUSAL_SECONDS):
                        raise AuthenticationError(
                            f"{self.url} closes every connection at once: it serves TLS "
                            "(connect to grpc+tls://...) or demands a client certificate "
                            "(mutual TLS: pass tls=TlsFiles(ca=..., cert=..., key=...))"
                        ) from None
                elif _timed_out(e) or elapsed + 0.1 > min(self.retry_timeout,
                                                          self.connect_timeout):
                    raise UnavailableError(
                        f"cannot reach the coordinator at {self.url} (tried for "
                        f"{elapsed:.1f} s): {_cause(e, self.url)}") from None
                log.info("first contact with %s: %s; retrying (%.1f s so far)",
                         self.url, e, elapsed)
            time.sleep(0.1)

    # --- plumbing used by admin, tables and writers -------------------------------------

    def coordinator_action(self, name: str, body: dict | None = None,
                           timeout: float | None = None):
        """`timeout`: this call's own per-attempt deadline, for the few calls that wait on
        purpose (settled offsets wait for replication); `admin_timeout` otherwise (catalog and
        lock calls may wait on tablet servers; routing lookups pass `request_timeout`)."""
        timeout = self.admin_timeout if timeout is None else timeout
        return self.retry(lambda: self._coordinator.action(name, body or {}, timeout=timeout),
                          refresh=None, what=f"coordinator call '{name}'")

    def server(self, address: str) -> FlightChannel:
        return self._servers.get(address)

    def table_meta(self, name: str, refresh: bool = False,
                   table_id: int | None = None) -> TableMeta:
        """The cached metadata of table `name` (fetched when absent or `refresh`). With
        `table_id`, it must still be that table: TableRecreatedError when the name now belongs
        to another (checked against fresh metadata, since the cache may lag either way)."""
        with self._lock:
            meta = None if refresh else self._meta.get(name)
        if meta is not None and table_id is not None and meta.table_id != table_id:
            meta = None
        if meta is None:
            meta = TableMeta.from_info(self.coordinator_action("table_info", {"name": name},
                                                             timeout=self.request_timeout))
            with self._lock:
                self._meta[name] = meta
        if table_id is not None and meta.table_id != table_id:
            raise TableRecreatedError.of(name, table_id, meta.table_id)
        return meta

    def adopt(self, name: str, meta: TableMeta) -> None:
        """Cache `meta` of table `name`, fetched by another process of the same read (a Spark
        read's driver hands its metadata to its tasks), unless this connection holds the
        table's already: either serves, since a stale route is refused and then refreshed."""
        with self._lock:
            self._meta.setdefault(name, meta)

    def invalidate(self, name: str) -> None:
        with self._lock:
            self._meta.pop(name, None)

    def route(self, name: str, partition: str | None, bucket: int, table_id: int,
              create_partition: bool = False) -> Route:
        """Where (partition, bucket) of table `name` (still table `table_id`) lives, creating
        a missing partition on the write path (the coordinator refuses when the table turned
        dynamic creation off)."""
        meta = self.table_meta(name, table_id=table_id)
        if partition is not None and not meta.has_partition(partition):
            meta = self.table_meta(name, refresh=True, table_id=table_id)
            if not meta.has_partition(partition) and create_partition:
                self.coordinator_action("create_partition", {
                    "name": name, "partition": partition, "dynamic": True,
                    "table_id": table_id}, timeout=self.request_timeout)
                meta = self.table_meta(name, refresh=True, table_id=table_id)
        return meta.route(partition, bucket)

    def put(self, table: str, table_id: int, partition: str | None, bucket: int, header: dict,
            rows: pa.Table) -> int:
        """Send one write request to the server of (partition, bucket) of `table`, which must
        still be the table `table_id` its writer resolved; the bucket's end offset after it.
        Transient failures are retried with fresh routing and the same header (so the same
        writer sequence: a retry of a request that landed is not applied twice); a missing
        partition is created on the way. The request names the table id, so a server refuses
        it once that table is dropped; the retry then finds the name re-created and raises
        TableRecreatedError rather than follow it."""
        return self.put_range(table, table_id, partition, bucket, header, rows)[1]

    def put_range(self, table: str, table_id: int, partition: str | None, bucket: int,
                  header: dict, rows: pa.Table) -> tuple[int | None, int]:
        """`put`, answering the bucket's offsets before and after the write: the range its
        records took (the start is None when a retry found the write applied already)."""
        def attempt() -> tuple[int | None, int]:
            route = self.route(table, partition, bucket, table_id, create_partition=True)
            ack = self.server(route.address).put({**header, **route.header()}, rows)
            start = ack.get("start_offset")
            return (None if start is None else int(start)), int(ack["end_offset"])

        return self.retry(attempt, refresh=table, what=f"write to {table} "
                          f"{partition + '/' if partition else ''}bucket {bucket}")

    def retry(self, call: Callable[[], T], refresh: str | None, what: str | None = None) -> T:
        """Run `call`, retrying transient failures; `refresh` names a table whose cached
        metadata is dropped before each retry. Each retry of an unavailable server logs a
        warning (what was tried, the server's error naming it, how long so far), so a caller
        waiting on a server that is away sees why."""
        started = time.monotonic()
        deadline = started + self.retry_timeout
        pause = 0.05
        while True:
            try:
                return call()
            except TableRecreatedError:
                raise
            except RETRYABLE as e:
                self.forget_silent_server(e)
                if self._closed or time.monotonic() + pause > deadline:
                    raise
                # Stale metadata is routine (a bucket moved): refreshed silently.
                level = logging.WARNING if isinstance(e, UnavailableError) else logging.DEBUG
                log.log(level, "%s: %s; retrying (%.1f s so far, gives up after %g s)",
                        what or (f"a call on {refresh}" if refresh else "a call"),
                        _reason(e), time.monotonic() - started,
                        self.retry_timeout)
            if refresh is not None:
                self.invalidate(refresh)
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def forget_silent_server(self, error: Exception) -> None:
        """After an attempt that timed out, the next one opens a new connection to that server
        (if it still leads: the retry asks for fresh routing first). The old connection may be
        one the kernel keeps retransmitting on after its peer vanished, where every later call
        would wait out its whole deadline too."""
        server = getattr(error, "server", None)
        if server is None or not timed_out(error):
            return
        channel = getattr(error, "channel", None)
        pool = self._coordinators if normalize_address(server) == self.url else self._servers
        pool.retire(server, channel)
        log.info("%s did not answer in time: its connection is replaced", server)

    # --- public API ---------------------------------------------------------------------

    def table(self, name: str):
        """A handle on table '<database>.<table>' as it is now (asked of the coordinator): the
        handle, its writers and its reads stay with that table (see Table)."""
        from tally.client.table import Table

        return Table(self, name, self.table_meta(name, refresh=True).table_id)

    @property
    def closed(self) -> bool:
        return self._closed

    def on_close(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the connection closes (writers' and lease keepers' cleanup)."""
        with self._lock:
            self._on_close.append(callback)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            callbacks, self._on_close = self._on_close, []
        for callback in callbacks:
            callback()
        self._servers.close()
        self._coordinators.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Connection({self.url!r})"


def _timed_out(error: UnavailableError) -> bool:
    text = str(error).lower()
    return "deadline" in text or "timed out" in text or "timeout" in text


def _reason(error: Exception) -> str:
    """A retry's error in a few words: gRPC's text for a refused connection is three lines'
    worth; the address it starts with is what matters."""
    text = str(error)
    address, sep, _ = text.partition(" is unavailable: ")
    if sep and "connection refused" in text.lower():
        return f"{address} refuses connections"
    return text


def _cause(error: UnavailableError, url: str) -> str:
    """Why a first contact failed, in words (gRPC's text is long and names the address,
    which the message names already)."""
    text = str(error)
    lowered = text.lower()
    if "connection refused" in lowered:
        return "connection refused (is a coordinator running there?)"
    if "resolv" in lowered or "name not found" in lowered or "lookup failed" in lowered:
        return "its host name does not resolve"
    for prefix in (f"{url} is unavailable: ", f"{url} "):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def connect(url: str, token: str | None = None, **options) -> Connection:
    """Connect to the coordinator at `url` ('grpc://host:port', 'host:port', or
    'grpc+tls://host:port' with `tls=TlsFiles(ca=..., cert=..., key=...)` as needed)."""
    return Connection(url, token, **options)
