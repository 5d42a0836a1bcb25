"""What the coordinator does after every lock change: send the table's new lock view to the
tablet servers, and wait only where fencing needs it.

Every live tablet server (and every server leading a bucket of the table, or sent views
before) gets the view in the background (view_delivery). A renewal only moves an expiry
later, which fences nobody, so it waits for no one. Every other change (a new token, an
attempt, a lock removed) answers its caller only once every server *leading a bucket it
fences* has confirmed the view (every bucket of the table; an attempt registration, the
buckets it registers), so that what the caller does next (an undo reads the end offsets after
its takeover or attempt) can rely on it: from then on no leader accepts a write under what the
change superseded. While it waits it looks again every second at who leads: a bucket that
moved off an unanswering server is waited for on its new leader instead (which fetches the
view itself before its first write there, tablet_check). A leader that does not confirm within
`wait` seconds fails the call with a retryable UnavailableError naming it; the change stays
stored, and a retry waits again. Servers that lead none of those buckets are never waited for.
"""

from __future__ import annotations

import time

from locks.fencing import LockView, view_from_records
from locks.view_delivery import PUSH_TIMEOUT, ViewDelivery
from tally.errors import NotFoundError, TallyError, UnavailableError

DELIVERY_WAIT = 10.0  # seconds a fencing lock call waits for the table's bucket leaders
RECHECK = 1.0  # seconds between looks at whether the unconfirmed servers still lead


class LockViewPublisher:
    """The coordinator's side of lock views: made by CoordinatorLocks."""

    def __init__(self, coordinator, locks, wait: float = DELIVERY_WAIT,
                 push_timeout: float = PUSH_TIMEOUT) -> None:
        self.coordinator = coordinator
        self.locks = locks
        self.wait = wait
        self.delivery = ViewDelivery(self._send, push_timeout)

    def view(self, table_id: int) -> LockView:
        version, records, tokens = self.locks.view_state(table_id)
        return view_from_records(table_id, records, tokens, version)

    def leaders(self, table_id: int) -> dict[str, list[tuple[str | None, int]]]:
        """{server id: the (partition, bucket)s of the table it leads} by the catalog now. A
        bucket with no leader (offline: no in-sync copy live) counts for each of its in-sync
        copies: one of them leads it when it is back, maybe under the epoch it had."""
        try:
            partitions = self.coordinator.catalog.partitions(table_id)
        except NotFoundError:  # dropped meanwhile: nobody writes to it any more
            return {}
        out: dict[str, list[tuple[str | None, int]]] = {}
        for p in partitions:
            for bucket, replicas in enumerate(p.buckets):
                leading = [replicas.leader] if replicas.leader is not None else \
                    list(replicas.isr or replicas.replicas)
                for server_id in leading:
                    out.setdefault(server_id, []).append((p.name, bucket))
        return out

    def changed(self, table_id: int, fencing) -> None:
        """Publish the table's view; for a fencing change, wait for the leaders of the buckets
        it fences: every bucket of the table (`fencing` True), or those numbered in `fencing`
        (a set: attempts registered for those buckets, in every partition). False: wait for
        nobody."""
        view = self.view(table_id)
        # every live server, and every server sent views before (one away now gets this one
        # when it is back); a renewal needs no catalog read
        targets = set(self.coordinator.liveness.live()) | self.delivery.servers()
        if fencing is False:
            self.delivery.publish(view, targets)
            return
        leaders = self._fenced(self.leaders(table_id), fencing)
        self.delivery.publish(view, targets | set(leaders))
        deadline = time.monotonic() + self.wait
        while leaders:
            left = deadline - time.monotonic()
            missing = self.delivery.wait(view, leaders, max(0.0, min(left, RECHECK)))
            if not missing:
                return
            if left <= RECHECK:
                raise UnavailableError(
                    f"the lock change on table {self._name(table_id)} is stored, but "
                    + "; ".join(f"tablet server {sid} (leader of bucket(s) "
                                f"{_buckets(leaders[sid])}, or next to lead them while they are "
                                f"offline) has not confirmed lock view version "
                                f"{view.version}: {why}" for sid, why in sorted(missing.items()))
                    + ". Retry the call: it succeeds once that server answers or its buckets "
                    "get another leader")
            # A bucket may have moved off a server that does not answer: its new leader
            # fetches the view before its first write there, and the old one stopped leading
            # when its leader lease ran out, which an election waits for.
            leaders = self._fenced(self.leaders(table_id), fencing)
            self.delivery.publish(view, leaders)

    @staticmethod
    def _fenced(leaders: dict, fencing) -> dict:
        """The leaders of the buckets a change fences: all (`fencing` True) or those numbered
        in `fencing`."""
        if fencing is True:
            return leaders
        return {sid: kept for sid, led in leaders.items()
                if (kept := [(p, b) for p, b in led if b in fencing])}

    def _send(self, server_id: str, view: LockView, timeout: float):
        address = self.coordinator.liveness.live().get(server_id) \
            or self.coordinator.catalog.known_servers().get(server_id)
        if address is None:
            raise UnavailableError(f"tablet server {server_id} has no known address")
        return self.coordinator.channels.get(address).action(
            "install_lock_view", {"view": view.to_json()}, timeout=timeout)

    def _name(self, table_id: int) -> str:
        try:
            return self.coordinator.catalog.table_by_id(table_id).name
        except TallyError:
            return f"id {table_id}"

    def close(self) -> None:
        self.delivery.close()


def _buckets(led: list[tuple[str | None, int]], shown: int = 8) -> str:
    names = [str(b) if p is None else f"{p}/{b}" for p, b in led]
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown
                                       else "")
