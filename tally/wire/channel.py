"""A channel to one Tally server: the three Flight calls with typed errors and the auth token.

Used by clients, by tablet servers talking to the coordinator and by the coordinator talking to
tablet servers, so every hop speaks the protocol of tally.wire.messages the same way.
`pyarrow.flight.FlightClient` is thread-safe (one gRPC channel), so one channel per address is
shared by all threads of a process through `ChannelPool`.
"""

from __future__ import annotations

import threading
from typing import Iterator

import pyarrow as pa
import pyarrow.flight as flight

from tally.errors import AuthenticationError, TallyError
from tally.wire.messages import (PUT_SCHEMA, bearer, dumps, frame, ipc_to_table, loads,
                                 make_ticket, put_pieces, remote_error)
from tally.wire.tls import TLS_SCHEME, TlsFiles, is_tls

DEFAULT_TIMEOUT = 30.0


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


def open_client(address: str, tls: TlsFiles | None) -> flight.FlightClient:
    """A Flight client for `address`; with `tls`, only over TLS (see tally.wire.tls)."""
    if is_tls(address):
        return flight.FlightClient(address, **(tls or TlsFiles()).client_options())
    if tls is not None:
        raise AuthenticationError(
            f"refusing to call {address} without TLS: this connection uses TLS, and a "
            "plaintext address would receive its credentials and rows unprotected")
    return flight.FlightClient(address)


class FlightChannel:
    """Calls to one server. Every failure surfaces as a `tally.errors` exception."""

    def __init__(self, address: str, token: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, tls: TlsFiles | None = None) -> None:
        self.address = normalize_address(address)
        self._client = open_client(self.address, tls)
        self.timeout = timeout
        self._headers = bearer(token)
        self._options = flight.FlightCallOptions(headers=self._headers, timeout=timeout)
        self._stream_options = flight.FlightCallOptions(headers=self._headers)

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
            raise remote_error(e, self.address) from None
        return loads(results[0].body.to_pybytes()) if results else None

    def lookup(self, request: bytes) -> pa.Buffer:
        """The `lookup` action: a request made by tally.wire.point_keys in (a head naming the
        bucket, then the key), the answer's bytes (tally.wire.lookup_answer) out."""
        try:
            results = list(self._client.do_action(flight.Action("lookup", request),
                                                  self._options))
        except (flight.FlightError, pa.ArrowException) as e:
            raise remote_error(e, self.address) from None
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
            raise remote_error(e, self.address) from None
        if ack is None:
            raise remote_error(flight.FlightServerError("no acknowledgement"), self.address)
        return loads(ack.to_pybytes())

    def get(self, header: dict, payload: pa.Table | None = None) -> pa.Table:
        """DoGet a ticket made of `header` (and an Arrow payload); the whole result stream."""
        try:
            return self._client.do_get(make_ticket(header, payload), self._options).read_all()
        except (flight.FlightError, pa.ArrowException) as e:
            raise remote_error(e, self.address) from None

    def lookup_many(self, header: dict, keys: pa.Table) -> pa.Table:
        """The binary `lookup_many` action: up to MAX_LOOKUP_KEYS keys in, one row per key out
        (with the FOUND_COLUMN), the read offset in its schema metadata."""
        try:
            results = list(self._client.do_action(
                flight.Action("lookup_many", frame(header, keys)), self._options))
        except (flight.FlightError, pa.ArrowException) as e:
            raise remote_error(e, self.address) from None
        return ipc_to_table(results[0].body.to_pybytes())

    def binary_action(self, name: str, header: dict, payload: pa.Table | None = None
                      ) -> pa.Table:
        """A binary action: a framed header (and Arrow payload) in, an Arrow table out."""
        try:
            results = list(self._client.do_action(
                flight.Action(name, frame(header, payload)), self._options))
        except (flight.FlightError, pa.ArrowException) as e:
            raise remote_error(e, self.address) from None
        return ipc_to_table(results[0].body.to_pybytes())

    def stream(self, header: dict) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
        """DoGet a ticket made of `header`, streamed: the stream's schema (with its metadata),
        read before this returns, and its batches as they arrive. The call has no deadline:
        a stream lasts as long as its reader keeps reading."""
        try:
            reader = self._client.do_get(make_ticket(header), self._stream_options)
            schema = reader.schema
        except (flight.FlightError, pa.ArrowException) as e:
            raise remote_error(e, self.address) from None
        return schema, self._batches(reader)

    def _batches(self, reader) -> Iterator[pa.RecordBatch]:
        try:
            while True:
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    return
                if chunk.data is not None:
                    yield chunk.data
        except (flight.FlightError, pa.ArrowException) as e:
            raise remote_error(e, self.address) from None

    def close(self) -> None:
        try:
            self._client.close()
        except (flight.FlightError, pa.ArrowException, TallyError):
            pass


class ChannelPool:
    """One `FlightChannel` per address, created on first use and shared between threads."""

    def __init__(self, token: str | None = None, timeout: float = DEFAULT_TIMEOUT,
                 tls: TlsFiles | None = None) -> None:
        self._token = token
        self._timeout = timeout
        self._tls = tls
        self._channels: dict[str, FlightChannel] = {}
        self._lock = threading.Lock()

    def get(self, address: str) -> FlightChannel:
        key = normalize_address(address)
        with self._lock:
            channel = self._channels.get(key)
            if channel is None:
                channel = self._channels[key] = FlightChannel(key, self._token, self._timeout,
                                                               self._tls)
            return channel

    def discard(self, address: str) -> None:
        """Drop the channel to a server that went away (a new one is made on next use)."""
        with self._lock:
            channel = self._channels.pop(normalize_address(address), None)
        if channel is not None:
            channel.close()

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()
