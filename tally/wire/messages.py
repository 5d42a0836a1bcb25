"""The wire protocol between clients, tablet servers and the coordinator, over Arrow Flight.

Three Flight calls carry everything:

- **DoAction** `(type, JSON body) -> one JSON result`: admin and metadata (create table, table
  info, partitions, offsets, server registration). Action names are plain strings such as
  `"create_table"`; the coordinator and tablet servers each keep a table of handlers, so later
  features (column locks, commits) add actions without touching the transport.
- **DoPut** `(descriptor = JSON header, Arrow stream) -> JSON ack in app metadata`: one write
  (put or delete) to one bucket. The header names the table id, partition id, bucket, merge
  mode, target columns and the writer's (id, sequence) that makes retries idempotent.
- **DoGet** `(ticket = JSON header [+ "\\n" + Arrow IPC payload]) -> Arrow stream`: scans and
  changelog ranges.
- Point lookups are a *binary* DoAction (`lookup`): body and result are framed the same way
  (JSON header + Arrow IPC), because a DoAction round trip costs a third of a DoGet stream's.
  The key travels as a one-row Arrow table, so every type survives exactly.

Errors travel as `FlightServerError` whose `extra_info` is `{"error": class, "message": text}`;
`raise_remote` turns them back into the same `tally.errors` class on the caller's side.
Authentication is a bearer token in the `authorization` header of every call: a client's token
(with its role), or the cluster credential the servers use among themselves.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from tally.errors import (AuthenticationError, ClusterError, InvalidInputError, TallyError,
                          UnavailableError, error_class)
from tally.wire.decoded_size import (check_decoded_size, refuse_unbounded_encodings, stream_schema,
                                     without_views)
from tally.wire.ipc_guard import measure_stream, read_stream

AUTH_HEADER = "authorization"


def bearer(token: str | None) -> list[tuple[bytes, bytes]]:
    """The call headers that carry `token` (none without a token)."""
    return [(AUTH_HEADER.encode(), f"Bearer {token}".encode())] if token else []


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=_json_default).encode()


# Python's JSON parser recurses once per nesting level, so a request nested 100,000 deep would
# end in a RecursionError (an internal error) after a deep descent; no request of the protocol
# nests beyond a handful of levels.
MAX_JSON_DEPTH = 64
# The per-attempt deadline of a call that reads settled offsets (a lock acquisition, an epoch's
# baseline, an undo's range): the servers wait up to 20 s for unresolved tails, so past that.
SETTLE_WAIT = 40.0
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(rb"[\[\]{}]")


def check_json_depth(data: bytes | str, what: str = "a request") -> None:
    """InvalidInputError when the JSON text `data` nests deeper than MAX_JSON_DEPTH. Brackets
    inside strings do not count; a malformed text is left for the parser to refuse."""
    raw = data.encode() if isinstance(data, str) else data
    brackets = _BRACKET.findall(_STRING.sub(b"", raw))
    deepest = max(itertools.accumulate(1 if b in (b"[", b"{") else -1 for b in brackets),
                  default=0)
    if deepest > MAX_JSON_DEPTH:
        raise InvalidInputError(f"{what} nests JSON {deepest} levels deep; the limit is "
                                f"{MAX_JSON_DEPTH}")


# Parsed JSON takes several times its text in Python objects, so a server bounds the text of a
# request's JSON (action bodies, read and write headers) before parsing it. The largest request
# of the protocol (a commit naming every bucket of a table) stays far below it.
MAX_REQUEST_JSON_BYTES = 4 << 20


def loads(data: bytes, max_bytes: int | None = None, what: str = "a request") -> Any:
    """The JSON document in `data` (None for no bytes), its size (against `max_bytes`, when
    given) and depth checked before parsing."""
    if not data:
        return None
    if max_bytes is not None and len(data) > max_bytes:
        raise InvalidInputError(f"{what} carries {len(data):,} bytes of JSON; the limit is "
                                f"{max_bytes:,} bytes")
    # A text with fewer brackets (or bytes) than that cannot nest deeper: most requests.
    if len(data) > MAX_JSON_DEPTH and data.count(b"{") + data.count(b"[") > MAX_JSON_DEPTH:
        check_json_depth(data)
    return json.loads(data.decode())


def loads_request(data: bytes, what: str = "a request") -> Any:
    """loads() for what a server receives: bounded by MAX_REQUEST_JSON_BYTES."""
    return loads(data, MAX_REQUEST_JSON_BYTES, what)


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


# --- errors -------------------------------------------------------------------------------------


# gRPC refuses response metadata over 16 KiB, and an error travels in it twice (the status
# message, percent-encoded, and extra_info inside the base64 status details): a message echoing
# a huge input would reach the caller as an untyped RESOURCE_EXHAUSTED instead of the error.
# 800 UTF-8 bytes keep the worst case (every byte escaped) near 10 KiB.
MAX_ERROR_BYTES = 800


def _shorten(message: str) -> str:
    raw = message.encode()
    if len(raw) <= MAX_ERROR_BYTES:
        return message
    return f"{raw[:MAX_ERROR_BYTES].decode(errors='ignore')}... " \
           f"({len(raw) - MAX_ERROR_BYTES:,} more bytes)"


def to_flight_error(exc: BaseException) -> flight.FlightError:
    """The Flight error that carries `exc` to the caller with its class and message."""
    if isinstance(exc, AuthenticationError):
        return flight.FlightUnauthenticatedError(str(exc))
    if isinstance(exc, TallyError):
        name, message = type(exc).__name__, str(exc)
    else:  # a bug on the server: say so, with the server's message, rather than hide it
        name, message = "ClusterError", f"internal server error: {type(exc).__name__}: {exc}"
    message = _shorten(message)
    info = dumps({"error": name, "message": message})
    return flight.FlightServerError(f"{name}: {message}", extra_info=info)


def remote_error(exc: flight.FlightError | pa.ArrowException, where: str) -> TallyError:
    """The TallyError a Flight failure stands for (`where` names the server for messages)."""
    info = getattr(exc, "extra_info", None)
    if info:
        try:
            doc = loads(info)
            return error_class(doc["error"])(doc["message"])
        except (ValueError, KeyError, TypeError):
            pass
    if isinstance(exc, flight.FlightUnauthenticatedError):
        return AuthenticationError(f"{where} rejected the request: {_first_line(exc)} (give a "
                                   "token the server's auth file names)")
    text = _first_line(exc)
    # gRPC's "tcp handshaker shutdown" is a TCP connect that timed out (a host cut off), no TLS
    if any(sign in text.lower() for sign in _TLS_FAILURES) and "tcp handshaker" not in text:
        # A handshake that fails will fail again: not a server that is briefly away.
        return AuthenticationError(f"TLS with {where} failed: {text}")
    if isinstance(exc, (flight.FlightUnavailableError, flight.FlightTimedOutError,
                        flight.FlightCancelledError)):
        return UnavailableError(f"{where} is unavailable: {_first_line(exc)}")
    if "Connection refused" in text or "failed to connect" in text.lower() or \
            "Socket closed" in text or "unavailable" in text.lower():
        return UnavailableError(f"{where} is unavailable: {text}")
    return ClusterError(f"{where} failed: {text}")


_TLS_FAILURES = ("ssl", "handshake", "certificate", "tls")


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


# --- request fields -----------------------------------------------------------------------------

_REQUIRED = object()
_KINDS = {int: "an integer", str: "a string", list: "a list", dict: "an object",
          bool: "true or false"}


def field(body: dict, name: str, kind: type, default=_REQUIRED):
    """`body[name]`, which must have the JSON type `kind` (int, str, list, dict or bool), else
    InvalidInputError. Nothing is coerced: "1", 1.0 and true are not the integer 1, so a
    malformed request can never address a real table, bucket or offset by accident. A missing
    field is an error unless a `default` is given (a present null is the wrong type)."""
    if name not in body:
        if default is _REQUIRED:
            raise InvalidInputError(f"malformed request: the field {name!r} is missing")
        return default
    value = body[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidInputError(f"malformed request: the field {name!r} must be {_KINDS[kind]}, "
                                f"not {type(value).__name__}")
    return value


def int_items(values: list, name: str) -> list[int]:
    """The list `values` (of field `name`) checked to hold integers only."""
    for value in values:
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidInputError(f"malformed request: the field {name!r} must hold integers, "
                                    f"not {type(value).__name__}")
    return values


# --- tickets ------------------------------------------------------------------------------------


def frame(header: dict, payload: pa.Table | None = None) -> bytes:
    """The JSON header, then optionally '\\n' and an Arrow IPC stream (compact JSON has no
    raw newline, so the first one ends the header)."""
    data = dumps(header)
    if payload is not None:
        data += b"\n" + table_to_ipc(payload)
    return data


# A framed request (a lookup, a read ticket) carries at most one key, a `lookup_many` at most
# MAX_LOOKUP_KEYS keys: all of it in at most this many bytes (the client splits bigger lookups).
MAX_FRAMED_BYTES = 1 << 20
MAX_LOOKUP_KEYS = 4096
# A scan's batches hold at most this many rows (a server streams them one at a time).
MAX_SCAN_BATCH_ROWS = 1 << 20
# The scan stream's schema metadata: the changelog offset the bucket was read at.
SCAN_OFFSET_KEY = b"tally.offset"
# lookup_many's answer: per key, whether the key has a row.
FOUND_COLUMN = "_found"


def read_options(header: dict, default_batch_rows: int) -> tuple[list | None, int, bool]:
    """A bucket read's (a scan's, a prefix lookup's) `columns` (names, None: all), rows per
    batch and whether the hidden `_unwritten` column is asked for, each checked."""
    columns = header.get("columns")
    if columns is not None:
        columns = field(header, "columns", list)
        if not all(isinstance(c, str) for c in columns):
            raise InvalidInputError(f"columns must be a list of column names, not {columns!r}")
    batch_size = field(header, "batch_size", int, default_batch_rows)
    if not 1 <= batch_size <= MAX_SCAN_BATCH_ROWS:
        raise InvalidInputError(f"batch_size must be between 1 and {MAX_SCAN_BATCH_ROWS:,}, "
                                f"not {batch_size}")
    return columns, batch_size, field(header, "unwritten", bool, False)


def unframe(data: bytes | pa.Buffer, what: str = "a request",
            max_rows: int = 1) -> tuple[dict, pa.Table | None]:
    """The header and the payload of a framed request, each bounded before it is parsed or
    decoded: the whole request to MAX_FRAMED_BYTES, the payload to `max_rows` rows and
    MAX_FRAMED_BYTES once decoded."""
    if len(data) > MAX_FRAMED_BYTES:
        raise InvalidInputError(f"{what} of {len(data):,} bytes exceeds the limit of "
                                f"{MAX_FRAMED_BYTES:,} bytes")
    head, sep, rest = (data.to_pybytes() if isinstance(data, pa.Buffer) else data).partition(b"\n")
    header = loads(head, MAX_REQUEST_JSON_BYTES, what)
    if not sep:
        return header, None
    stream, keys = pa.py_buffer(rest), f"the key{'s' if max_rows > 1 else ''} of {what}"
    refuse_unbounded_encodings(stream_schema(stream), keys)
    payload = read_stream(stream, max_rows=max_rows, max_bytes=MAX_FRAMED_BYTES, what=keys)
    check_decoded_size(payload, MAX_FRAMED_BYTES, keys)
    return header, payload


def make_ticket(header: dict, payload: pa.Table | None = None) -> flight.Ticket:
    """A DoGet ticket: a `frame` of the header and optional payload."""
    return flight.Ticket(frame(header, payload))


def parse_ticket(ticket: flight.Ticket) -> tuple[dict, pa.Table | None]:
    return unframe(ticket.ticket, "a read ticket")


def table_to_ipc(table: pa.Table) -> bytes:
    return _ipc_buffer(table).to_pybytes()


def _ipc_buffer(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


# --- the rows of a write ------------------------------------------------------------------------

# A write's rows travel as the bytes of one Arrow IPC stream, cut into the app metadata of DoPut
# messages under an empty Flight schema, and not as Flight record batches: pyarrow decodes (and
# decompresses) a Flight batch whole before the server sees it, so a 49 KB compressed batch
# would cost gigabytes before any limit could look at it, while raw bytes are counted as they
# arrive and measured (tally.wire.ipc_guard) before anything is decoded.
PUT_SCHEMA = pa.schema([])
PUT_PIECE_BYTES = 1 << 20


def put_pieces(rows: pa.Table) -> Iterator[pa.Buffer]:
    """The pieces of app metadata that carry `rows` in a DoPut (views cast: servers refuse
    them)."""
    data = _ipc_buffer(without_views(rows))
    for start in range(0, data.size, PUT_PIECE_BYTES):
        yield data.slice(start, min(PUT_PIECE_BYTES, data.size - start))


def read_put(reader, max_bytes: int) -> pa.Table:
    """The rows of a DoPut stream. Refused as soon as the bytes received pass `max_bytes`, and
    before decoding when the stream declares more than `max_bytes` decoded (or more rows than
    that: every row of a table takes at least a byte), holds an encoding whose decoded size is
    unbounded, or decodes its dictionaries and nested columns to more than `max_bytes`."""
    if len(reader.schema):
        raise InvalidInputError(
            "a write carries its rows as Arrow IPC bytes in app metadata under an empty Flight "
            f"schema, not as Flight record batches of {reader.schema.names[:5]}")
    data = bytearray()  # grown in place: each piece is copied once and dropped
    while True:
        try:
            chunk = reader.read_chunk()
        except StopIteration:
            break
        if chunk.data is not None and chunk.data.num_rows:
            raise InvalidInputError("a write carries its rows in app metadata, not in batches")
        if chunk.app_metadata is None:
            continue
        if len(data) + chunk.app_metadata.size > max_bytes:
            raise InvalidInputError(
                f"write batch exceeds the server's limit of {max_bytes} bytes; "
                "send smaller batches")
        data += memoryview(chunk.app_metadata)
    if not data:
        raise InvalidInputError("a write carries no rows (an empty Arrow IPC stream)")
    stream = pa.py_buffer(data)
    refuse_unbounded_encodings(stream_schema(stream), "write batch")
    measure_stream(stream, max_rows=max_bytes, max_bytes=max_bytes, what="write batch")
    rows = ipc_to_table(stream)
    check_decoded_size(rows, max_bytes, "write batch")
    return rows


def ipc_to_table(data: bytes | pa.Buffer) -> pa.Table:
    """The table in an Arrow IPC stream; InvalidInputError when the bytes are not one (Arrow
    reports some malformed streams as a plain OSError, which would read as a server bug)."""
    try:
        source = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
        return pa.ipc.open_stream(source).read_all()
    except (pa.ArrowException, OSError) as e:
        raise InvalidInputError(f"malformed Arrow IPC payload: {e}") from None


def schema_to_b64(schema: pa.Schema) -> str:
    import base64

    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    import base64

    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
