"""The rollups a writer's run feeds, epoch by epoch, as members of the source's epochs.

Each rollup is written by a run of its own (sink.protocol.WriterRun: its own lock, under an
owner id derived from the source's, recovered when first opened) through the source run's
connection. An epoch begins in every member after the source, delivers the rollup's rows
(the source rows projected, sink.rollup_feeds) through the same per-bucket step, and commits
with the source in one metadata transaction, or is undone in all of them: so the source and
its rollups are always at the same committed epoch. The rollups are read from the catalog at
every epoch, once the source's epoch is begun: a rollup added is fed from the next epoch, one
dropped is let go (its lock released).
"""

from __future__ import annotations

import dataclasses
import logging

from sink import remote
from sink.rollup_feeds import RollupFeed, rollup_feeds, rollup_owner_id
from sink.task import EpochContext
from tally.errors import InvalidOptionError, TallyError

log = logging.getLogger("tally.sink")


@dataclasses.dataclass
class Member:
    """One rollup in one epoch: its feed, its run, the epoch's start there, the delivery."""

    feed: RollupFeed
    run: object            # sink.protocol.WriterRun of the rollup table
    context: EpochContext
    delivery: object       # Delivery of the rollup's rows

    def deliver(self, label: str):
        """Write the rollup's rows of the epoch; its EpochResult (offsets to commit)."""
        reports = self.delivery(self.run.conn, self.feed.plan, self.context,
                                f"{label} (rollup {self.feed.table})")
        return self.run._summarize(self.context.epoch, reports, self.context.baseline)


class RollupMembers:
    """The rollup runs of one source run, kept across its epochs."""

    def __init__(self, source):
        self.source = source
        self.runs: dict[str, object] = {}
        self.table_ids: dict[str, int] = {}

    def check(self) -> list[RollupFeed]:
        """Refuse, before any epoch, a write that cannot feed the source's rollups (a mode
        they cannot fold, a rollup key's source column it lacks): the run's first check.
        The feeds, for `open`."""
        return rollup_feeds(self.source.conn, self.source.plan)

    def open(self, feeds: list[RollupFeed]) -> None:
        """Once the source's tenure is recovered: take every rollup's lock and recover its
        tenure too, so a restarted owner leaves nothing of a crashed epoch in any rollup,
        even when its replay is skipped (the epoch was committed)."""
        self._sync(feeds)

    def begin(self, epoch: int, deliver) -> list[Member]:
        """Read the source's rollups, open a run for each new one, and begin the epoch in each
        (after the source's own begin): the epoch's members."""
        feeds = rollup_feeds(self.source.conn, self.source.plan)
        self._sync(feeds)
        members = []
        for feed in feeds:
            make = getattr(deliver, "rollup", None)
            delivery = None if make is None else make(feed, self.source.plan)
            if delivery is None:
                raise InvalidOptionError(
                    f"Table {self.source.plan.table} has the rollup {feed.table}, which this "
                    "write cannot feed: it was planned before the rollup was added. Nothing "
                    "was written; run the write again (a format('tally') stream plans its "
                    "rollups when it starts: restart it)")
            run = self.runs[feed.table]
            start = remote.begin_epoch(run.conn, run.lease, epoch,
                                       range(feed.plan.bucket_count))
            run.dirty = True
            members.append(Member(feed, run, run._context(epoch, start), delivery))
        return members

    def _sync(self, feeds: list[RollupFeed]) -> None:
        current = {feed.table: feed for feed in feeds}
        for table in list(self.runs):
            feed = current.get(table)
            if feed is None or feed.plan.table_id != self.table_ids[table]:
                self._let_go(table)
        for table, feed in current.items():
            if table in self.runs:
                continue
            owner = rollup_owner_id(self.source.owner_id, table)
            # a run of the source's own class (WriterRun), sharing its connection
            run = type(self.source)(self.source.conn, self.source.options, feed.plan, owner,
                            shares_connection=True).open()
            self.runs[table] = run
            self.table_ids[table] = feed.plan.table_id
            log.info("tally sink %s: feeds rollup %s as %s", self.source.owner_id, table, owner)

    def _let_go(self, table: str) -> None:
        run = self.runs.pop(table)
        self.table_ids.pop(table, None)
        try:
            run.release()
        except TallyError as e:  # a dropped rollup's lock went with its table
            log.info("tally sink: releasing the lock of rollup %s: %s", table, e)

    def release(self) -> None:
        """The source run's clean end: every rollup's lock released."""
        for table in list(self.runs):
            self._let_go(table)
