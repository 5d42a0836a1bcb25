"""Rollups on the coordinator: creating, dropping, listing and building the rollups of a table.

Layout in the metadata store (beside the catalog's nodes):

    /rollups/<source table_id>/<rollup>      {"spec": RollupSpec JSON, "table_id", "descriptor"}
    /tables/<rollup table_id>/rollup_of      {"source", "source_table_id"}

A rollup's table, its record under its source and its `rollup_of` node are made in the one
transaction that makes the table visible, checked against the source's name node (a source
dropped meanwhile fails it), and removed in one transaction with the table's name. A source
with rollups cannot be dropped; a rollup cannot be the source of another.

A rollup started with a backfill is "building" until its builder (the admin client, which scans
the source) marks it "ready". While one is building, `epoch_begin` on its source is refused
with RollupBuildingError (`refuse_building`), so no Spark epoch writes the source under the
backfill's scan. A backfill that died is run again from an empty rollup: `rollup_reset` drops
the rollup's table and makes it again (a new table id), keeping its record "building".
"""

from __future__ import annotations

import logging
import threading

from merge_engine.table.rollups import BACKFILL, BUILDING, READY, RollupSpec
from tally.errors import (ColumnLockConflict, InvalidInputError, NotFoundError,
                          RollupBuildingError)
from tally.meta import join_path, node_name
from tally.server.coordinator.catalog import split_table_name
from tally.wire.messages import field

log = logging.getLogger(__name__)


def records_path(source_table_id: int, *rest: str) -> str:
    return join_path("rollups", str(source_table_id), *rest)


def rollup_of_path(table_id: int) -> str:
    return join_path("tables", str(table_id), "rollup_of")


class RollupCatalog:
    """Adds the rollup actions to a Coordinator and guards the drops of their sources."""

    def __init__(self, coordinator) -> None:
        self.coordinator = coordinator
        self.catalog = coordinator.catalog
        self.store = coordinator.store
        self._lock = threading.Lock()  # creations against drops and resets of one coordinator
        actions = coordinator.actions
        self._drop_table, self._drop_database = actions["drop_table"], actions["drop_database"]
        self._table_info = actions["table_info"]
        actions.update({
            "create_rollup": self.create,
            "drop_rollup": self.drop,
            "list_rollups": lambda body: [s.to_json() for s in self.rollups_of(
                self.catalog.get_table(field(body, "source", str)).table_id)],
            "rollup_ready": self.ready,
            "rollup_reset": self.reset,
            "rollup_epochs_in_flight": lambda body: self.epochs_in_flight(
                self.catalog.get_table(field(body, "source", str))),
            "drop_table": self.drop_table,
            "drop_database": self.drop_database,
            "table_info": self.table_info,
        })

    # --- reads --------------------------------------------------------------------------

    def rollups_of(self, source_table_id: int) -> list[RollupSpec]:
        specs = []
        for child in sorted(self.store.children(records_path(source_table_id))):
            node = self.store.get(records_path(source_table_id, child))
            if node is not None:
                specs.append(RollupSpec.from_json(node.value["spec"]))
        return specs

    def source_of(self, table_id: int) -> dict | None:
        node = self.store.get(rollup_of_path(table_id))
        return None if node is None else node.value

    def spec(self, name: str) -> tuple[RollupSpec, dict, object]:
        """(spec, its record's node value and version, the rollup's source record)."""
        record = self.catalog.get_table(name)
        source = self.source_of(record.table_id)
        if source is None:
            raise InvalidInputError(f"table '{name}' is not a rollup")
        path = records_path(int(source["source_table_id"]), node_name(name))
        node = self.store.get(path)
        if node is None:
            raise NotFoundError(f"rollup '{name}' has no record under its source "
                                f"'{source['source']}'")
        return RollupSpec.from_json(node.value["spec"]), node, path

    def table_info(self, body: dict) -> dict:
        answer = self._table_info(body)
        answer["rollups"] = [s.to_json() for s in self.rollups_of(answer["table_id"])]
        source = self.source_of(answer["table_id"])
        answer["rollup_of"] = None
        if source is not None:
            node = self.store.get(records_path(int(source["source_table_id"]),
                                               node_name(answer["name"])))
            answer["rollup_of"] = None if node is None else node.value["spec"]
        return answer

    def epochs_in_flight(self, source) -> list[str]:
        """The epochs begun on the source and not committed, by owner: their writes are in the
        source and may yet be undone (a crashed owner's, until it recovers), so a backfill's
        scan must not see them."""
        locking = self.coordinator.locking
        found = []
        for record, _ in locking.locks.records(source.table_id).values():
            last = locking.commits.last_commit(source.table_id, record.owner_id)
            for epoch in sorted(locking.commits.pending_baselines(
                    source.table_id, record.owner_id, record.tenure)):
                if last is None or epoch > last.epoch:
                    found.append(f"owner '{record.owner_id}' epoch {epoch}")
        return found

    def refuse_building(self, table_id: int, table: str) -> None:
        """RollupBuildingError while a rollup of the table is being backfilled (epoch_begin)."""
        building = [s.name for s in self.rollups_of(table_id) if s.state == BUILDING]
        if building:
            raise RollupBuildingError(
                f"rollup {', '.join(building)} of {table} is being backfilled: an epoch on "
                f"{table} waits until it is ready (nothing was written; begin the epoch again)")

    # --- creation -----------------------------------------------------------------------

    def create(self, body: dict) -> dict:
        source_name = field(body, "source", str)
        spec = RollupSpec.from_json(field(body, "spec", dict))
        split_table_name(spec.name)
        if spec.source != source_name:
            raise InvalidInputError(f"rollup {spec.name} names source {spec.source}, not "
                                    f"{source_name}")
        options = field(body, "options", dict, None) or {}
        bucket_count = field(body, "bucket_count", int, None)
        with self._lock:
            source = self.catalog.get_table(source_name)
            if self.source_of(source.table_id) is not None:
                raise InvalidInputError(
                    f"{source_name} is itself a rollup: a rollup's source is a table that "
                    f"writers write (define {spec.name} on the same source instead)")
            descriptor = self.coordinator.parse_descriptor(source.descriptor)
            spec = spec.bind(descriptor)
            if spec.start == BACKFILL:
                spec.check_backfill(descriptor)
                in_flight = self.epochs_in_flight(source)
                if in_flight:
                    raise ColumnLockConflict(
                        f"rollup {spec.name} cannot start with a backfill while epochs on "
                        f"{source_name} are in flight ({'; '.join(in_flight)}): they may yet "
                        "be committed or undone. Create it once they commit (a crashed "
                        "owner's epoch, once the owner recovers), or start it from now")
            spec = spec.with_state(BUILDING if spec.start == BACKFILL else READY)
            rollup = spec.descriptor(descriptor, bucket_count or descriptor.bucket_count,
                                     options)
            table_id = self._create_table(spec, rollup, source)
        log.info("created rollup %s of %s (id %d, %s)", spec.name, source_name, table_id,
                 spec.state)
        return {"table_id": table_id, "spec": spec.to_json()}

    def _create_table(self, spec: RollupSpec, rollup, source, version: int | None = None) -> int:
        """Create the rollup's table with its record (new, or replacing the one at `version`)
        and its rollup_of node, in one transaction checked against the source's name."""
        coordinator = self.coordinator
        source_node = self.store.get(self.catalog._table_path(source.name))
        if source_node is None or int(source_node.value["table_id"]) != source.table_id:
            raise NotFoundError(f"table '{source.name}' was dropped meanwhile")
        coordinator.replicas.validate(rollup)
        owners = coordinator.assign(rollup, rollup.bucket_count, salt=0)
        path = records_path(source.table_id, node_name(spec.name))

        def together(table_id: int) -> list[tuple]:
            value = {"spec": spec.to_json(), "table_id": table_id,
                     "descriptor": rollup.to_json()}
            record = ("create", path, value) if version is None else \
                ("set", path, value, version)
            return [("check", self.catalog._table_path(source.name), source_node.version),
                    record,
                    ("create", rollup_of_path(table_id),
                     {"source": source.name, "source_table_id": source.table_id})]

        created = self.catalog.create_table(spec.name, rollup.to_json(), owners, together)
        coordinator.replicas.created(owners)
        return created.table_id

    # --- state --------------------------------------------------------------------------

    def ready(self, body: dict) -> dict:
        """Mark a building rollup ready (its backfill is complete): epochs on its source begin
        again, and write it."""
        name = field(body, "name", str)
        table_id = field(body, "table_id", int)
        with self._lock:
            spec, node, path = self.spec(name)
            if int(node.value["table_id"]) != table_id:
                raise InvalidInputError(
                    f"rollup {name} was reset since this backfill began (table id {table_id} "
                    f"is now {node.value['table_id']}); its other backfill marks it ready")
            spec = spec.with_state(READY)
            self.store.set(path, dict(node.value, spec=spec.to_json()), version=node.version)
        log.info("rollup %s of %s is ready", name, spec.source)
        return spec.to_json()

    def reset(self, body: dict) -> dict:
        """Make a rollup's table again, empty, and mark it building (a backfill run again)."""
        name = field(body, "name", str)
        with self._lock:
            source, node, path = self._record_by_name(name, field(body, "source", str))
            spec = RollupSpec.from_json(node.value["spec"]).with_state(BUILDING)
            descriptor = self.coordinator.parse_descriptor(source.descriptor)
            spec.bind(descriptor).check_backfill(descriptor)
            rollup = self.coordinator.parse_descriptor(node.value["descriptor"])
            try:
                old = self.catalog.get_table(name)
            except NotFoundError:
                old = None  # a reset that died between the drop and the creation
            if old is not None:
                self.catalog.drop_table(name)
                self.coordinator.forget_table(old)
            table_id = self._create_table(spec, rollup, source, version=node.version)
        log.info("rollup %s of %s reset for a backfill (id %d)", name, spec.source, table_id)
        return {"table_id": table_id, "spec": spec.to_json()}

    def _record_by_name(self, name: str, source_name: str):
        source = self.catalog.get_table(source_name)
        path = records_path(source.table_id, node_name(name))
        node = self.store.get(path)
        if node is None:
            raise NotFoundError(f"table '{source_name}' has no rollup '{name}'")
        return source, node, path

    # --- drops --------------------------------------------------------------------------

    def drop(self, body: dict) -> None:
        name = field(body, "name", str)
        with self._lock:
            try:
                record = self.catalog.get_table(name)
            except NotFoundError:
                if body.get("ignore_if_not_exists"):
                    return
                raise
            source = self.source_of(record.table_id)
            if source is None:
                raise InvalidInputError(f"table '{name}' is not a rollup; drop it with "
                                        "drop_table")
            path = records_path(int(source["source_table_id"]), node_name(name))
            together = (("delete", path, None),) if self.store.get(path) is not None else ()
            self.catalog.drop_table(name, together)
        self.coordinator.forget_table(record, bool(body.get("purge_lake")))
        log.info("dropped rollup %s of %s", name, source["source"])

    def _refuse_source_drop(self, record, dropping: set[str]) -> None:
        remaining = [s.name for s in self.rollups_of(record.table_id) if s.name not in dropping]
        if remaining:
            raise InvalidInputError(
                f"table '{record.name}' has the rollup(s) {', '.join(remaining)}: drop them "
                "first (drop_rollup); nothing was dropped")

    def drop_table(self, body: dict) -> None:
        """drop_table: a rollup is dropped as by drop_rollup; a source with rollups refused."""
        name = field(body, "name", str)
        try:
            record = self.catalog.get_table(name)
        except NotFoundError:
            return self._drop_table(body)
        if self.source_of(record.table_id) is not None:
            return self.drop(body)
        with self._lock:
            self._refuse_source_drop(record, set())
            return self._drop_table(body)

    def drop_database(self, body: dict) -> None:
        """drop_database with cascade: the rollups in it first; refused while a table in it is
        the source of a rollup elsewhere."""
        db = field(body, "name", str)
        if not body.get("cascade") or not self.catalog.database_exists(db):
            return self._drop_database(body)
        records = [self.catalog.get_table(f"{db}.{t}") for t in self.catalog.list_tables(db)]
        names = {r.name for r in records}
        with self._lock:
            for record in records:
                self._refuse_source_drop(record, names)
        for record in records:
            if self.source_of(record.table_id) is not None:
                self.drop({"name": record.name, "ignore_if_not_exists": True,
                           "purge_lake": body.get("purge_lake")})
        return self._drop_database(body)
