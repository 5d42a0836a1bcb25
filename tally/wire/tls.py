"""TLS for every Flight hop: which PEM files one side of a connection uses.

A server with a certificate serves `grpc+tls://`; with `verify_clients` it also demands a client
certificate signed by `ca` (mutual TLS). A client (a user's connection, or a server calling
another server) verifies the server against `ca` (the system roots when none is given) and
presents `cert`/`key` when it has them. Servers of one cluster call each other with their own
certificate, so one CA and one certificate per server make a mutual-TLS cluster.

A connection that uses TLS never falls back to plaintext: an address without `grpc+tls` is
refused before any credential is sent to it (a downgrade would hand the bearer token and the
rows to whoever answers there).
"""

from __future__ import annotations

import dataclasses

from tally.errors import InvalidOptionError

TLS_SCHEME = "grpc+tls"


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """PEM file paths of one side; all optional (see the module docstring)."""

    ca: str | None = None          # roots that verify the peer
    cert: str | None = None        # this side's certificate chain
    key: str | None = None         # its private key
    verify_clients: bool = False   # a server: demand client certificates signed by `ca`

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidOptionError("TLS needs both a certificate and its private key "
                                     f"(got cert={self.cert!r}, key={self.key!r})")
        if self.verify_clients and self.ca is None:
            raise InvalidOptionError("verifying client certificates needs the CA that signs "
                                     "them (--tls-ca)")

    @property
    def serves_tls(self) -> bool:
        return self.cert is not None

    def client_options(self) -> dict:
        """Keyword arguments of `pyarrow.flight.FlightClient` for a TLS location."""
        options = {}
        if self.ca is not None:
            options["tls_root_certs"] = _read(self.ca, "CA")
        if self.cert is not None:
            options["cert_chain"] = _read(self.cert, "certificate")
            options["private_key"] = _read(self.key, "private key")
        return options

    def server_options(self) -> dict:
        """Keyword arguments of `pyarrow.flight.FlightServerBase` (empty: plaintext)."""
        if not self.serves_tls:
            return {}
        from pyarrow import flight

        options = {"tls_certificates": [flight.CertKeyPair(_read(self.cert, "certificate"),
                                                           _read(self.key, "private key"))]}
        if self.verify_clients:
            options["verify_client"] = True
            options["root_certificates"] = _read(self.ca, "CA")
        return options


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidOptionError(f"cannot read the TLS {what} file {path!r}: "
                                 f"{e.strerror or e}") from None


def is_tls(address: str) -> bool:
    return address.startswith(TLS_SCHEME + "://")
