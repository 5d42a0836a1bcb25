"""Followers copy their leaders' changelogs: one fetching thread per leader server.

Each thread asks its leader, in one call, for the entries of every bucket this server follows
there, from each bucket's log end (which tells the leader how far the follower holds), and
applies them to the bucket's own KvTablet: rows and changelog alike, so a follower is a hot
standby that can lead at once. Before the first fetch under a new leader epoch, the follower
asks where its own last epoch ended in the leader's log and cuts its log back to there: a
deposed leader drops the tail no one else ever had (it was never acknowledged).

Entries are applied under the bucket's lock and only while the bucket still follows the same
leader epoch, so a bucket that has just become a leader never takes a stale leader's entries.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from tally.errors import TallyError
from tally.server.tablet.tablets import HostedTablet, TabletKey

log = logging.getLogger(__name__)

FETCH_WAIT_MS = 500
FETCH_BYTES = 4 << 20
ERROR_PAUSE = 0.2
UNREACHABLE_PAUSE = 1.0
REBUILD_RETRY = 10.0   # seconds before a copy that no remote snapshot could rebuild tries again


class Following:
    """One followed bucket: its tablet, the role it follows under, whether its log was
    checked against the leader's since the epoch began."""

    def __init__(self, hosted: HostedTablet, role: dict) -> None:
        self.hosted = hosted
        self.role = role
        self.checked = False
        self.stalled: str | None = None  # why fetching stopped (e.g. the leader's log moved on)
        self.retry_at: float | None = None  # when a stalled copy tries a snapshot again

    @property
    def epoch(self) -> int:
        return int(self.role["leader_epoch"])


class LeaderFetcher:
    """The thread that fetches every bucket this server follows on one leader server."""

    def __init__(self, roles, peers, address: str) -> None:
        self.roles = roles
        self.peers = peers
        self.address = address
        self.buckets: dict[TabletKey, Following] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"fetch {address}", daemon=True)
        self._thread.start()

    def follow(self, key: TabletKey, following: Following) -> None:
        with self._lock:
            self.buckets[key] = following

    def unfollow(self, key: TabletKey) -> bool:
        """Stop fetching `key`; whether this fetcher fetches nothing any more."""
        with self._lock:
            self.buckets.pop(key, None)
            return not self.buckets

    def current(self, key: TabletKey, following: Following) -> bool:
        with self._lock:
            return self.buckets.get(key) is following

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                todo = [(k, f) for k, f in self.buckets.items() if f.stalled is None
                        or (f.retry_at is not None and now >= f.retry_at)]
            if not todo:
                self._stop.wait(ERROR_PAUSE)
                continue
            try:
                for key, following in todo:
                    if not following.checked:
                        self._truncate_divergent(key, following)
                self._fetch([(k, f) for k, f in todo if f.checked])
            except TallyError as e:
                # the leader may be gone: our roles are asked for again, and the pause keeps a
                # dead address from being hammered until the election moves us on
                log.info("fetching from %s: %s (retried)", self.address, e)
                self.roles._wake.set()
                self._stop.wait(UNREACHABLE_PAUSE)
            except Exception:  # a follower must keep following: retried
                log.exception("fetching from %s failed (retried)", self.address)
                self._stop.wait(ERROR_PAUSE)

    def _truncate_divergent(self, key: TabletKey, following: Following) -> None:
        """Cut this copy's log back to where its last epoch ended in the leader's log."""
        tablet = following.hosted.tablet
        epochs = tablet.leader_epochs
        if epochs and tablet.log_end_offset > 0:
            last = epochs[-1][0]
            end = int(self.peers.get(self.address).action("replica_epoch_end", {
                "table_id": key.table_id, "partition_id": key.partition_id,
                "bucket": key.bucket, "leader_epoch": following.epoch, "epoch": last}))
            with following.hosted.lock:
                if not self.current(key, following):
                    return
                if end < tablet.log_end_offset:
                    log.warning("%s: dropping offsets [%d, %d) that the leader of epoch %d "
                                "does not have (never acknowledged)", following.hosted.label,
                                end, tablet.log_end_offset, following.epoch)
                    tablet.truncate_tail(max(end, tablet.log_start_offset))
                    following.hosted.acknowledged = min(following.hosted.acknowledged,
                                                        tablet.log_end_offset)
        following.checked = True

    def _fetch(self, todo: list[tuple[TabletKey, Following]]) -> None:
        if not todo:
            return
        from merge_engine.kv.replica_entries import ReplicatedEntry

        header = {"server_id": self.roles.server_id, "max_wait_ms": FETCH_WAIT_MS,
                  "max_bytes": FETCH_BYTES,
                  "buckets": [[k.table_id, k.partition_id, k.bucket, f.epoch,
                               f.hosted.tablet.log_end_offset] for k, f in todo]}
        answer = self.peers.get(self.address).binary_action("replica_fetch", header)
        meta = json.loads(answer.schema.metadata[b"tally.replica"])
        slots = answer.column("slot").to_numpy() if answer.num_rows else None
        for slot, ((key, following), info) in enumerate(zip(todo, meta)):
            error = info.get("error")
            if error == "not_leader":
                self.roles._wake.set()  # our roles are stale: ask the coordinator
                continue
            if error == "diverged":
                following.checked = False  # cut back to the leader's log before fetching
                continue
            if error == "out_of_range":
                self._out_of_range(key, following, info)
                continue
            entries = []
            if slots is not None:
                rows = answer.filter(slots == slot)
                entries = ReplicatedEntry.from_arrow(rows.drop_columns(["slot"]))
            with following.hosted.lock:
                if not self.current(key, following):
                    continue
                tablet = following.hosted.tablet
                if entries:
                    tablet.apply_replicated(entries)
                end = tablet.log_end_offset
                following.hosted.acknowledged = max(following.hosted.acknowledged,
                                                    min(int(info["hw"]), end))
                known = tablet.leader_epochs
                last = known[-1][0] if known else -1
                for epoch, start in info.get("leader_epochs", []):
                    if epoch > last and start <= end:
                        tablet.record_leader_epoch(int(epoch), int(start))
                        last = epoch

    def _out_of_range(self, key: TabletKey, following: Following, info: dict) -> None:
        """The leader's log starts past this copy's end: rebuild the copy from a remote
        snapshot when the server has a remote directory, else stop fetching it. The rebuild
        runs on its own thread: a download takes long, and the other buckets this thread
        fetches must keep their followers in sync meanwhile."""
        why = (f"the leader's log starts at {info['log_start']}, past this copy's end "
               f"{following.hosted.tablet.log_end_offset}")
        loads = self.roles.server.snapshot_loads
        if loads is None or not self.current(key, following):
            self._stall(following, why, retry=False)
            return
        with self._lock:
            following.stalled, following.retry_at = f"{why}; rebuilding from a snapshot", None
        threading.Thread(target=self._rebuild, name=f"rebuild {following.hosted.label}",
                         args=(loads, key, following, why, int(info["log_start"]),
                               int(info["hw"])), daemon=True).start()

    def _rebuild(self, loads, key: TabletKey, following: Following, why: str, log_start: int,
                 high_watermark: int) -> None:
        try:
            loads.rebuild(following.hosted, log_start, high_watermark,
                          lambda: self.current(key, following))
        except TallyError as e:
            self._stall(following, f"{why}, and no remote snapshot rebuilt it ({e})", retry=True)
            return
        except Exception as e:  # the fetch thread must learn of it, or the copy stays stalled
            log.exception("%s: rebuilding from a remote snapshot failed", following.hosted.label)
            self._stall(following, f"{why}, and rebuilding it failed ({e})", retry=True)
            return
        with self._lock:
            following.checked = False
            following.stalled = following.retry_at = None

    def _stall(self, following: Following, why: str, retry: bool) -> None:
        with self._lock:
            following.stalled = why
            following.retry_at = time.monotonic() + REBUILD_RETRY if retry else None
        log.error("%s cannot follow: %s; it needs a snapshot", following.hosted.label, why)

    def close_later(self) -> None:
        """Stop the thread without waiting for its fetch in flight (called under a lock)."""
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Fetchers:
    """The fetching threads of one tablet server, one per leader server it follows."""

    def __init__(self, roles, peers) -> None:
        self.roles = roles
        self.peers = peers
        self._by_address: dict[str, LeaderFetcher] = {}
        self._where: dict[TabletKey, str] = {}
        self._lock = threading.Lock()

    def follow(self, key: TabletKey, hosted: HostedTablet, role: dict) -> None:
        address = role["leader_address"]
        with self._lock:
            previous = self._where.get(key)
            fetcher = self._by_address.get(previous) if previous else None
            if fetcher is not None:
                current = fetcher.buckets.get(key)
                if previous == address and current is not None and \
                        current.epoch == int(role["leader_epoch"]):
                    current.role = role
                    return
                if fetcher.unfollow(key):
                    self._by_address.pop(previous, None)
                    fetcher.close_later()
            fetcher = self._by_address.get(address)
            if fetcher is None:
                fetcher = self._by_address[address] = LeaderFetcher(self.roles, self.peers,
                                                                    address)
            fetcher.follow(key, Following(hosted, role))
            self._where[key] = address

    def unfollow(self, key: TabletKey) -> None:
        with self._lock:
            address = self._where.pop(key, None)
            fetcher = self._by_address.get(address) if address else None
            if fetcher is not None and fetcher.unfollow(key):
                self._by_address.pop(address, None)
                fetcher.close_later()

    def stalled(self) -> dict[str, str]:
        """Followed buckets that cannot fetch, and why (shown as the server's problems)."""
        with self._lock:
            fetchers = list(self._by_address.values())
        out = {}
        for fetcher in fetchers:
            with fetcher._lock:
                for following in fetcher.buckets.values():
                    if following.stalled:
                        out[following.hosted.label] = following.stalled
        return out

    def close(self) -> None:
        with self._lock:
            fetchers, self._by_address = list(self._by_address.values()), {}
        for fetcher in fetchers:
            fetcher.close()
