"""The Flight server: authentication, authorization, and dispatch of DoAction / DoPut / DoGet.

Authentication maps a call's `authorization` header to a principal (or refuses the call) before
any handler runs; authorization checks that principal's role against the call's row in the role
table before the handler runs, so a refused call changes nothing. One process may run a coordinator, a tablet server, or both (`--role all`); their action tables
are merged, DoPut and DoGet go to the tablet server. Every handler's exception leaves through
`protocol.to_flight_error`, so the caller gets the same `tally.errors` class with the server's
message, and the server goes on serving. Each call is timed, and each refusal counted, in the
process's metrics (tally.server.metrics) here, where every call passes.
"""

from __future__ import annotations

import logging
import time

import pyarrow as pa
import pyarrow.flight as flight

from locks.caller import calling_as
from tally.errors import (AuthenticationError, InvalidInputError, PermissionDeniedError,
                          TallyError)
from tally.server.access import REQUIRED_ROLE, TRUSTED, Principal, authorize, unlisted
from tally.server.metrics import ServerMetrics
from tally.wire.messages import (AUTH_HEADER, MAX_LOOKUP_KEYS, MAX_REQUEST_JSON_BYTES, dumps,
                                 loads, loads_request, parse_ticket, to_flight_error, unframe)

log = logging.getLogger(__name__)


class _Authenticated(flight.ServerMiddleware):
    def __init__(self, principal: Principal) -> None:
        self.principal = principal


class CredentialMiddleware(flight.ServerMiddlewareFactory):
    """Refuses every call whose `authorization` header names no known principal."""

    def __init__(self, credentials, metrics: ServerMetrics) -> None:
        self._credentials = credentials
        self._metrics = metrics

    def start_call(self, info, headers):
        given = (headers.get(AUTH_HEADER) or [None])[0]
        principal = self._credentials.principal(given)
        if principal is None:
            # the call's name is in its body, unread yet: counted under its Flight method
            self._metrics.refusals.labels(_method_name(info.method), "unauthenticated").inc()
            raise flight.FlightUnauthenticatedError(
                "no credential given" if given is None else "unknown credential")
        return _Authenticated(principal)


class TallyFlightServer(flight.FlightServerBase):
    """Serves the coordinator and/or tablet server given to it."""

    def __init__(self, location: str, *, coordinator=None, tablet_server=None,
                 credentials=None, tls=None, metrics: ServerMetrics | None = None) -> None:
        """`credentials`: a `credentials.Credentials`, or None to trust every caller. `tls`: a
        tally.wire.tls.TlsFiles with this server's certificate (and, for mutual TLS, the CA
        that signs client certificates); None serves plaintext. `metrics`: the process's
        (a registry of its own when None)."""
        self.metrics = metrics if metrics is not None else ServerMetrics()
        middleware = {"auth": CredentialMiddleware(credentials, self.metrics)} \
            if credentials else {}
        super().__init__(location, middleware=middleware,
                         **(tls.server_options() if tls is not None else {}))
        self.coordinator = coordinator
        self.tablet_server = tablet_server
        self.actions = {"ping": lambda body: {"ok": True}}
        self.binary_actions: dict = {}  # name -> handler(header, payload) -> bytes
        self.raw_actions: dict = {}  # name -> handler(request: pa.Buffer) -> bytes

    def attach(self, coordinator=None, tablet_server=None) -> None:
        """Add the roles once they exist (they need this server's bound port first)."""
        if coordinator is not None:
            self.coordinator = coordinator
            self.actions.update(coordinator.actions)
        if tablet_server is not None:
            self.tablet_server = tablet_server
            self.actions.update(tablet_server.actions)
            self.binary_actions.update(tablet_server.binary_actions)
            self.raw_actions.update(tablet_server.raw_actions)
        missing = unlisted(list(self.actions) + list(self.binary_actions)
                           + list(self.raw_actions))
        if missing:
            raise TypeError(f"actions {missing} have no required role in the role table")

    @staticmethod
    def _principal(context) -> Principal:
        found = context.get_middleware("auth")
        return TRUSTED if found is None else found.principal

    def call_action(self, name: str, body: dict):
        """Run an action in-process (used by `--role all` instead of a loopback call)."""
        handler = self.actions.get(name)
        if handler is None:
            raise InvalidInputError(f"unknown action {name!r}")
        return handler(body)

    def _tablets(self):
        if self.tablet_server is None:
            raise InvalidInputError("this server runs no tablet server: send data to one")
        return self.tablet_server

    # --- Flight calls -----------------------------------------------------------------------

    def do_action(self, context, action):
        # an unknown name is timed as one, so a caller cannot make up series
        name = action.type if action.type in REQUIRED_ROLE else "unknown"
        started = time.perf_counter()  # not metrics.timed: a context manager costs a lookup
        try:
            return self._action(context, action, name)
        finally:
            self.metrics.observe(name, started)

    def _action(self, context, action, name: str):
        try:
            # an unknown name is refused below, as a malformed request, having changed nothing
            if action.type in REQUIRED_ROLE:
                authorize(self._principal(context), action.type)
        except BaseException as e:  # noqa: BLE001
            raise self._failure(e, action.type, name)
        if action.type in self.raw_actions:
            return self._raw_action(action)
        if action.type in self.binary_actions:
            return self._binary_action(action)
        try:
            if action.body.size > MAX_REQUEST_JSON_BYTES:  # refused before it is copied
                raise InvalidInputError(
                    f"the body of {action.type} carries {action.body.size:,} bytes; the limit "
                    f"is {MAX_REQUEST_JSON_BYTES:,} bytes")
            raw = action.body.to_pybytes()
            body = loads(raw) if raw else {}  # `null`, `[]`, `0` are not empty bodies
            if not isinstance(body, dict):
                raise InvalidInputError("an action body must be a JSON object")
            with calling_as(self._principal(context)):  # whose owner ids and consumers
                result = self.call_action(action.type, body)
        except (KeyError, TypeError, ValueError) as e:
            raise to_flight_error(InvalidInputError(
                f"malformed request for action {action.type!r}: {type(e).__name__}: {e}"))
        except BaseException as e:  # noqa: BLE001 - every error goes back typed
            raise self._failure(e, action.type, name)
        return iter([flight.Result(dumps(result))])

    def _binary_action(self, action):
        def answer():
            header, payload = unframe(action.body, f"a {action.type} request",
                                      MAX_LOOKUP_KEYS if action.type == "lookup_many" else 1)
            if not isinstance(header, dict):
                raise InvalidInputError(f"{action.type} must start with a JSON object")
            return self.binary_actions[action.type](header, payload)

        return self._answered(action, answer)

    def _raw_action(self, action):
        """An action that reads its own request (the point lookup: one pass over its bytes)."""
        return self._answered(action, lambda: self.raw_actions[action.type](action.body))

    def _answered(self, action, answer):
        """The binary result of `answer()` as the action's one result; its errors typed, a
        malformed request's as such."""
        try:
            result = answer()
        except (KeyError, TypeError, ValueError) as e:
            raise to_flight_error(InvalidInputError(
                f"malformed request for action {action.type!r}: {type(e).__name__}: {e}"))
        except BaseException as e:  # noqa: BLE001
            raise self._failure(e, action.type)
        return iter([flight.Result(result)])

    def do_put(self, context, descriptor, reader, writer):
        with self.metrics.timed("do_put") as call:
            try:
                header = self._header(descriptor.command)
                call.name = self._op_name("do_put", header, "put")
                authorize(self._principal(context), call.name)
                tablets = self._tablets()
                rows = tablets.read_batches(reader)
                ack = tablets.write(header, rows)
            except (KeyError, TypeError, ValueError) as e:
                raise to_flight_error(InvalidInputError(
                    f"malformed write request: {type(e).__name__}: {e}"))
            except BaseException as e:  # noqa: BLE001
                raise self._failure(e, "write", call.name)
            writer.write(pa.py_buffer(dumps(ack)))

    def do_get(self, context, ticket):
        started = time.perf_counter()
        call = "do_get"
        try:
            header, payload = parse_ticket(ticket)
            if not isinstance(header, dict):
                raise InvalidInputError("a read ticket must start with a JSON object")
            call = self._op_name("do_get", header, "scan")
            authorize(self._principal(context), call)
            rows = self._tablets().read(header, payload)
        except (KeyError, TypeError, ValueError) as e:
            self.metrics.observe(call, started)
            raise to_flight_error(InvalidInputError(
                f"malformed read request: {type(e).__name__}: {e}"))
        except BaseException as e:  # noqa: BLE001
            self.metrics.observe(call, started)
            raise self._failure(e, "read", call)
        if isinstance(rows, pa.RecordBatchReader):
            # A scan streams its batches: a failure while streaming (the bucket closed under
            # it) must reach the client typed like any other; the call lasts until it ends.
            rows = pa.RecordBatchReader.from_batches(
                rows.schema, self.metrics.streamed(call, started, self._typed(rows, call)))
        else:
            self.metrics.observe(call, started)
        return flight.RecordBatchStream(rows)

    def _typed(self, reader: pa.RecordBatchReader, call: str):
        try:
            yield from reader
        except BaseException as e:  # noqa: BLE001
            raise self._failure(e, "read", call) from None

    @staticmethod
    def _op_name(call: str, header: dict, weakest: str) -> str:
        """The role-table name a DoPut or DoGet is authorized (and timed) as. An unknown op
        is refused by the handler as malformed, but only to a principal the call's weakest op
        admits, so that a refused caller learns nothing from the answer."""
        op = header.get("op")
        name = f"{call}:{op}" if isinstance(op, str) else ""
        return name if name in REQUIRED_ROLE else f"{call}:{weakest}"

    @staticmethod
    def _header(command: bytes) -> dict:
        header = loads_request(command, "a write or read header")
        if not isinstance(header, dict):
            raise InvalidInputError("a write descriptor must be a JSON object")
        return header

    def _failure(self, exc: BaseException, what: str,
                 call: str | None = None) -> flight.FlightError:
        """The Flight error a handler's exception leaves as; a refusal is counted under
        `call` (default `what`, the action's name)."""
        self.metrics.refused(call or what, exc)
        if isinstance(exc, flight.FlightError):
            return exc
        if isinstance(exc, pa.ArrowException) and not isinstance(exc, TallyError):
            exc = InvalidInputError(f"{what}: {exc}")
        if isinstance(exc, PermissionDeniedError):
            log.warning("refused %s: %s", what, exc)  # an operator wants to see probing
        elif not isinstance(exc, (TallyError, AuthenticationError)):
            log.exception("%s failed", what)
        return to_flight_error(exc)


def _method_name(method) -> str:
    """`do_action` for FlightMethod.DO_ACTION: how the refusal metrics name a Flight method."""
    return str(getattr(method, "name", method)).lower()
