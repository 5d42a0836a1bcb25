"""HTTP(S) reads of planned bucket parts, for readers that cannot speak Flight (Spark's JVM).

    POST /part   authorization: Bearer <token>   body: a part ticket (tally.server.tablet.part_tickets)
    -> 200, an Arrow IPC stream (chunked) of the bucket's rows at one offset of its changelog

The endpoint is the Flight server's twin for this one read, with the same guards: it binds the
host Flight binds (on a port of its own), serves TLS with the same certificate (demanding a
client certificate from the same CA under mutual TLS), maps the `authorization` header to a
principal with the same credentials, and authorizes every request as `do_get:scan` (role
read) before reading. What is read comes only from a ticket this process signed through the
`read_tickets` action: a request cannot name another table, bucket or column than was planned.
A read is the tablet server's own scan, batches cast to the Arrow types the reader asked for
when it planned (Spark's), so a faster scan serves these reads unchanged.

A refusal or failure before the first byte is a JSON body {"error": class, "message": ...}
with a status (401, 403, 400, 404, 503, ...); a failure while streaming ends the connection
without the chunked terminator, which the client sees as a cut stream, never as a short one.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa

from tally.errors import (AuthenticationError, ClusterError, InvalidInputError, NotFoundError,
                          PermissionDeniedError, TallyError)
from tally.server.access import TRUSTED, authorize
from tally.server.tablet.part_tickets import MAX_TICKET_BYTES, PartTickets
from tally.wire.messages import AUTH_HEADER

log = logging.getLogger(__name__)

CALL = "do_get:scan"  # what a part read is authorized, timed and counted as
PATH = "/part"
CONTENT_TYPE = "application/vnd.apache.arrow.stream"
BUFFER_BYTES = 1 << 20  # the IPC writer's small writes are sent in chunks of up to this


def _status(exc: BaseException) -> int:
    for cls, status in ((AuthenticationError, 401), (PermissionDeniedError, 403),
                        (NotFoundError, 404), (ClusterError, 503), (InvalidInputError, 400),
                        (TallyError, 409)):
        if isinstance(exc, cls):
            return status
    return 500


class _Chunks(io.RawIOBase):
    """HTTP/1.1 chunked transfer coding over the connection's writer."""

    def __init__(self, out) -> None:
        self._out = out

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if size:
            self._out.write(b"%x\r\n" % size)
            self._out.write(data)
            self._out.write(b"\r\n")
        return size


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a task's parts share a connection
    timeout = 300  # an idle kept-alive connection is closed after this many seconds

    def do_POST(self) -> None:  # noqa: N802 - the http.server hook's name
        self.server.endpoint.answer(self)

    def do_GET(self) -> None:  # noqa: N802
        self.server.endpoint.refuse(self, InvalidInputError(
            f"part reads are POST {PATH} with a part ticket as the body"))

    def log_message(self, format, *args) -> None:  # noqa: A002 - the hook's signature
        pass  # requests are counted in the metrics; refusals are logged where they happen


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, endpoint: "PartReads", context: ssl.SSLContext | None) -> None:
        self.endpoint = endpoint
        self.context = context
        super().__init__(address, _Handler)

    def handle_error(self, request, client_address) -> None:
        # a client that spoke plaintext to TLS, or left: its own failure, not the server's
        log.debug("part read connection from %s failed", client_address, exc_info=True)

    def get_request(self):
        sock, address = super().get_request()
        if self.context is not None:
            # the handshake runs on the request's own thread, so a slow one blocks no other
            sock = self.context.wrap_socket(sock, server_side=True,
                                            do_handshake_on_connect=False)
        return sock, address


def _tls_context(tls) -> ssl.SSLContext | None:
    if tls is None or not tls.serves_tls:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert, tls.key)
    if tls.verify_clients:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(tls.ca)
    return context


class PartReads:
    """The endpoint of one tablet server process, and its `read_tickets` action."""

    def __init__(self, tablets, host: str, port: int, credentials=None, tls=None,
                 metrics=None) -> None:
        """`credentials`, `tls` and `metrics`: the Flight server's (None credentials: every
        caller is trusted, as Flight trusts them, on a loopback host only)."""
        self.tablets = tablets
        self.credentials = credentials
        self.metrics = metrics if metrics is not None else tablets.metrics
        self.tickets = PartTickets()
        context = _tls_context(tls)
        self._server = _Server((host, port), self, context)
        scheme = "https" if context is not None else "http"
        self.url = f"{scheme}://{host}:{self._server.server_address[1]}{PATH}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="part-reads",
                                        daemon=True)
        self._thread.start()
        tablets.actions["read_tickets"] = self.read_tickets

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # --- planning: the action -----------------------------------------------------------------

    def read_tickets(self, body: dict) -> dict:
        """{"endpoint": url, "tickets": [...]}: one ticket per part of `parts` (each a bucket
        this server leads, by table_id, partition_id and bucket), for a scan of `columns` in
        batches of `batch_size`, with `_unwritten` when `unwritten`, cast to the Arrow schema
        `cast` (base64 of its IPC form) when given."""
        parts = body["parts"]
        if not isinstance(parts, list):
            raise InvalidInputError(f"parts must be a list, not {parts!r}")
        cast = body.get("cast")
        if cast is not None:
            cast_schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(cast)))
        scan = {"op": "scan", "columns": body.get("columns"),
                "batch_size": body.get("batch_size", 65536),
                "unwritten": bool(body.get("unwritten", False))}
        tickets = []
        for part in parts:
            header = {**scan, "table_id": part["table_id"],
                      "partition_id": part["partition_id"], "bucket": part["bucket"]}
            hosted = self.tablets.addressed(header)
            self.tablets.leadership(hosted)  # NotLeaderError: the planner re-routes
            if cast is not None:
                _check_cast(hosted, header, cast_schema)
            tickets.append(self.tickets.sign({"scan": header, "cast": cast}))
        return {"endpoint": self.url, "tickets": tickets}

    # --- reading: the HTTP requests -----------------------------------------------------------

    def answer(self, handler: _Handler) -> None:
        started = time.perf_counter()
        try:
            if handler.path != PATH:
                handler.close_connection = True  # its body, unread, is no next request
                raise InvalidInputError(f"part reads are POST {PATH}, not {handler.path!r}")
            length = int(handler.headers.get("content-length") or -1)
            if not 0 < length <= MAX_TICKET_BYTES:
                handler.close_connection = True  # an unread body must not be taken for a request
                raise InvalidInputError(f"a part read's body is its ticket, of 1 to "
                                        f"{MAX_TICKET_BYTES:,} bytes (Content-Length), not "
                                        f"{length}")
            ticket = handler.rfile.read(length)
            authorize(self._principal(handler), CALL)
            request = self.tickets.request(ticket)
            rows = self.tablets.read(request["scan"], None)
            schema = rows.schema
            if request["cast"] is not None:
                schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(request["cast"])))
                schema = schema.with_metadata(rows.schema.metadata)
        except BaseException as e:  # noqa: BLE001 - every failure is answered
            self.metrics.observe(CALL, started)
            self.refuse(handler, e)
            return
        try:
            self._stream(handler, rows, schema)
        except BaseException as e:  # noqa: BLE001
            # nothing typed can follow a started body: the cut stream is the client's error
            handler.close_connection = True
            if not isinstance(e, (ConnectionError, TimeoutError)):
                log.exception("part read of %s failed while streaming", request["scan"])
        finally:
            self.metrics.observe(CALL, started)

    def _principal(self, handler: _Handler):
        if self.credentials is None:
            return TRUSTED
        given = handler.headers.get(AUTH_HEADER)
        principal = self.credentials.principal(given)
        if principal is None:
            raise AuthenticationError("no credential given" if given is None
                                      else "unknown credential")
        return principal

    def _stream(self, handler: _Handler, rows: pa.RecordBatchReader, schema: pa.Schema) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", CONTENT_TYPE)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        out = io.BufferedWriter(_Chunks(handler.wfile), BUFFER_BYTES)
        with pa.ipc.new_stream(pa.PythonFile(out, mode="w"), schema) as writer:
            for batch in rows:
                writer.write_batch(batch if batch.schema.equals(schema) else batch.cast(schema))
        out.flush()
        handler.wfile.write(b"0\r\n\r\n")

    def refuse(self, handler: _Handler, exc: BaseException) -> None:
        self.metrics.refused(CALL, exc)
        if isinstance(exc, (KeyError, TypeError, ValueError)) and \
                not isinstance(exc, TallyError):
            exc = InvalidInputError(f"malformed part read: {type(exc).__name__}: {exc}")
        if isinstance(exc, PermissionDeniedError):
            log.warning("refused a part read: %s", exc)  # an operator wants to see probing
        elif not isinstance(exc, (TallyError, AuthenticationError)):
            log.exception("part read failed")
        body = json.dumps({"error": type(exc).__name__,
                           "message": str(exc).splitlines()[0] if str(exc) else ""}).encode()
        handler.send_response(_status(exc))
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        if handler.close_connection:
            handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(body)


def _check_cast(hosted, header: dict, cast: pa.Schema) -> None:
    """The cast schema must name the scan's columns in order (its types are Spark's)."""
    from merge_engine.kv.row_snapshot import scan_schema

    names = scan_schema(hosted.routing.arrow_schema, header["columns"], header["unwritten"]).names
    if cast.names != names:
        raise InvalidInputError(f"the cast schema names {cast.names}; the scan reads {names}")
