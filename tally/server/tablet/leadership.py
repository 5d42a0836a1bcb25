"""One bucket led by this tablet server under one leader epoch: its followers' progress, its
high watermark, and the waits of writes and reads on it.

A follower's fetch from offset N says it holds every record below N. The high watermark is the
least of those offsets over the in-sync replicas (the leader's own log end included): every
record below it is on every in-sync copy, so no election can lose it. A write is acknowledged
once the high watermark passes its end, and a read returns once it passes the offset the read
saw, so nothing a reader or a writer was told of can vanish in a failover.

A follower is in sync while it keeps catching up: it has held the leader's log end (as of its
fetch, or of its previous fetch) within the replica lag time. One that has not for longer
leaves the in-sync set (a follower that fetches but cannot write, its disk full, keeps asking
from the same offset and so falls behind), and so does, at once, one whose offset goes back
below what it confirmed before: it lost data (a restored backup, an unsynced crash) and may not
count towards the high watermark. Either rejoins by catching up again. An acknowledgement also
needs min.insync.replicas copies in sync at the moment it is given.

A Leadership object lives for one epoch. When this server is deposed (the coordinator elected
another leader) it is ended: every wait on it fails with NotLeaderError, and the caller
retries on the new leader.
"""

from __future__ import annotations

import threading
import time

from tally.errors import NotEnoughReplicasError, NotLeaderError, UnavailableError
from tally.server.settings import REPLICA_ACK_TIMEOUT, REPLICA_LAG_TIME


class Leadership:
    def __init__(self, server_id: str, hosted, epoch: int, replicas, isr,
                 min_isr: int, lag_time: float = REPLICA_LAG_TIME,
                 clock=time.monotonic) -> None:
        """`hosted`: the server's HostedTablet, whose tablet is replaced when the bucket is
        reopened (a column added, a disk repaired): always read through it. `lag_time`:
        seconds a follower may go without catching up before it leaves the in-sync set."""
        self.server_id = server_id
        self.hosted = hosted
        self.label = hosted.label
        self.epoch = epoch
        self.replicas = tuple(replicas)
        self.isr = frozenset(isr) | {server_id}
        self.min_isr = min_isr
        self.lag_time = lag_time
        self._clock = clock
        now = clock()
        self._fetched: dict[str, int] = {}        # follower -> offset it holds up to
        self._fetches = 0                          # fetches heard, to order them
        self._last_fetch: dict[str, int] = {}      # follower -> the number of its last fetch
        # when each follower last held our log end; a new epoch gives every one a lag time
        self._caught_up: dict[str, float] = {s: now for s in self.replicas}
        # (when, our log end then) at each follower's last fetch: a fetch from at least that
        # end means the follower had caught up at that earlier moment
        self._fetch_end: dict[str, tuple[float, int]] = {}
        # in-sync followers whose offset went back (they lost data): out at the next proposal
        self._lost: set[str] = set()
        # the fetch count when each follower left the in-sync set: it rejoins only by fetching
        # after that, never on progress it reported before (a dead follower's last fetch
        # looks caught up)
        self._left_at: dict[str, int] = {s: 0 for s in self.replicas if s not in isr}
        self._cond = threading.Condition()
        self._ended: str | None = None
        self._hw = min(hosted.acknowledged, hosted.tablet.log_end_offset)
        # Everything in this log when the epoch began may have been shown as acknowledged by
        # the previous leader (an in-sync copy holds all it acknowledged), though this copy
        # may have heard a lower high watermark: offsets are shown only past this point.
        self._epoch_start = hosted.tablet.log_end_offset

    @property
    def tablet(self):
        return self.hosted.tablet

    @property
    def single(self) -> bool:
        """No followers: every write is acknowledged at once, as before replication."""
        return len(self.replicas) == 1

    # --- the high watermark ------------------------------------------------------------

    def high_watermark(self) -> int:
        end = self.tablet.log_end_offset
        if self.single:
            self.hosted.acknowledged = end
            return end
        with self._cond:
            return self._compute()

    def shown_high_watermark(self) -> int:
        """The high watermark to show a reader: once it has reached the log end this epoch
        began at (waiting for the followers until then), so an offset listed before a failover
        is never followed by a lower one after it."""
        hw = self.high_watermark()
        if hw >= self._epoch_start:
            return hw
        return self.wait_replicated(self._epoch_start, writing=False)

    def _compute(self) -> int:
        hw = self.tablet.log_end_offset
        for follower in self.isr:
            if follower != self.server_id:
                hw = min(hw, self._fetched.get(follower, 0))
        self._hw = max(self._hw, hw)
        self.hosted.acknowledged = max(self.hosted.acknowledged, self._hw)
        return self._hw

    def follower_fetched(self, follower: str, offset: int) -> bool:
        """A follower asked for records from `offset`: it holds everything below it, and
        nothing above it any more. Whether it was in sync and has just gone back below what it
        confirmed before (lost data: the caller should have the in-sync set shrunk now)."""
        with self._cond:
            now = self._clock()
            end = self.tablet.log_end_offset
            before = self._fetched.get(follower)
            lost = before is not None and offset < before and follower in self.isr
            if lost:
                self._lost.add(follower)
            # only its offset now counts: a max over its fetches would hide the loss
            self._fetched[follower] = offset
            previous = self._fetch_end.get(follower)
            if offset >= end:
                self._caught_up[follower] = now
            elif previous is not None and offset >= previous[1]:
                self._caught_up[follower] = max(self._caught_up.get(follower, previous[0]),
                                                previous[0])
            self._fetch_end[follower] = (now, end)
            self._fetches += 1
            self._last_fetch[follower] = self._fetches
            self._cond.notify_all()
            return lost

    # --- waits --------------------------------------------------------------------------

    def check_insync(self) -> None:
        """Refuse a write before it is applied when too few copies are in sync."""
        self._check_leading()
        if len(self.isr) < self.min_isr:
            raise NotEnoughReplicasError(
                f"{self.label} has {len(self.isr)} in-sync replica(s) {sorted(self.isr)}, "
                f"fewer than its min.insync.replicas {self.min_isr}: the write was refused and "
                "nothing was applied")

    def wait_replicated(self, end: int, timeout: float = REPLICA_ACK_TIMEOUT,
                        writing: bool = True) -> int:
        """Block until the high watermark reaches `end`; the high watermark then."""
        if self.single:
            self._check_leading()
            return self.tablet.log_end_offset
        deadline = self._clock() + timeout
        with self._cond:
            while True:
                self._check_leading()
                hw = self._compute()
                # checked first: a high watermark that passed the write because the in-sync set
                # shrank to fewer copies than the table asks for acknowledges nothing
                if writing and len(self.isr) < self.min_isr:
                    raise NotEnoughReplicasError(
                        f"{self.label}: the write is in the leader's log up to offset {end} "
                        f"but its in-sync replicas fell to {sorted(self.isr)}, fewer than "
                        f"min.insync.replicas {self.min_isr}: not acknowledged (a retry with "
                        "the same writer sequence is applied once)")
                if hw >= end:
                    return hw
                left = deadline - self._clock()
                if left <= 0:
                    raise UnavailableError(
                        f"{self.label}: followers {sorted(self.isr - {self.server_id})} did "
                        f"not confirm offset {end} within {timeout:g} s (high watermark {hw}); "
                        "not acknowledged, retry")
                self._cond.wait(min(left, 1.0))

    # set by the server's read and write paths: raises NotLeaderError outside its leader lease
    guard = None

    def _check_leading(self) -> None:
        if self._ended is not None:
            raise NotLeaderError(f"{self.label}: {self._ended}")
        if self.guard is not None:
            self.guard(self)

    # --- changes ------------------------------------------------------------------------

    def update(self, isr, min_isr: int, replicas=None, lag_time: float | None = None) -> None:
        """A new in-sync set (and, when the coordinator moved a copy, a new replica set: a
        follower added by re-replication must be asked to join, and a removed one never
        counts again)."""
        with self._cond:
            now = self._clock()
            for follower in self.isr - frozenset(isr):
                self._left_at[follower] = self._fetches
            if replicas is not None and tuple(replicas) != self.replicas:
                for follower in set(replicas) - set(self.replicas):
                    self._left_at[follower] = self._fetches
                    self._caught_up[follower] = now
                for gone in set(self.replicas) - set(replicas):
                    self._fetched.pop(gone, None)
                    self._fetch_end.pop(gone, None)
                self.replicas = tuple(replicas)
            self.isr = frozenset(isr) | {self.server_id}
            # a follower out of the set is an ordinary lagging one: only its new offset counts
            self._lost &= self.isr
            self.min_isr = min_isr
            if lag_time is not None:
                self.lag_time = lag_time
            self._cond.notify_all()

    def end(self, why: str) -> None:
        with self._cond:
            self._ended = why
            self._cond.notify_all()

    @property
    def ended(self) -> bool:
        return self._ended is not None

    def isr_proposal(self) -> tuple[str, ...] | None:
        """The in-sync set this leader should ask for, or None when it is right: a follower
        that has not caught up within the lag time, or whose offset went back, leaves it; one
        out of it joins once it has fetched since it left, from at least the high watermark
        and this epoch's start (what the previous leader may have acknowledged), and caught
        up within the lag time."""
        if self.single:
            return None
        with self._cond:
            now = self._clock()
            hw = self._compute()
            wanted = {self.server_id}
            for follower in self.replicas:
                if follower == self.server_id:
                    continue
                recent = now - self._caught_up.get(follower, now) <= self.lag_time
                if follower in self.isr:
                    if recent and follower not in self._lost:
                        wanted.add(follower)
                elif recent and \
                        self._last_fetch.get(follower, 0) > self._left_at.get(follower, -1) \
                        and self._fetched.get(follower, -1) >= max(hw, self._epoch_start):
                    wanted.add(follower)
            if wanted == set(self.isr):
                return None
            return tuple(s for s in self.replicas if s in wanted)
