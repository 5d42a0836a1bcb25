"""The tiering process: holds tables the coordinator hands it and runs their rounds.

A heartbeat thread keeps the process's tables (and learns of new ones, of tables taken away,
and of new tiering epochs) every `heartbeat` seconds, so that a long round does not lose them.
The main loop runs each held table's round when it is due: every half of the table's
`table.datalake.freshness`, so a committed change waits at most about that long (plus a round)
before it is in the lake. A round that fails is reported and tried again later; a fenced one
(another process holds the table now) drops the table until a heartbeat hands it back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid

from tally.errors import TallyError, TieringFencedError
from tally.lake.delta_table import deltalake
from tally.lake.tier_round import Assignment, crash_point, run_round

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 2.0   # seconds between heartbeats (the coordinator's timeout is longer)
MIN_ROUND_INTERVAL = 0.2   # seconds: the shortest wait between two rounds of one table
RETRY_AFTER_ERROR = 5.0    # seconds: the longest wait before a failed round is tried again


class Holding:
    """A table held by this process: its assignment and when its next round is due."""

    def __init__(self, assignment: Assignment) -> None:
        self.assignment = assignment
        self.due = 0.0
        self.failures = 0
        self.reported: int | None = None  # the lake version the coordinator knows of

    @property
    def interval(self) -> float:
        return max(MIN_ROUND_INTERVAL, self.assignment.freshness_ms / 2000.0)


class TierService:
    """One tiering process over a client connection (which needs an admin credential).
    MissingDependencyError at once where deltalake cannot be imported: such a process would
    take tables and fail every round."""

    def __init__(self, conn, tier_id: str | None = None,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL) -> None:
        # told to the coordinator with each heartbeat: it turns a lake on only when a live
        # process can write it
        self.deltalake = str(getattr(deltalake(), "__version__", "unknown"))
        self.conn = conn
        self.tier_id = tier_id or f"tier-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.heartbeat_interval = heartbeat_interval
        self.holdings: dict[int, Holding] = {}
        self.rounds = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()

    # --- heartbeats --------------------------------------------------------------------------

    def heartbeat(self) -> None:
        """Ask the coordinator which tables this process holds now."""
        answer = self.conn.coordinator_action("tier_heartbeat", {"tier_id": self.tier_id,
                                                                 "deltalake": self.deltalake})
        given = {a.table_id: a for a in map(Assignment.from_json, answer["tables"])}
        with self._lock:
            for table_id in list(self.holdings):
                if table_id not in given:
                    log.info("tiering of %s moved away", self.holdings[table_id].assignment.name)
                    del self.holdings[table_id]
            for table_id, assignment in given.items():
                held = self.holdings.get(table_id)
                if held is None or held.assignment != assignment:
                    log.info("tiering %s under tiering epoch %d into %s", assignment.name,
                             assignment.tiering_epoch, assignment.path)
                    self.holdings[table_id] = Holding(assignment)
                    self._wake.set()

    def _heartbeats(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                self.heartbeat()
            except TallyError as e:
                log.warning("tiering heartbeat failed (retried): %s", e)

    # --- rounds ------------------------------------------------------------------------------

    def run_due(self, now: float | None = None) -> float:
        """Run every due round once; seconds until the next one is due."""
        now = time.monotonic() if now is None else now
        with self._lock:
            due = [h for h in self.holdings.values() if h.due <= now]
        for holding in due:
            self.run_one(holding)
        with self._lock:
            nearest = min((h.due for h in self.holdings.values()), default=now + 1.0)
        return max(0.0, nearest - time.monotonic())

    def run_one(self, holding: Holding) -> None:
        assignment = holding.assignment
        try:
            result = run_round(self.conn, assignment, self.tier_id)
        except TieringFencedError as e:
            log.warning("tiering of %s fenced: %s", assignment.name, e)
            with self._lock:
                if self.holdings.get(assignment.table_id) is holding:
                    del self.holdings[assignment.table_id]
            return
        except Exception as e:  # a lake or network fault: the round is tried again later
            holding.failures += 1
            holding.due = time.monotonic() + min(RETRY_AFTER_ERROR,
                                                 holding.interval * holding.failures)
            if isinstance(e, TallyError):
                log.error("tiering round of %s failed (retried): %s", assignment.name, e)
            else:
                log.exception("tiering round of %s failed (retried)", assignment.name)
            self._report(assignment, error=f"{type(e).__name__}: {e}")
            holding.reported = None  # the error replaced nothing, but report again
            return
        holding.failures = 0
        holding.due = time.monotonic() + holding.interval
        self.rounds += 1
        if result.version is not None and result.version != holding.reported:
            if self._report(assignment, result=result):
                holding.reported = result.version
            crash_point("round.reported")

    def _report(self, assignment: Assignment, result=None, error: str | None = None) -> bool:
        """Tell the coordinator of a round; whether it took the report."""
        body = {"tier_id": self.tier_id, "table_id": assignment.table_id,
                "tiering_epoch": assignment.tiering_epoch}
        if error is not None:
            body["error"] = error
        if result is not None:
            from locks.lease import offsets_to_json

            body.update(version=result.version, offsets=offsets_to_json(result.offsets),
                        path=assignment.path, round=result.to_json())
        try:
            self.conn.coordinator_action("tier_report", body)
            return True
        except TieringFencedError as e:
            log.warning("tiering of %s fenced: %s", assignment.name, e)
            with self._lock:
                self.holdings.pop(assignment.table_id, None)
        except TallyError as e:  # the lake holds the truth; the next report catches up
            log.warning("reporting the tiering of %s failed: %s", assignment.name, e)
        return False

    # --- the process ---------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Tier until `stop` is set (or `close()`)."""
        stop = stop or self._stop
        self.heartbeat()
        beats = threading.Thread(target=self._heartbeats, name="tier heartbeats", daemon=True)
        beats.start()
        try:
            while not stop.is_set() and not self._stop.is_set():
                wait = self.run_due()
                self._wake.wait(min(wait, self.heartbeat_interval))
                self._wake.clear()
        finally:
            self._stop.set()
            beats.join(timeout=5)

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
