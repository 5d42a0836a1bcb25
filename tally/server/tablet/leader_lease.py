"""When a tablet server may act as the leader of its replicated buckets: its leader lease.

The coordinator elects a new leader for a silent server's buckets only once that server's
session has ended, `session_timeout` after the last heartbeat it answered (lease_grants). A
server that is paused (SIGSTOP, a long GC), cut off or starved cannot know it was deposed
until it hears the coordinator again, and until then it would answer reads from a copy the new
leader has moved past and hold writes that can never be acknowledged. So it stops leading on
its own before the coordinator can have deposed it: it leads only until `lease_seconds` (less
than the session timeout: a margin for clocks running at slightly different rates) after the
*send time* of its last answered heartbeat. The send time, not the answer's arrival: the
coordinator counts the session from when the heartbeat reached it, which is later.

An answer renews the lease only once the roles this server applied are at least as new as the
replica version the answer carries: a newer version may follow a change that deposed this
server, and until the roles of that version are applied it would act on the old ones. Such an
answer leaves the lease as it was (it still runs out at its time) and renews it once the
refresh it asked for is applied.

A deliberate move of a leadership (`move_leader`) deposes a live leader, whose lease still
runs: the coordinator first asks it to resign the bucket under its epoch, and it serves that
bucket under that epoch no more (for `hold` seconds, past any lease the coordinator granted
before the move). A bucket with a single copy needs no lease: nobody else can be elected.

The clock is CLOCK_BOOTTIME where there is one: unlike the monotonic clock it also runs while
the host is suspended, and a lease must never outlive real time.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from tally.errors import NotLeaderError
from tally.server.settings import LEASE_FRACTION, SESSION_TIMEOUT

PENDING_ANSWERS = 16   # answers kept while their roles are on the way (older ones only renew less)


def lease_clock() -> float:
    """Seconds on a clock that never stops while real time passes (suspend included)."""
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return time.monotonic()


def _parsed(version) -> tuple[str, int] | None:
    """A replica version 'coordinator instance:changes', or None when it is not one."""
    if not isinstance(version, str):
        return None
    instance, _, changes = version.rpartition(":")
    try:
        return instance, int(changes)
    except ValueError:
        return None


def covers(applied, answered) -> bool:
    """Whether roles applied at replica version `applied` are at least as new as `answered`:
    the same coordinator instance (a restarted coordinator counts its changes anew) and as
    many changes or more."""
    a, v = _parsed(applied), _parsed(answered)
    if a is None or v is None:
        return applied is not None and applied == answered
    return a[0] == v[0] and a[1] >= v[1]


class LeaderLease:
    def __init__(self, server_id: str, clock: Callable[[], float] = lease_clock,
                 default_seconds: float = SESSION_TIMEOUT * LEASE_FRACTION) -> None:
        """`clock`: the lease's time (tests move it); `default_seconds`: the lease an answer
        that names none grants (a coordinator from before leases)."""
        self.server_id = server_id
        self._clock = clock
        self._default = default_seconds
        self._lock = threading.Lock()
        self._until: float | None = None      # when the lease runs out; None: never held
        self._applied: str | None = None       # the replica version of the roles applied
        self._pending: list[tuple[float, str, float]] = []  # (sent at, version, seconds)
        self._resigned: dict[object, tuple[int, float]] = {}  # bucket -> (epoch, until)

    def now(self) -> float:
        return self._clock()

    # --- what renews it ----------------------------------------------------------------

    def answered(self, sent_at: float, answer: dict) -> None:
        """The coordinator answered a heartbeat sent at `sent_at` (this lease's clock)."""
        seconds = answer.get("lease_seconds", self._default)
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or seconds <= 0:
            return  # no lease granted with this answer (an election deposing us under way)
        version = answer.get("replica_version")
        with self._lock:
            if covers(self._applied, version):
                self._extend(sent_at + seconds)
            else:
                self._pending = (self._pending + [(sent_at, version, float(seconds))])[
                    -PENDING_ANSWERS:]

    def applied(self, version: str) -> None:
        """The roles of replica version `version` are applied: answers it covers renew."""
        with self._lock:
            self._applied = version
            keep = []
            for sent_at, answered, seconds in self._pending:
                if covers(version, answered):
                    self._extend(sent_at + seconds)
                else:
                    keep.append((sent_at, answered, seconds))
            self._pending = keep

    def _extend(self, until: float) -> None:
        if self._until is None or until > self._until:
            self._until = until

    # --- what the read and write paths ask ---------------------------------------------

    def valid(self) -> bool:
        with self._lock:
            return self._until is not None and self._clock() < self._until

    def resign(self, key, epoch: int, hold: float) -> None:
        """Serve `key` under `epoch` no more, for `hold` seconds (its leadership moves)."""
        with self._lock:
            self._resigned[key] = (epoch, self._clock() + hold)

    def check(self, key, epoch: int, label: str) -> None:
        """NotLeaderError (the client re-routes) unless this server may lead `key` under
        `epoch` now."""
        with self._lock:
            now = self._clock()
            resigned = self._resigned.get(key)
            if resigned is not None and now >= resigned[1]:
                del self._resigned[key]
                resigned = None
            if resigned is not None and resigned[0] == epoch:
                raise NotLeaderError(f"{label}: tablet server {self.server_id} resigned its "
                                     f"leadership under epoch {epoch}; the coordinator is "
                                     "moving it to another replica (retry)")
            if self._until is not None and now < self._until:
                return
            if self._until is None:
                why = "it has held no leader lease since it started (no heartbeat answered)"
            else:
                why = (f"its leader lease ran out {now - self._until:.1f} s ago (no heartbeat "
                       "answered since): the coordinator may have elected another leader")
            if self._pending:
                why += f"; the roles of replica version {self._pending[-1][1]} are on their way"
        raise NotLeaderError(f"{label} is not led by tablet server {self.server_id} now: {why} "
                             "(retry)")
