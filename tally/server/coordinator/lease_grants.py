"""The leader leases the coordinator has granted, and when each can no longer be running.

Every heartbeat answer grants its tablet server a leader lease (leader_lease) of
`lease_seconds` from the heartbeat's send time; the coordinator counts a server's grant from
the heartbeat's arrival, which is later, and for the longer `session_timeout`. So once
`session_timeout` has passed since the last grant, the server's lease has run out whatever it
saw, and another replica may lead its buckets: elections depose only such servers.

- A coordinator that has just started cannot know what its predecessor granted: every server
  counts as granted at this coordinator's start.
- A server whose port refuses connections (its process is gone: departure_probe) holds no
  lease any more: a dead process answers nothing.
- An answer carries the replica version read *after* its grant is recorded, and an election
  marks the servers it deposes before it checks their grants and until the version has moved
  past the deposition. So an answer either came first (the election sees its grant and waits)
  or carries a version whose roles no longer make the server a leader (it cannot renew with
  it until it applies them); an answer given while the election runs grants nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterable, Iterator

from tally.server.settings import LEASE_FRACTION

_ENDED = float("-inf")


class LeaseGrants:
    def __init__(self, session_timeout: float, clock: Callable[[], float] = time.monotonic,
                 lease_fraction: float = LEASE_FRACTION) -> None:
        """`session_timeout`: how long after a grant the coordinator waits before deposing;
        the lease granted is `lease_fraction` of it. `clock`: tests move it."""
        self.session_timeout = session_timeout
        self.lease_seconds = session_timeout * lease_fraction
        self._clock = clock
        self._started = clock()
        self._granted: dict[str, float] = {}
        self._deposing: dict[str, int] = {}
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._clock()

    @contextlib.contextmanager
    def granting(self, server_id: str, received_at: float) -> Iterator[float | None]:
        """Grant `server_id` a lease for a heartbeat received at `received_at`; yields the
        lease's seconds (None while an election deposing it runs). The answer's replica
        version must be read inside the block."""
        with self._lock:
            if self._deposing.get(server_id):
                yield None
                return
            self._granted[server_id] = max(self._granted.get(server_id, _ENDED), received_at)
            yield self.lease_seconds

    def end(self, server_id: str) -> None:
        """`server_id`'s process is gone: no lease of it can be running."""
        with self._lock:
            self._granted[server_id] = _ENDED

    def held_until(self, server_id: str) -> float:
        """When the last lease granted to `server_id` has surely run out (this clock)."""
        with self._lock:
            return self._granted.get(server_id, self._started) + self.session_timeout

    def held(self, server_id: str) -> bool:
        return self._clock() < self.held_until(server_id)

    @contextlib.contextmanager
    def deposing(self, server_ids: Iterable[str]) -> Iterator[set[str]]:
        """Mark servers an election would depose; yields those whose leases have run out
        (the ones it may depose). The election must move the replica version before the
        block ends."""
        ids = set(server_ids)
        with self._lock:
            for sid in ids:
                self._deposing[sid] = self._deposing.get(sid, 0) + 1
            now = self._clock()
            free = {sid for sid in ids
                    if now >= self._granted.get(sid, self._started) + self.session_timeout}
        try:
            yield free
        finally:
            with self._lock:
                for sid in ids:
                    left = self._deposing[sid] - 1
                    if left:
                        self._deposing[sid] = left
                    else:
                        del self._deposing[sid]
