"""What a server process needs before it starts, checked first so that each failure is one
line naming its port or path, instead of a native log line and "Server did not start properly".

A taken port is a conflict with another process (StartupError, exit status 1, like an existing
table); a path or value that cannot be used is a bad option (InvalidOptionError, status 2).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import ssl
import sys
import tempfile

from tally.errors import InvalidOptionError, TallyError


class StartupError(TallyError):
    """The server could not start: a port it needs is taken, or its Flight server refused."""


def check_port(what: str, host: str, port: int) -> None:
    """Refuse a port another process holds. gRPC binds with SO_REUSEPORT, so a second server on
    a taken port would share it silently with the first; this plain bind does not. Port 0
    is bound too: it proves the host resolves and is this machine's."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InvalidOptionError(f"cannot serve {what} on {host}:{port}: the host does not "
                                 f"resolve ({e.strerror})") from None
    failures = []
    for family, kind, proto, _, address in found:
        with socket.socket(family, kind, proto) as probe:
            # a port whose old connections linger in TIME_WAIT is free to a listener
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise StartupError(f"cannot serve {what} on {host}:{port}: "
                                       f"{e.strerror}") from None
                failures.append(e)
    if failures and len(failures) == len(found):
        raise InvalidOptionError(f"cannot serve {what} on {host}:{port}: "
                                 f"{failures[0].strerror}")


def prepare_data_dir(path: str) -> None:
    """Create the data directory and prove it writable, so a bad --data-dir fails here."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise InvalidOptionError(f"--data-dir {path}: it is a file, not a directory") from None
    except OSError as e:
        raise InvalidOptionError(f"--data-dir {path}: cannot create it: {e.strerror}") from None
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise InvalidOptionError(f"--data-dir {path}: cannot write in it: {e.strerror}") \
            from None


def check_tls(cert: str | None, key: str | None, ca: str | None) -> None:
    """Refuse TLS files that cannot serve, before gRPC refuses them with a log line only."""
    for option, path in (("--tls-cert", cert), ("--tls-key", key), ("--tls-ca", ca)):
        if path is not None and not os.access(path, os.R_OK):
            reason = "no such file" if not os.path.exists(path) else "not readable"
            raise InvalidOptionError(f"{option} {path}: {reason}")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if cert is not None:
        try:
            # an encrypted key would prompt for its passphrase; the server has none to give
            context.load_cert_chain(cert, key, password=lambda: b"")
        except ssl.SSLError as e:
            raise InvalidOptionError(f"--tls-cert {cert} / --tls-key {key}: not a PEM "
                                     f"certificate chain and its unencrypted private key "
                                     f"({e.reason or e})") from None
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except ssl.SSLError as e:
            raise InvalidOptionError(f"--tls-ca {ca}: not a PEM certificate ({e.reason or e})") \
                from None


_NATIVE_PREFIX = re.compile(r"^[EWIF]\d{4} [\d:.]+\s+\d+ \S+\] ")


@contextlib.contextmanager
def native_stderr(replay: bool):
    """Hold what native code (gRPC's C++ logger) writes to fd 2 while the block runs; yields a
    list that receives the held lines. On success they are written out as they came; on a
    failure only when `replay` (--verbose), since the caller reports them in one line."""
    held: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = False
        try:
            yield held
        except BaseException:
            failed = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace")
            held.extend(_NATIVE_PREFIX.sub("", line) for line in text.splitlines()
                        if _NATIVE_PREFIX.match(line))
            if text and (replay or not failed):
                sys.stderr.write(text)
                sys.stderr.flush()


def flight_refusal(what: str, location: str, held: list[str]) -> StartupError:
    """The one line for a Flight server that did not start: gRPC's own reason, from its log."""
    reason = held[-1] if held else "the Flight server did not start"
    if len(held) > 1 and "credentials" in reason:
        reason = held[0]  # the TLS failure's first line names the file's fault
    return StartupError(f"cannot serve {what} on {location}: {reason}")
