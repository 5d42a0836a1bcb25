"""LeaseKeeper: renews one lease in the background, about every ttl/3.

A daemon thread, so an owner that forgets to release does not keep its process alive. When a
renewal finds the lease lost (expired or superseded) the keeper remembers why, and the owner's
next write or flush raises LeaseLostError with that reason: a job learns it was fenced instead
of writing on. An unreachable coordinator is not a loss: the next period tries again.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from locks.lease import Lease
from tally.errors import LeaseLostError, TallyError

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Renews one lease in the background; `check()` raises once the lease is lost."""

    def __init__(self, renew: Callable[[Lease], Lease], lease: Lease) -> None:
        self._renew = renew
        self.lease = lease
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"tally-lease-{lease.owner_id}")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(max(self.lease.ttl / 3.0, 0.05)):
            try:
                self.lease = self._renew(self.lease)
            except LeaseLostError as e:
                self.lost = str(e)
                return
            except TallyError:
                continue  # the coordinator is unreachable for now: try again next period
            except Exception:  # never die silently: a dead keeper lets the lease lapse
                log.exception("renewing the lease of owner '%s' failed", self.lease.owner_id)

    def check(self) -> None:
        if self.lost is not None:
            raise LeaseLostError(self.lost)

    def stop(self) -> None:
        self._stop.set()
