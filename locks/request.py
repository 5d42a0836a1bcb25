"""What a lock request names and the bounds on what it may carry: the table (`LockTarget`), a
lease's ttl, the buckets of an attempt registration. Checked before any metadata is read, so a
bad request changes nothing and its error names the value."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tally.errors import InvalidInputError


@dataclass(frozen=True)
class LockTarget:
    """The table a lock is for: its name, id (changes when re-created) and schema."""

    name: str
    table_id: int
    schema: object  # merge_engine.Schema (columns with stable ids, primary key)
    # seconds after expiry that retention keeps what an undo of the lock needs (a table option)
    expired_hold: float = math.inf


# A lease lives `ttl` seconds past its last renewal. Below a tenth of a second no renewal could
# keep it; past a day a dead job's columns stay closed for too long, and an unbounded ttl once
# gave a lock that never expired (inf) or one whose expiry no clock could print (1e300).
MIN_LOCK_TTL = 0.1
MAX_LOCK_TTL = 86400.0


def check_ttl(ttl) -> float:
    """`ttl` as seconds, refused unless a number in [MIN_LOCK_TTL, MAX_LOCK_TTL] (NaN is in no
    range)."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or \
            not MIN_LOCK_TTL <= ttl <= MAX_LOCK_TTL:
        raise InvalidInputError(
            f"A lock ttl must be a number of seconds from {MIN_LOCK_TTL} to {MAX_LOCK_TTL:.0f} "
            f"(one day), got ttl={ttl!r}")
    return float(ttl)


def check_buckets(buckets) -> list[int]:
    """At least one bucket, each a non-negative integer (JSON's true is no bucket)."""
    buckets = list(buckets)
    for bucket in buckets:
        if not isinstance(bucket, int) or isinstance(bucket, bool) or bucket < 0:
            raise InvalidInputError(f"A bucket is a non-negative integer, got {bucket!r}")
    if not buckets:
        raise InvalidInputError("register attempts for at least one bucket")
    return buckets
