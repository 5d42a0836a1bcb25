"""A channel to one Tally server: the three Flight calls with typed errors and the auth token.

Used by clients, by tablet servers talking to the coordinator and by the coordinator talking to
tablet servers, so every hop speaks the protocol of tally.wire.messages the same way.
`pyarrow.flight.FlightClient` is thread-safe (one gRPC channel), so one channel per address is
shared by all threads of a process through `ChannelPool`.

Every call has a deadline: a unary call its channel's `timeout` (or its own), a stream an idle
deadline per batch (tally.wire.stream_feed). Every channel sends gRPC keepalive pings while a
call is in flight, so a connection to a host that stopped answering (cut off, paused) is closed
within about KEEPALIVE_SECONDS + KEEPALIVE_ACK_SECONDS instead of the kernel's TCP timeouts,
and a dead host's connection attempt gives up after CONNECT_SECONDS.
"""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from tally.errors import AuthenticationError, TallyError, UnavailableError
from tally.wire.messages import (PUT_SCHEMA, bearer, dumps, frame, ipc_to_table, loads,
                                 make_ticket, put_pieces, remote_error)
from tally.wire.stream_feed import StreamFeed
from tally.wire.tls import TLS_SCHEME, TlsFiles, is_tls

DEFAULT_TIMEOUT = 30.0
DEFAULT_STREAM_IDLE_TIMEOUT = 20.0
KEEPALIVE_SECONDS = 10.0       # a ping after this long without an answer from the server
KEEPALIVE_ACK_SECONDS = 5.0    # the connection is closed when a ping is unanswered this long
CONNECT_SECONDS = 5.0          # a connection attempt (TCP and HTTP/2 handshake) gives up after
# A channel that timed out is replaced; calls still running on the old one (a healthy stream
# beside a call that timed out) may finish within this before it is closed.
RETIRED_GRACE_SECONDS = 120.0


def transport_options(connect_seconds: float = CONNECT_SECONDS) -> list[tuple[str, int]]:
    """gRPC channel arguments of every Tally channel.

    Keepalive pings go out only while a call is in flight (`permit_without_calls` 0), and at
    most two without data in between (`max_pings_without_data`, gRPC's default, kept on
    purpose): pyarrow's Flight server cannot be given gRPC server arguments, so it keeps
    gRPC's ping policy (pings more often than every 5 minutes while it sends nothing count as
    abuse, and the third such one closes the connection with "too many pings"). Two pings
    without data stay under that, for calls that wait on purpose for minutes; a stream that
    receives batches keeps pinging. An unanswered ping closes the connection after
    `grpc.http2.ping_timeout_ms` (gRPC's own default is a minute, `keepalive_timeout_ms` alone
    does not shorten it). `min_reconnect_backoff_ms` is also gRPC's connect timeout; the
    reconnect backoff is capped at it, so a server back after a partition is reached within
    seconds, not after gRPC's two-minute backoff ceiling."""
    keepalive, ack = int(KEEPALIVE_SECONDS * 1000), int(KEEPALIVE_ACK_SECONDS * 1000)
    connect = max(100, int(connect_seconds * 1000))
    return [("grpc.keepalive_time_ms", keepalive),
            ("grpc.keepalive_timeout_ms", ack),
            ("grpc.http2.ping_timeout_ms", ack),
            ("grpc.keepalive_permit_without_calls", 0),
            ("grpc.http2.max_pings_without_data", 2),
            ("grpc.min_reconnect_backoff_ms", connect),
            ("grpc.initial_reconnect_backoff_ms", min(connect, 500)),
            ("grpc.max_reconnect_backoff_ms", connect)]


def normalize_address(address: str) -> str:
    """'grpc://host:port' from 'host:port', 'grpc://host:port' or 'grpc+tcp://host:port';
    'grpc+tls://host:port' stays as it is."""
    address = address.strip()
    if "://" not in address:
        address = "grpc://" + address
    scheme, _, rest = address.partition("://")
    if scheme == TLS_SCHEME:
        return f"{TLS_SCHEME}://" + rest.rstrip("/")
    if scheme not in ("grpc", "grpc+tcp", "tally"):
        raise ValueError(f"unsupported server URL scheme {scheme!r} in {address!r}")
    return "grpc://" + rest.rstrip("/")


def open_client(address: str, tls: TlsFiles | None,
                connect_seconds: float = CONNECT_SECONDS) -> flight.FlightClient:
    """A Flight client for `address`; with `tls`, only over TLS (see tally.wire.tls)."""
    options = transport_options(connect_seconds)
    if is_tls(address):
        return flight.FlightClient(address, generic_options=options,
                                   **(tls or TlsFiles()).client_options())
    if tls is not None:
        raise AuthenticationError(
            f"refusing to call {address} without TLS: this connection uses TLS, and a "
            "plaintext address would receive its credentials and rows unprotected")
    return flight.FlightClient(address, generic_options=options)


def timed_out(error: BaseException) -> bool:
    """Whether a call failed because its server did not answer in time (a deadline, a stalled
    stream, an unanswered keepalive ping), as opposed to an answer or a refused connection."""
    if getattr(error, "timed_out", False):
        return True
    text = str(error).lower()
    return isinstance(error, UnavailableError) and (
        "deadline" in text or "timed out" in text or "ping timeout" in text)


class FlightChannel:
    """Calls to one server. Every failure surfaces as a `tally.errors` exception; one that
    timed out is an UnavailableError with `timed_out` true and `server` its address."""

    def __init__(self, address: str, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, tls: TlsFiles | None = None, *,
                 stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT,
                 connect_timeout: float = CONNECT_SECONDS) -> None:
        """`timeout`: the deadline of each unary call (an action, a put, a whole-result get).
        `stream_idle_timeout`: how long a stream may wait for its first answer or next batch.
        `connect_timeout`: how long a connection attempt to a silent host may take."""
        self.address = normalize_address(address)
        self._client = open_client(self.address, tls, connect_timeout)
        self.timeout = timeout
        self.stream_idle_timeout = stream_idle_timeout
        self._headers = bearer(token)
        self._options = flight.FlightCallOptions(headers=self._headers, timeout=timeout)
        self._stream_options = flight.FlightCallOptions(headers=self._headers)

    def _failure(self, e: BaseException) -> TallyError:
        if isinstance(e, flight.FlightTimedOutError) and not getattr(e, "extra_info", None):
            error: TallyError = UnavailableError(
                f"{self.address} did not answer within the call's deadline ({self.timeout:g} s "
                f"unless the call sets its own: the client's request_timeout): {e}")
        else:
            error = remote_error(e, self.address)
        if isinstance(error, UnavailableError):
            error.server = self.address
            error.channel = self
            error.timed_out = isinstance(e, flight.FlightTimedOutError) or timed_out(error)
        return error

    def action(self, name: str, body: dict | None = None, timeout: float | None = None
               ) -> object:
        """DoAction `name` with a JSON body; the handler's JSON result. `timeout` overrides
        the channel's for this call."""
        options = self._options if timeout is None else \
            flight.FlightCallOptions(headers=self._headers, timeout=timeout)
        try:
            results = list(self._client.do_action(flight.Action(name, dumps(body or {})),
                                                  options))
        except (flight.FlightError, pa.ArrowException) as e:
            raise self._failure(e) from None
        return loads(results[0].body.to_pybytes()) if results else None

    def lookup(self, request: bytes) -> pa.Buffer:
        """The `lookup` action: a request made by tally.wire.point_keys in (a head naming the
        bucket, then the key), the answer's bytes (tally.wire.lookup_answer) out."""
        try:
            results = list(self._client.do_action(flight.Action("lookup", request),
                                                  self._options))
        except (flight.FlightError, pa.ArrowException) as e:
            raise self._failure(e) from None
        return results[0].body

    def put(self, header: dict, rows: pa.Table) -> dict:
        """DoPut `rows` under `header`; the server's JSON acknowledgement."""
        descriptor = flight.FlightDescriptor.for_command(dumps(header))
        try:
            writer, reader = self._client.do_put(descriptor, PUT_SCHEMA, self._options)
            with writer:
                for piece in put_pieces(rows):
                    writer.write_metadata(piece)
                writer.done_writing()
                ack = reader.read()
        except (flight.FlightError, pa.ArrowException) as e:
            raise self._failure(e) from None
        if ack is None:
            raise remote_error(flight.FlightServerError("no acknowledgement"), self.address)
        return loads(ack.to_pybytes())

    def get(self, header: dict, payload: pa.Table | None = None) -> pa.Table:
        """DoGet a ticket made of `header` (and an Arrow payload); the whole result stream,
        within the channel's `timeout`."""
        try:
            return self._client.do_get(make_ticket(header, payload), self._options).read_all()
        except (flight.FlightError, pa.ArrowException) as e:
            raise self._failure(e) from None

    def lookup_many(self, header: dict, keys: pa.Table) -> pa.Table:
        """The binary `lookup_many` action: up to MAX_LOOKUP_KEYS keys in, one row per key out
        (with the FOUND_COLUMN), the read offset in its schema metadata."""
        try:
            results = list(self._client.do_action(
                flight.Action("lookup_many", frame(header, keys)), self._options))
        except (flight.FlightError, pa.ArrowException) as e:
            raise self._failure(e) from None
        return ipc_to_table(results[0].body.to_pybytes())

    def binary_action(self, name: str, header: dict, payload: pa.Table | None = None
                      ) -> pa.Table:
        """A binary action: a framed header (and Arrow payload) in, an Arrow table out."""
        try:
            results = list(self._client.do_action(
                flight.Action(name, frame(header, payload)), self._options))
        except (flight.FlightError, pa.ArrowException) as e:
            raise self._failure(e) from None
        return ipc_to_table(results[0].body.to_pybytes())

    def stream(self, header: dict, idle_timeout: float | None = None
               ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """DoGet a ticket made of `header`, streamed: the stream's schema (with its metadata),
        read before this returns, and its batches as they arrive. The call as a whole has no
        deadline (a stream lasts as long as it makes progress), but each wait for the schema or
        the next batch gives up after `idle_timeout` (the channel's `stream_idle_timeout` by
        default) with a StreamStalledError, and the call is cancelled."""
        ticket = make_ticket(header)
        feed = StreamFeed(lambda: self._client.do_get(ticket, self._stream_options),
                          self.address,
                          self.stream_idle_timeout if idle_timeout is None else idle_timeout,
                          self._failure, self)
        try:
            schema = feed.schema()
        except BaseException:
            feed.abandon()
            raise
        return schema, feed.batches()

    def close(self) -> None:
        try:
            self._client.close()
        except (flight.FlightError, pa.ArrowException, TallyError):
            pass


class ChannelPool:
    """One `FlightChannel` per address, created on first use and shared between threads."""

    def __init__(self, token: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 tls: TlsFiles | None = None, *,
                 stream_idle_timeout: float = DEFAULT_STREAM_IDLE_TIMEOUT,
                 connect_timeout: float = CONNECT_SECONDS) -> None:
        self._token = token
        self._timeout = timeout
        self._tls = tls
        self._stream_idle_timeout = stream_idle_timeout
        self._connect_timeout = connect_timeout
        self._channels: dict[str, FlightChannel] = {}
        self._retired: list[tuple[float, FlightChannel]] = []
        self._lock = threading.Lock()

    def get(self, address: str) -> FlightChannel:
        key = normalize_address(address)
        with self._lock:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = FlightChannel(
                    key, self._token, self._timeout, self._tls,
                    stream_idle_timeout=self._stream_idle_timeout,
                    connect_timeout=self._connect_timeout)
            return channel

    def discard(self, address: str) -> None:
        """Drop the channel to a server that went away (a new one is made on next use)."""
        with self._lock:
            channel = self._channels.pop(normalize_address(address), None)
        if channel is not None:
            channel.close()

    def retire(self, address: str, channel: FlightChannel | None = None) -> None:
        """Replace the channel to a server that stopped answering: the next call opens a new
        connection (the old one may be a dead TCP connection the kernel still retransmits on),
        while calls still running on the old channel get RETIRED_GRACE_SECONDS before it is
        closed. With `channel`, only if that is still the pool's channel (two callers that
        timed out on one channel retire it once)."""
        key = normalize_address(address)
        now = time.monotonic()
        with self._lock:
            current = self._channels.get(key)
            if current is not None and (channel is None or current is channel):
                del self._channels[key]
                self._retired.append((now, current))
            expired = [c for at, c in self._retired if now - at > RETIRED_GRACE_SECONDS]
            self._retired = [(at, c) for at, c in self._retired
                             if now - at <= RETIRED_GRACE_SECONDS]
        for old in expired:
            old.close()

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
            channels += [c for _at, c in self._retired]
            self._retired = []
        for channel in channels:
            channel.close()
