"""Part tickets: a tablet server's signature on one planned bucket read, for its HTTP reads.

A JVM reader (Spark's DataSource V2 source) cannot speak Flight, so it reads each planned part
over HTTP(S) (tally.server.tablet.part_reads) with a ticket the part's leader signed when the read
was planned (the `read_tickets` action, role read). A ticket is the scan request itself (table
id, partition id, bucket, columns, batch size, the Arrow types to cast to) in JSON, then an
HMAC-SHA256 of it under a key this server process drew at start and never shows: whoever holds
a ticket reads that bucket of that table with those columns and nothing else, and a ticket
altered or made up elsewhere is refused. Tickets die with the process (a restarted or replaced
leader refuses them), which is when the planned route would be stale anyway.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets

from tally.errors import PermissionDeniedError

MAX_TICKET_BYTES = 64 * 1024


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PartTickets:
    """Signs scan requests into tickets and gives back the request of a ticket it signed."""

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, hashlib.sha256).digest()

    def sign(self, request: dict) -> str:
        body = json.dumps(request, separators=(",", ":"), sort_keys=True).encode()
        return f"{_b64(body)}.{_b64(self._mac(body))}"

    def request(self, ticket: bytes) -> dict:
        """The scan request `ticket` carries; PermissionDeniedError for any ticket this process
        did not sign exactly so."""
        if len(ticket) > MAX_TICKET_BYTES:
            raise PermissionDeniedError(f"a part ticket of {len(ticket):,} bytes: no ticket "
                                        f"this server signs is over {MAX_TICKET_BYTES:,}")
        try:
            body_text, mac_text = ticket.decode("ascii").split(".")
            body, mac = _unb64(body_text), _unb64(mac_text)
        except ValueError:
            body, mac = b"", b""
        if not body or not hmac.compare_digest(mac, self._mac(body)):
            raise PermissionDeniedError(
                "the part ticket was not signed by this tablet server (altered, made "
                "elsewhere, or signed before the server restarted): plan the read again")
        return json.loads(body)
