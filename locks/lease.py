"""Leases and lock records: what the coordinator persists and what an owner holds."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import secrets
from typing import Any

from tally.timestamps import duration, iso

Offsets = dict[tuple[str | None, int], int]


def offsets_to_json(offsets: Offsets) -> list[list[Any]]:
    """{(partition, bucket): offset} as JSON-friendly [[partition, bucket, offset], ...]."""
    return [[p, int(b), int(o)] for (p, b), o in sorted(offsets.items(), key=_order)]


def offsets_from_json(items) -> Offsets:
    return {(p, int(b)): int(o) for p, b, o in items}


def _order(item):
    (partition, bucket), _ = item
    return ("" if partition is None else str(partition), bucket)


def new_lease_secret() -> str:
    return secrets.token_urlsafe(32)


def secret_hash(secret: str) -> str:
    """What the metadata store and the tablet servers keep of a lease's secret. The secret is
    256 random bits, so its SHA-256 lets them check a secret without being able to forge one
    (no salt or slow hash is needed: there is no small space of guesses to search)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret, expected_hash: str) -> bool:
    """Whether `secret` (anything a request sent) hashes to `expected_hash`, in constant time."""
    if not isinstance(secret, str) or not secret:
        return False
    return hmac.compare_digest(secret_hash(secret), expected_hash)


@dataclasses.dataclass(frozen=True)
class Lease:
    """A granted column lock as its owner holds it.

    `token` is the fencing token: it only grows per table, and tablet servers reject writes
    under any token older than the newest one issued for the same columns.
    `tenure` numbers the lock's tenure: an acquisition that finds no unreleased lock of the
    owner starts one (its number is that acquisition's token), and a re-acquisition of the
    owner's unreleased lock continues it. `initial_offsets` are the table's end offsets when the
    tenure began; they stay the same across re-acquisitions, so a restarted job knows where its
    own changes begin even if it crashed before its first commit, and undo never reaches back
    before them into another tenure.
    `secret` is known only to the acquirer: the token is public (`lock_describe` shows it), so
    every call that acts as the owner (renew, write, commit, baseline, attempt, release) must
    also carry the secret, of which the coordinator and the tablet servers keep only a hash.
    """

    table: str
    table_id: int
    owner_id: str
    columns: tuple[str, ...]
    token: int
    expires_at: float
    ttl: float
    initial_offsets: Offsets
    tenure: int = 0
    secret: str = dataclasses.field(default="", repr=False)  # never in logs or tracebacks
    # granted by a takeover of the owner's expired lock: it may only undo and release
    takeover: bool = False

    def __repr__(self) -> str:
        return (f"Lease({self.table!r}, owner {self.owner_id!r}, columns {list(self.columns)}, "
                f"token {self.token}, tenure {self.tenure}, expires {iso(self.expires_at)}, "
                f"ttl {duration(self.ttl)}, initial offsets {self.initial_offsets})")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["columns"] = list(self.columns)
        d["initial_offsets"] = offsets_to_json(self.initial_offsets)
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Lease":
        return cls(
            table=d["table"], table_id=int(d["table_id"]), owner_id=d["owner_id"],
            columns=tuple(d["columns"]), token=int(d["token"]),
            expires_at=float(d["expires_at"]), ttl=float(d["ttl"]),
            initial_offsets=offsets_from_json(d["initial_offsets"]),
            tenure=int(d["tenure"]), secret=d["secret"], takeover=bool(d.get("takeover")),
        )


@dataclasses.dataclass(frozen=True)
class LockRecord:
    """One lock as stored in its own metadata node (columns by stable column id)."""

    owner_id: str
    table_id: int
    column_ids: tuple[int, ...]
    column_names: tuple[str, ...]
    ttl: float
    expires_at: float
    token: int
    initial_offsets: Offsets
    created_at: float
    # bucket -> newest registered task attempt (in-job fencing: a Spark task retry registers
    # before undoing its bucket, and earlier attempts of the owner may no longer write there)
    attempts: dict = dataclasses.field(default_factory=dict)
    tenure: int = 0  # the token of the acquisition that began this tenure
    secret_hash: str = ""  # of the secret of the lease this record was last granted as
    principal: str | None = None  # who began the tenure (None: the servers, no credentials)
    # the current grant is a takeover (for undo and release only), by this principal
    takeover: bool = False
    taken_over_by: str | None = None

    def __repr__(self) -> str:
        return (f"LockRecord(owner {self.owner_id!r}, table id {self.table_id}, columns "
                f"{list(self.column_names)}, token {self.token}, tenure {self.tenure}, created "
                f"{iso(self.created_at)}, expires {iso(self.expires_at)}, ttl "
                f"{duration(self.ttl)}, initial offsets {self.initial_offsets}, attempts "
                f"{self.attempts})")

    def live(self, now: float) -> bool:
        return self.expires_at > now

    def recoverable(self, now: float, hold: float) -> bool:
        """Whether retention still keeps what an undo of this tenure needs: while live, and
        for `hold` seconds after expiry."""
        return self.expires_at + hold > now

    def to_json(self) -> dict:
        return {
            "owner_id": self.owner_id, "table_id": self.table_id,
            "columns": list(self.column_ids), "column_names": list(self.column_names),
            "ttl": self.ttl, "expires_at": self.expires_at, "token": self.token,
            "initial_offsets": offsets_to_json(self.initial_offsets),
            "created_at": self.created_at,
            "attempts": {str(b): n for b, n in self.attempts.items()},
            "tenure": self.tenure, "secret_hash": self.secret_hash,
            "principal": self.principal, "takeover": self.takeover,
            "taken_over_by": self.taken_over_by,
        }

    @classmethod
    def from_json(cls, d: dict) -> "LockRecord":
        return cls(
            owner_id=d["owner_id"], table_id=int(d["table_id"]),
            column_ids=tuple(int(c) for c in d["columns"]),
            column_names=tuple(d["column_names"]), ttl=float(d["ttl"]),
            expires_at=float(d["expires_at"]), token=int(d["token"]),
            initial_offsets=offsets_from_json(d["initial_offsets"]),
            created_at=float(d["created_at"]),
            attempts={int(b): int(n) for b, n in d["attempts"].items()},
            tenure=int(d["tenure"]), secret_hash=d["secret_hash"],
            principal=d.get("principal"), takeover=bool(d.get("takeover")),
            taken_over_by=d.get("taken_over_by"),
        )

    def lease(self, table: str, secret: str) -> Lease:
        """The lease this record grants, for the holder of `secret` (whose hash it keeps)."""
        return Lease(table, self.table_id, self.owner_id, self.column_names, self.token,
                     self.expires_at, self.ttl, dict(self.initial_offsets), self.tenure, secret,
                     self.takeover)

    def describe(self, now: float) -> dict:
        return {
            "owner_id": self.owner_id, "columns": list(self.column_names), "token": self.token,
            "expires_at": self.expires_at, "expires_in": round(self.expires_at - now, 3),
            "ttl": self.ttl, "initial_offsets": offsets_to_json(self.initial_offsets),
            "created_at": self.created_at, "tenure": self.tenure,
            "principal": self.principal, "takeover": self.takeover,
        }


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
