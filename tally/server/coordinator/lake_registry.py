"""The coordinator's side of tiering: which tiering process copies which table into the lake,
under which tiering epoch, and how far each lake table is.

Tiering processes (`tally tier`) heartbeat with `tier_heartbeat`; each answer lists the tables
that process holds now. Tables with the lake enabled are divided among the live processes (a
fair share each; a process over its share gives the excess back, a table whose holder stopped
heartbeating goes to another). Every change of holder bumps the table's tiering epoch: the new
holder first writes a claim commit into the lake table under that epoch, so a fenced holder's
lake commit conflicts or finds a newer epoch in the lake, and its report here is refused
(TieringFencedError). Which processes are live is kept in memory only: after a coordinator
restart the holders keep their tables by heartbeating again.

After each lake commit the holder reports its version and per-bucket offsets (`tier_report`):
`lake_snapshot`, `tally lake` and retention read them. Turning a table's lake on is refused
when nothing could tier it (lake_readiness); `lake_setup` shows what tiering needs. Retention keeps every bucket's changelog
from the lake's offset on while the lake is enabled (from 0 before the first round), unless the
table sets `table.log.retention.ignore-lake`. `lake_status` adds each table's lag and retention
alert (lake_health), and the coordinator's metrics count the reports and read the same status
(lake_metrics). Layout in the metadata store, deleted with the table (the lake table itself
stays, unless dropped with purge_lake):

    /lake/<table id>   {"tier_id", "tiering_epoch", "path", "version", "offsets",
                        "committed_at", "round", "error", "reported_at"}
"""

from __future__ import annotations

import logging
import math
import threading

from locks.coordinator_actions import offsets_field
from locks.lease import offsets_from_json, offsets_to_json
from tally.errors import InvalidInputError, NotFoundError, TallyError, TieringFencedError
from tally.meta import join_path
from tally.server.coordinator.lake_health import LakeWatch
from tally.server.coordinator.lake_metrics import LakeMetrics
from tally.server.coordinator.lake_readiness import (UNKNOWN, TierProcesses, check_can_tier,
                                                     deltalake_version, unready)
from tally.server.settings import TIER_TIMEOUT
from tally.wire.messages import field

log = logging.getLogger(__name__)


LAKE_CONSUMER = "(lake)"  # how the lake's tiering position shows among a table's consumers


def lake_path(table_id: int | None = None) -> str:
    return join_path("lake") if table_id is None else join_path("lake", str(table_id))


def lake_table_uri(root: str, name: str) -> str:
    """Where a table's lake table lives: <root>/<database>/<table>."""
    database, table = name.split(".")
    return f"{root.rstrip('/')}/{database}/{table}"


class LakeRegistry:
    """Adds the tiering actions to a Coordinator."""

    def __init__(self, coordinator, datalake_dir: str | None = None,
                 tier_timeout: float = TIER_TIMEOUT) -> None:
        self.coordinator = coordinator
        self.store = coordinator.store
        self.root = datalake_dir
        self.tier_timeout = tier_timeout
        self.processes = TierProcesses(coordinator.clock, tier_timeout)
        # a coordinator that has just started has heard no heartbeats yet: the holders keep
        # their tables for one timeout, time to heartbeat again
        self._started = coordinator.clock()
        self._lock = threading.Lock()
        self.watch = LakeWatch(coordinator.clock)  # lag and the retention alert
        self.metrics = LakeMetrics(coordinator.metrics, self)
        coordinator.actions.update({
            "tier_heartbeat": self.heartbeat,
            "tier_report": self.report,
            "lake_status": self.status,
            "lake_stable_offsets": self.stable_offsets,
            "lake_setup": self.setup,
        })

    # --- which tables are tiered, and by whom ---------------------------------------------

    def lake_tables(self) -> list:
        """(record, settings) of every table whose lake is enabled."""
        catalog, out = self.coordinator.catalog, []
        for database in catalog.list_databases():
            try:
                names = catalog.list_tables(database)
            except NotFoundError:
                continue  # dropped meanwhile
            for name in names:
                try:
                    record = catalog.get_table(f"{database}.{name}")
                    settings = self.coordinator.parse_descriptor(record.descriptor).lake
                except NotFoundError:
                    continue  # dropped meanwhile
                if settings.enabled:
                    out.append((record, settings))
        return out

    def _record(self, table_id: int) -> dict:
        node = self.store.get(lake_path(table_id))
        return dict(node.value) if node is not None else {}

    def _update(self, table_id: int, change) -> dict:
        self.store.ensure(lake_path())
        return self.store.update(lake_path(table_id), change, create={}).value

    @staticmethod
    def _tier_id(body: dict) -> str:
        tier_id = field(body, "tier_id", str)
        if not tier_id.strip() or len(tier_id) > 200:
            raise InvalidInputError(f"a tiering process id is 1 to 200 characters, not "
                                    f"{tier_id[:40]!r}")
        return tier_id

    def heartbeat(self, body: dict) -> dict:
        """A tiering process is alive: the tables it holds now, each with its tiering epoch,
        lake table and freshness (taking free tables up to its fair share, giving back any
        over it)."""
        tier_id = self._tier_id(body)
        if self.root is None:
            raise InvalidInputError("the coordinator has no lake: start it with --datalake-dir")
        self.processes.heard(tier_id, body.get("deltalake", UNKNOWN))
        with self._lock:
            now = self.coordinator.clock()
            live = self.processes.live(now) | {tier_id}
            tables = self.lake_tables()
            share = math.ceil(len(tables) / len(live)) if tables else 0
            records = {r.table_id: self._record(r.table_id) for r, _ in tables}
            mine = [(r, s) for r, s in tables if records[r.table_id].get("tier_id") == tier_id]
            for record, _ in mine[share:]:
                self._assign(record.table_id, tier_id, None)
            mine = mine[:share]
            for record, settings in tables:
                if len(mine) >= share:
                    break
                holder = records[record.table_id].get("tier_id")
                settled = now - self._started > self.tier_timeout
                if holder is None or (holder not in live and settled):
                    records[record.table_id] = self._assign(record.table_id, holder, tier_id)
                    mine.append((record, settings))
        return {"root": self.root, "timeout": self.tier_timeout, "tables": [
            {"table_id": r.table_id, "name": r.name,
             "tiering_epoch": records[r.table_id]["tiering_epoch"],
             "path": lake_table_uri(self.root, r.name), "freshness_ms": s.freshness_ms}
            for r, s in mine]}

    def _assign(self, table_id: int, holder: str | None, to: str | None) -> dict:
        def change(value: dict) -> dict:
            if value.get("tier_id") != holder:
                raise InvalidInputError(f"table id {table_id} changed holder meanwhile")
            value["tier_id"] = to
            if to is not None:
                value["tiering_epoch"] = int(value.get("tiering_epoch", 0)) + 1
            return value

        value = self._update(table_id, change)
        log.info("tiering of table id %d: %s -> %s (tiering epoch %s)", table_id, holder, to,
                 value.get("tiering_epoch"))
        return value

    # --- reports -------------------------------------------------------------------------

    def report(self, body: dict) -> dict:
        """A holder's lake commit (version, offsets) and/or the outcome of its last round;
        refused from a process that no longer holds the table under that epoch."""
        tier_id = self._tier_id(body)
        table_id, epoch = field(body, "table_id", int), field(body, "tiering_epoch", int)
        version = field(body, "version", int, None)
        offsets = offsets_field(body, "offsets") if version is not None else None
        round_info = field(body, "round", dict, None)
        error = field(body, "error", str, None)
        record = self.coordinator.catalog.table_by_id(table_id)  # NotFoundError once dropped
        now = self.coordinator.clock()
        advanced = []  # whether the report moved the lake's version on (for the counters)

        def change(value: dict) -> dict:
            if value.get("tier_id") != tier_id or value.get("tiering_epoch") != epoch:
                raise TieringFencedError(
                    f"tiering process {tier_id} does not hold table id {table_id} under tiering "
                    f"epoch {epoch} (holder {value.get('tier_id')}, epoch "
                    f"{value.get('tiering_epoch')}): its report was refused")
            advanced[:] = [version is not None and version > int(value.get("version", -1))]
            if version is not None and version >= int(value.get("version", -1)):
                value.update(version=version, offsets=offsets_to_json(offsets),
                             path=field(body, "path", str), committed_at=now)
            if round_info is not None:
                value["round"] = round_info
            value["error"] = error
            value["reported_at"] = now
            return value

        with self._lock:
            self.processes.heard(tier_id)
            value = self._update(table_id, change)
        self.metrics.reported(record.name, round_info, error, bool(advanced and advanced[0]))
        return value

    # --- set-up ----------------------------------------------------------------------------

    def check_enable(self, name: str) -> None:
        """Before the lake of table `name` is turned on: LakeSetupError when nothing could tier
        it (no lake directory, no tiering process able to import deltalake)."""
        check_can_tier(self.root, self.processes, name)

    def setup(self, body: dict) -> dict:
        """What tiering needs, as it is now (`tally lake`): the lake directory, the
        coordinator's own deltalake, and the tiering processes heard from with their tables."""
        held: dict[str, int] = {}
        for record, _ in self.lake_tables():
            holder = self._record(record.table_id).get("tier_id")
            if holder is not None:
                held[holder] = held.get(holder, 0) + 1
        return {"root": self.root, "tier_timeout": self.tier_timeout,
                "deltalake": deltalake_version(),
                "tier_processes": [{**p, "tables": held.get(p["tier_id"], 0)}
                                   for p in self.processes.listing()],
                "unready": unready(self.root, self.processes)}

    # --- reads -----------------------------------------------------------------------------

    def lake_offsets(self, table_id: int) -> dict | None:
        """The lake's per-bucket offsets, or None before its first commit."""
        record = self._record(table_id)
        return offsets_from_json(record["offsets"]) if "offsets" in record else None

    def status(self, body: dict) -> list[dict]:
        """Per lake-enabled table (or the one named): holder, epoch, lake version and offsets,
        last round, the live end offsets to tell the lag by, the lag in seconds and the
        retention alert (tally.server.coordinator.lake_health)."""
        name = field(body, "name", str, None)
        out = []
        for record, settings in self.lake_tables():
            if name is not None and record.name != name:
                continue
            try:
                out.append(self._status(record, settings))
            except NotFoundError:
                if name is not None:
                    raise
                continue  # dropped meanwhile
        if name is not None and not out:
            self.coordinator.catalog.get_table(name)  # NotFoundError for an unknown table
            raise InvalidInputError(f"table '{name}' does not tier to a lake: set "
                                    "'table.datalake.enabled' = 'true'")
        return out

    def _status(self, record, settings) -> dict:
        value = self._record(record.table_id)
        ends = self.coordinator.log_offsets(record)
        health = self._assess(record, settings, value, ends)
        live = self.processes.is_live(value.get("tier_id"))
        return {**value, "name": record.name, "table_id": record.table_id,
                "freshness_ms": settings.freshness_ms,
                "retention_ignores_lake": settings.retention_ignores_lake,
                "path": value.get("path") or (lake_table_uri(self.root, record.name)
                                              if self.root else None),
                "log_offsets": [[p, b, s, e] for (p, b), (s, e) in ends.items()],
                "lag_seconds": round(health.lag_seconds, 3),
                "retention_alert": health.retention_alert, "holder_live": live}

    def _assess(self, record, settings, value: dict, ends: dict):
        properties = self.coordinator.parse_descriptor(record.descriptor).properties
        lake = offsets_from_json(value["offsets"]) if "offsets" in value else None
        return self.watch.assess(record, properties, settings.retention_ignores_lake, value,
                                 lake, ends)

    def healths(self) -> list[tuple]:
        """(name, lag in seconds, LakeHealth or None when its offsets could not be read) of
        every lake-enabled table, for the metrics; tables dropped meanwhile left out."""
        out = []
        for record, settings in self.lake_tables():
            value = self._record(record.table_id)
            try:
                ends = self.coordinator.log_offsets(record)
            except NotFoundError:
                continue  # dropped meanwhile
            except TallyError as e:  # a bucket without a live leader: its lag is unknown
                log.info("lake lag of %s not read for metrics: %s", record.name, e)
                out.append((record.name, self.watch.lag_seconds(record, value), None))
                continue
            health = self._assess(record, settings, value, ends)
            out.append((record.name, health.lag_seconds, health))
        return out

    def stable_offsets(self, body: dict) -> dict:
        """Per bucket, the offset below which nothing can be undone any more: the least of
        the end offset and what an unreleased lock tenure may still undo back to. The end
        offsets are read first: a tenure that begins afterwards starts at or past them."""
        record = self.coordinator.named_table(body)
        ends = self.coordinator.log_offsets(record)
        floor = self.coordinator.locking.retention_floor({"table_id": record.table_id})
        holding = floor["holding_locks"]
        undo_floor = offsets_from_json(floor["offsets"])
        stable = {}
        for key, (_start, end) in ends.items():
            bound = undo_floor.get(key, 0 if holding else end)
            stable[key] = min(end, bound)
        return {"log_offsets": [[p, b, s, e] for (p, b), (s, e) in ends.items()],
                "stable": offsets_to_json(stable), "holding_locks": holding}

    # --- retention and drops ----------------------------------------------------------------

    def retention_hold(self, record) -> tuple[bool, dict]:
        """Whether the lake holds the table's retention, and from which offsets (a bucket
        missing from them is held from 0)."""
        settings = self.coordinator.parse_descriptor(record.descriptor).lake
        if not settings.enabled or settings.retention_ignores_lake:
            return False, {}
        return True, self.lake_offsets(record.table_id) or {}

    def consumer_doc(self, record) -> dict | None:
        """The lake's tiering position as a changelog consumer (what `tally offsets` lists),
        or None while the table does not tier."""
        settings = self.coordinator.parse_descriptor(record.descriptor).lake
        if not settings.enabled:
            return None
        value = self._record(record.table_id)
        return {"consumer": LAKE_CONSUMER, "positions": value.get("offsets", []),
                "updated_at": value.get("committed_at") or record.created_at,
                "holds_until": None, "holding": not settings.retention_ignores_lake}

    def drop_table(self, record, purge: bool = False) -> None:
        """Forget a dropped table's tiering; its lake table stays unless `purge`."""
        self.store.delete(lake_path(record.table_id), recursive=True)
        self.watch.forget(record.table_id)
        self.metrics.dropped(record.name)
        if purge and self.root is not None:
            from tally.server.remote.files import RemoteFiles

            database, table = record.name.split(".")
            RemoteFiles(self.root).delete_tree(f"{database}/{table}")
            log.info("purged the lake table of %s", record.name)
