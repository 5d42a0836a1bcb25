"""A server's background duty run every interval: heartbeats, retention, row expiry, storage
repair.

Each run's failure is logged and the next interval tries again: a coordinator that restarts or
a disk that is full for a while is normal, and a duty that died with its first failure would
leave the server silently not doing it any more.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from tally.errors import TallyError

log = logging.getLogger(__name__)


class PeriodicDuty:
    """Runs `run()` now and then every `interval` seconds on a daemon thread until closed."""

    def __init__(self, run: Callable[[], object], interval: float, name: str) -> None:
        self._run_once = run
        self._interval = interval
        self.name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                self._run_once()
            except TallyError as e:
                log.debug("%s failed: %s", self.name, e)
            except Exception:  # never let the thread die silently
                log.exception("%s failed", self.name)
            if self._stop.wait(self._interval):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
