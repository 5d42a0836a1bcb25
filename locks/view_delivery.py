"""Lock views on their way from the coordinator to the tablet servers.

Each tablet server has its own queue and its own worker thread, so a server that is paused,
slow or cut off delays nothing but its own deliveries. A queue holds at most one view per
table, the newest (a newer view replaces one not sent yet: only the newest matters, since a
server keeps the newest it has seen whatever the order). Each push has a deadline; a push that
fails is tried again, with growing pauses, until the server confirms that view or a newer one,
so a server that missed pushes while it was away gets the newest view when it is back.

The lock calls themselves decide whom to wait for (see coordinator_actions): `wait` blocks
until the given servers have confirmed a version, or a deadline passes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from locks.fencing import LockView
from tally.errors import TallyError

log = logging.getLogger(__name__)

PUSH_TIMEOUT = 5.0      # seconds one push to one server may take before it counts as failed
RETRY_PAUSES = (0.2, 5.0)  # the first and the longest pause between pushes that failed

# send(server_id, view, timeout) -> the version the server holds after it (or None)
Send = Callable[[str, LockView, float], "int | None"]


class ServerQueue:
    """The views on their way to one tablet server, and what it has confirmed."""

    def __init__(self, server_id: str, send: Send, timeout: float = PUSH_TIMEOUT,
                 pauses: tuple[float, float] = RETRY_PAUSES) -> None:
        self.server_id = server_id
        self._send = send
        self._timeout = timeout
        self._pauses = pauses
        self._pending: dict[int, LockView] = {}
        self._confirmed: dict[int, int] = {}  # table id -> newest version the server holds
        self._retry_at = 0.0
        self._closed = False
        self.last_error: str | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"lock views to {server_id}")
        self._thread.start()

    def offer(self, view: LockView) -> None:
        """Queue `view` unless the server holds it (or newer) or a newer one is queued."""
        with self._cond:
            if self._confirmed.get(view.table_id, -1) >= view.version:
                return
            queued = self._pending.get(view.table_id)
            if queued is None or view.version > queued.version:
                self._pending[view.table_id] = view
                self._cond.notify_all()

    def confirmed(self, table_id: int) -> int:
        with self._cond:
            return self._confirmed.get(table_id, -1)

    def wait(self, table_id: int, version: int, deadline: float) -> bool:
        """Whether the server confirmed `version` (or newer) of the table's view before
        `deadline` (time.monotonic)."""
        with self._cond:
            while self._confirmed.get(table_id, -1) < version:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(left)
            return True

    def _next(self) -> LockView | None:
        with self._cond:
            while True:
                if self._closed:
                    return None
                left = self._retry_at - time.monotonic()
                if self._pending and left <= 0:
                    table_id = min(self._pending)
                    return self._pending.pop(table_id)
                self._cond.wait(left if self._pending else None)

    def _run(self) -> None:
        pause = self._pauses[0]
        while True:
            view = self._next()
            if view is None:
                return
            try:
                held = self._send(self.server_id, view, self._timeout)
            except TallyError as e:
                with self._cond:
                    queued = self._pending.get(view.table_id)
                    if queued is None or queued.version < view.version:
                        self._pending[view.table_id] = view
                    first = self.last_error is None
                    self.last_error = str(e)
                    self._retry_at = time.monotonic() + pause
                    self._cond.notify_all()
                # said once per streak of failures: a server gone for good is tried for ever
                log.log(logging.INFO if first else logging.DEBUG,
                        "lock view %d of table %d not delivered to tablet server %s (tried "
                        "again in %.1fs): %s", view.version, view.table_id, self.server_id,
                        pause, e)
                pause = min(pause * 2, self._pauses[1])
                continue
            except Exception:  # the worker must outlive anything, or the server never hears
                log.exception("lock view delivery to %s failed (tried again)", self.server_id)
                with self._cond:
                    self._pending.setdefault(view.table_id, view)
                    self._retry_at = time.monotonic() + pause
                continue
            pause = self._pauses[0]
            with self._cond:
                version = max(view.version, held if isinstance(held, int) else -1)
                if self._confirmed.get(view.table_id, -1) < version:
                    self._confirmed[view.table_id] = version
                queued = self._pending.get(view.table_id)
                if queued is not None and queued.version <= version:
                    del self._pending[view.table_id]
                self.last_error = None
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class ViewDelivery:
    """One ServerQueue per tablet server, made on first use."""

    def __init__(self, send: Send, timeout: float = PUSH_TIMEOUT,
                 pauses: tuple[float, float] = RETRY_PAUSES) -> None:
        self._send = send
        self._timeout = timeout
        self._pauses = pauses
        self._queues: dict[str, ServerQueue] = {}
        self._lock = threading.Lock()
        self._closed = False

    def queue(self, server_id: str) -> ServerQueue:
        with self._lock:
            queue = self._queues.get(server_id)
            if queue is None:
                queue = self._queues[server_id] = ServerQueue(server_id, self._send,
                                                              self._timeout, self._pauses)
                if self._closed:
                    queue.close()
            return queue

    def servers(self) -> set[str]:
        """The servers that have a queue: every server sent a view since this process began."""
        with self._lock:
            return set(self._queues)

    def publish(self, view: LockView, server_ids) -> None:
        """Send `view` to each of `server_ids` in the background; returns at once."""
        for server_id in server_ids:
            self.queue(server_id).offer(view)

    def wait(self, view: LockView, server_ids, timeout: float) -> dict[str, str]:
        """Wait up to `timeout` seconds in all for each of `server_ids` to confirm `view` (or
        newer); {server id: why not} of those that did not."""
        deadline = time.monotonic() + timeout
        missing = {}
        for server_id in sorted(server_ids):
            queue = self.queue(server_id)
            if not queue.wait(view.table_id, view.version, deadline):
                missing[server_id] = queue.last_error or f"no answer within {timeout:g}s"
        return missing

    def close(self) -> None:
        with self._lock:
            self._closed = True
            queues = list(self._queues.values())
        for queue in queues:
            queue.close()
