"""A tablet server: hosts the KvTablets of its buckets and serves writes and reads over Flight.

Every write is checked before it reaches a tablet: this server must lead the bucket (else
NotLeaderError or StaleMetadataError, and the client refreshes its metadata and retries), enough
of its copies must be in sync (min.insync.replicas), the batch must fit the size
limit, and every row must belong to the addressed partition and bucket (the stable bucket
function of tally.wire.bucket_hash). Then one `KvTablet.put` or `delete` applies it atomically, with
the writer's (id, sequence) so a retried request is applied once, and the write is acknowledged
once every in-sync follower holds it (leadership). Reads return what is below the high
watermark only. Anything wrong raises a typed error naming the problem and nothing is applied.

Extension point: `write_checks` is a list of callables `check(hosted, header, rows)` run after
the built-in checks and before the tablet is touched (column-lock fencing plugs in here).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np
import pyarrow as pa

from locks.tablet_check import TabletLocks
from merge_engine.kv.row_snapshot import scan_schema
from tally.errors import (InvalidInputError, InvalidOptionError, NotFoundError,
                          OffsetOutOfRangeError, StaleMetadataError, WriteUndoConflictError)
from tally.server.metrics import ServerMetrics
from tally.server.settings import (DEFAULT_MAX_BATCH_BYTES, DEFAULT_SCAN_BATCH_ROWS,
                                   HEARTBEAT_INTERVAL, SEGMENT_INTERVAL, SETTLE_TIMEOUT,
                                   SNAPSHOT_INTERVAL, STORAGE_PROBE_INTERVAL)
from tally.server.tablet.id_assignment import IdAssignment
from tally.server.tablet.identity import load_server_id
from tally.server.tablet.leader_lease import LeaderLease
from tally.server.tablet.lookups import KeyLookups
from tally.server.tablet.periodic import PeriodicDuty
from tally.server.tablet.prefix_requests import PrefixLookups
from tally.server.tablet.replica_digest import ReplicaDigest
from tally.server.tablet.replica_roles import ReplicaRoles
from tally.server.tablet.retention import RetentionKeeper
from tally.server.tablet.row_expiry import EXPIRY_INTERVAL, RowExpiry
from tally.server.tablet.settled_offsets import settled_end
from tally.server.tablet.snapshot_loads import SnapshotLoads
from tally.server.tablet.snapshot_uploads import SnapshotUploads
from tally.server.tablet.storage_health import StorageHealth
from tally.server.tablet.tablets import HostedTablet, TabletHost, TabletKey
from tally.wire.bucket_hash import bucket_ids
from tally.wire.messages import SCAN_OFFSET_KEY, field, int_items, read_options, read_put
from tally.wire.routing import TableRouting, partition_names

log = logging.getLogger(__name__)

WriteCheck = Callable[[HostedTablet, dict, pa.Table], None]


def undo_ranges(header: dict) -> list[tuple[int, int]]:
    """The [start, end) offset ranges an undo names: a non-empty list of integer pairs."""
    ranges = header.get("ranges")
    if not (isinstance(ranges, list) and ranges and all(
            isinstance(r, list) and len(r) == 2 and all(
                isinstance(o, int) and not isinstance(o, bool) and 0 <= o < 2**63 for o in r)
            and r[0] <= r[1] for r in ranges)):
        raise InvalidInputError(f"an undo's ranges must be a list of [start, end] offset pairs, "
                                f"not {ranges!r}")
    return [(r[0], r[1]) for r in ranges]


def write_options(header: dict) -> tuple[list[str] | None, tuple[str, int] | None]:
    """The target columns and the writer (id, sequence) of a write header, and its lease,
    checked for shape: a wrong one is refused before the tablet is touched (KvTablet would take
    a bool as a sequence, a sequence beyond 64 bits would fail deep inside the commit, and the
    lock check reads the lease as an object)."""
    lease = header.get("lease")
    if lease is not None:
        if not isinstance(lease, dict):
            raise InvalidInputError(f"a write's lease must be an object, not {lease!r}")
        field(lease, "owner_id", str)
        field(lease, "token", int)
        field(lease, "secret", str)
        if lease.get("attempt") is not None:
            field(lease, "attempt", int)
    targets = header.get("target_columns")
    if targets is not None and not (isinstance(targets, list)
                                    and all(isinstance(t, str) for t in targets)):
        raise InvalidInputError(f"target_columns must be a list of column names, not {targets!r}")
    writer = header.get("writer")
    if writer is None:
        return targets, None
    if not (isinstance(writer, list) and len(writer) == 2 and isinstance(writer[0], str)
            and isinstance(writer[1], int) and not isinstance(writer[1], bool)
            and 0 <= writer[1] < 2**63):
        raise InvalidInputError(f"writer must be [writer id, sequence (a 64-bit integer)], "
                                f"not {writer!r}")
    return targets, (writer[0], writer[1])


class TabletServer:
    """Serves the buckets assigned to `server_id`; `coordinator(action, body)` reaches the
    coordinator (over Flight, or in-process for `--role all`)."""

    def __init__(self, data_dir: str, address: str, coordinator: Callable[[str, dict], object],
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
                 heartbeat_interval: float = HEARTBEAT_INTERVAL,
                 retention_interval: float = 30.0, memory_budget: int | None = None,
                 clock: Callable[[], float] = time.time,
                 storage_probe_interval: float = STORAGE_PROBE_INTERVAL,
                 metrics: ServerMetrics | None = None,
                 expiry_interval: float = EXPIRY_INTERVAL, peers=None,
                 remote=None, snapshot_interval: float = SNAPSHOT_INTERVAL,
                 segment_interval: float = SEGMENT_INTERVAL) -> None:
        """`memory_budget`: bytes of write memory all hosted buckets share (None: no cap
        beyond each bucket's own; `tally serve` passes --memory-budget). `clock`: the time
        lock expiry and the row TTL are judged by (tests move it; see server.clock). Every
        `storage_probe_interval` seconds, buckets whose disk refused a write are reopened
        once it has room (storage_health). `metrics`: the process's (a registry of its own
        when None). `peers`: a ChannelPool (with the cluster credential) to reach the other
        tablet servers, which followers fetch from (None: a plaintext pool without one).
        `remote`: a RemoteSnapshots (`--remote-dir`): led buckets upload snapshots every
        `snapshot_interval` and changelog segments every `segment_interval` seconds, and
        copies are rebuilt from them (None: no remote directory)."""
        self.clock = clock
        self.metrics = metrics if metrics is not None else ServerMetrics()
        self.server_id = load_server_id(data_dir)
        self.address = address
        self.max_batch_bytes = max_batch_bytes
        self.host = TabletHost(data_dir, memory_budget, self.metrics, clock)
        self.metrics.watch_memory(self.host)
        self._coordinator = coordinator
        self.write_checks: list[WriteCheck] = []
        # leads replicated buckets only while the coordinator's last answer holds (see there)
        self.leader_lease = LeaderLease(self.server_id)
        self.actions = {"offsets": self.offsets, "drop_tablets": self.drop_tablets,
                        "reopen_tablets": self.reopen_tablets,
                        "resign_leadership": self.resign_leadership,
                        "server_id": lambda body: self.server_id}
        self.binary_actions: dict = {}
        self.raw_actions: dict = {}  # name -> handler(request bytes) -> bytes: reads its own
        KeyLookups(self)  # adds lookup and lookup_many
        self.prefix_lookups = PrefixLookups(self)  # serves the read prefix_lookup
        IdAssignment(self)  # adds assign_ids, refuses plain writes to dictionary tables
        self._heartbeat = PeriodicDuty(self.send_heartbeat, heartbeat_interval, "heartbeat")
        self.locks = TabletLocks(self)
        self.retention = RetentionKeeper(self, retention_interval)
        self.expiry = RowExpiry(self, expiry_interval)
        self.storage = StorageHealth(self.host, storage_probe_interval)
        if peers is None:
            from tally.wire.channel import ChannelPool
            peers = ChannelPool(None)
        self.peers = peers
        self.replicas = ReplicaRoles(self, peers)
        ReplicaDigest(self)  # adds replica_digest
        self.snapshot_uploads = self.snapshot_loads = None
        for action in ("upload_snapshots", "restore_bucket_copy"):
            self.actions[action] = self._no_remote_dir
        if remote is not None:
            self.snapshot_uploads = SnapshotUploads(self, remote, snapshot_interval,
                                                    segment_interval)
            self.snapshot_loads = SnapshotLoads(self, remote)

    def coordinator(self, action: str, body: dict):
        """Ask the coordinator (used by the lock and retention helpers)."""
        return self._coordinator(action, body)

    def start(self) -> None:
        self._heartbeat.start()
        self.retention.start()
        self.expiry.start()
        self.storage.start()
        self.replicas.start()
        if self.snapshot_uploads is not None:
            self.snapshot_uploads.start()

    def send_heartbeat(self) -> None:
        body = {"server_id": self.server_id, "address": self.address,
                "table_ids": self.host.table_ids(), "problems": self.problems(),
                "incarnation": self.replicas.incarnation}
        if self.snapshot_uploads is not None:  # what a restore would know was acknowledged
            body["high_watermarks"] = self.snapshot_uploads.high_watermarks()
        sent_at = self.leader_lease.now()  # the lease runs from the send, not the answer
        answer = self._coordinator("heartbeat", body)
        self.leader_lease.answered(sent_at, answer)
        for table_id in answer["dropped_table_ids"]:
            self.drop_tablets({"table_id": int(table_id)})
        self.replicas.heartbeat_answer(answer)

    def problems(self) -> list[str]:
        """What keeps buckets here from working (shown by `tally servers`)."""
        stalled = [f"{label} cannot follow its leader: {why}"
                   for label, why in self.replicas.fetchers.stalled().items()]
        return self.storage.problems() + stalled

    # --- tablets ----------------------------------------------------------------------------

    def tablet(self, table_id: int, partition_id: int, bucket: int) -> HostedTablet:
        """The hosted tablet of a bucket this server holds a copy of (opened on first use)."""
        key = TabletKey(int(table_id), int(partition_id), int(bucket))
        hosted = self.host.get(key)
        if hosted is not None:
            return hosted
        try:
            info = self._coordinator("bucket_info", {"table_id": key.table_id,
                                                     "partition_id": key.partition_id,
                                                     "bucket": key.bucket})
        except NotFoundError as e:
            raise StaleMetadataError(f"{key.describe()}: {e}") from None
        routing = TableRouting.from_json(info["routing"])
        replicas = info["replicas"]
        if self.server_id not in replicas["replicas"]:
            raise StaleMetadataError(
                f"{key.describe(routing, info['partition'])} is held by tablet servers "
                f"{replicas['replicas']}, not {self.server_id}")
        return self.host.open(key, info["descriptor"], routing, info["partition"])

    def addressed(self, header: dict) -> HostedTablet:
        """The hosted tablet a request names by `table_id`, `partition_id` and `bucket`
        (integers, never coerced: a malformed request must not reach a real bucket)."""
        return self.tablet(field(header, "table_id", int), field(header, "partition_id", int),
                           field(header, "bucket", int))

    # --- writes -----------------------------------------------------------------------------

    def read_batches(self, reader) -> pa.Table:
        """The rows of a DoPut stream, bounded by the size limit before they are decoded."""
        return read_put(reader, self.max_batch_bytes)

    def write(self, header: dict, rows: pa.Table) -> dict:
        """Apply one put, delete or undo to one bucket: the tablet's offsets before and after
        it (no start for a retried write that was applied already: its range is not known)."""
        from merge_engine import MergeMode

        op = header.get("op")
        if op not in ("put", "delete", "undo"):
            raise InvalidInputError(
                f"unknown write operation {op!r}; expected put, delete or undo")
        hosted = self.addressed(header)
        self.check_rows(hosted, rows)
        mode = MergeMode.parse(header.get("mode", "AGGREGATE"))
        targets, writer = write_options(header)
        ranges = undo_ranges(header) if op == "undo" else None
        lead = self.leadership(hosted)
        lead.check_insync()
        with hosted.lock:
            lead.check_insync()  # the role may have changed while this write waited
            # Checks run under the bucket lock so that a lock change pushed meanwhile (which
            # passes through this lock) cannot land between a write's check and its apply.
            for check in self.write_checks:
                check(hosted, header, rows)
            start = None if hosted.tablet.applied_end(writer) is not None \
                else hosted.tablet.log_end_offset
            if op == "put":
                end = hosted.tablet.put(rows, mode=mode, target_columns=targets, writer=writer)
            elif op == "delete":
                end = hosted.tablet.delete(rows, mode=mode, target_columns=targets, writer=writer)
            else:
                end = self._undo(hosted, ranges, targets, writer)
        self.replicas.appended()
        lead.wait_replicated(end)
        self.metrics.written(hosted, op, rows)
        return {"end_offset": int(end), "start_offset": start}

    @staticmethod
    def _undo(hosted: HostedTablet, ranges, targets, writer) -> int:
        end, undo = hosted.tablet.undo_writes(ranges, targets, writer)
        if undo.conflicts:
            raise WriteUndoConflictError(
                f"{hosted.label}: the writes at offsets {ranges} cannot be taken back: another "
                f"writer changed {undo.conflict_count} of their key(s) since (first "
                f"{undo.conflicts[0]}). Nothing was undone; they stay applied")
        return end

    def leadership(self, hosted: HostedTablet):
        """This server's leadership of the bucket (NotLeaderError: the client re-routes), for
        a client's read or write: a bucket with followers only within the leader lease, and
        every wait on it fails once the lease lapses."""
        lead = self.replicas.leadership(hosted.key, hosted.label)
        lead.guard = self._lease_guard
        self._lease_guard(lead)
        return lead

    def _lease_guard(self, lead) -> None:
        if not lead.single:
            self.leader_lease.check(lead.hosted.key, lead.epoch, lead.label)

    def resign_leadership(self, body: dict) -> None:
        """The coordinator moves a bucket's leadership away from this server: it stops
        serving the bucket under the epoch named before the new leader starts (for `hold_ms`
        milliseconds, past every lease granted before the move)."""
        key = TabletKey(field(body, "table_id", int), field(body, "partition_id", int),
                        field(body, "bucket", int))
        epoch, hold_ms = field(body, "leader_epoch", int), field(body, "hold_ms", int)
        self.leader_lease.resign(key, epoch, hold_ms / 1000)
        log.info("resigned the leadership of %s under epoch %d", key.describe(), epoch)

    def check_rows(self, hosted: HostedTablet, rows: pa.Table) -> None:
        """Every row must belong to the addressed partition and bucket."""
        routing = hosted.routing
        if rows.num_rows == 0:
            return
        missing = [c for c in routing.primary_key if c not in rows.schema.names]
        if missing:
            raise InvalidInputError(
                f"rows for {hosted.label} lack primary-key column(s) {missing}")
        if routing.partitioned:
            names = partition_names(rows, routing.partition_key)
            wrong = next((i for i, n in enumerate(names) if n != hosted.partition), None)
            if wrong is not None:
                raise InvalidInputError(
                    f"row {wrong} belongs to partition '{names[wrong]}', not to {hosted.label}")
        buckets = bucket_ids(rows, list(routing.bucket_key), routing.bucket_count)
        bad = np.flatnonzero(buckets != hosted.key.bucket)
        if len(bad):
            i = int(bad[0])
            key = {c: rows.column(c)[i].as_py() for c in routing.bucket_key}
            raise InvalidInputError(
                f"row {i} with key {key} belongs to bucket {int(buckets[i])}, not to "
                f"{hosted.label} ({len(bad)} misrouted rows)")

    # --- reads ------------------------------------------------------------------------------

    def read(self, header: dict, payload: pa.Table | None) -> pa.Table:
        op = header.get("op")
        hosted = self.addressed(header)
        if op == "scan":
            return self.scan(hosted, header)
        if op == "prefix_lookup":
            return self.prefix_lookups.read(hosted, header, payload)
        if op == "changelog":
            start = field(header, "start", int, 0)
            end = None if header.get("end") is None else field(header, "end", int)
            # records above the high watermark are not yet on every in-sync copy: not shown.
            # A range this log holds but whose end its followers have not confirmed yet (a
            # new leader, just elected) waits for them: an undo or a tiering round that asked
            # for acknowledged records must get all of them, never a silently shorter range.
            lead = self.leadership(hosted)
            visible = lead.shown_high_watermark()
            if end is not None and end > hosted.tablet.log_end_offset:
                # records this copy never held: cutting the range short would hide that
                raise OffsetOutOfRangeError(
                    f"{hosted.label}: changelog end {end} is past the log end offset "
                    f"{hosted.tablet.log_end_offset}")
            if end is not None and visible < end:
                visible = lead.wait_replicated(end, writing=False)
            end = visible if end is None else min(end, visible)
            with hosted.lock:
                return hosted.tablet.changelog(min(start, end), end)
        raise InvalidInputError(f"unknown read operation {op!r}")

    def scan(self, hosted: HostedTablet, header: dict) -> pa.RecordBatchReader:
        """The bucket's rows as of one changelog offset, streamed in batches: `columns` (a list
        of names, default all), `batch_size` rows at most per batch, and the hidden
        `_unwritten` column when `unwritten` is true. The offset is in the stream's schema
        metadata (SCAN_OFFSET_KEY). The bucket's lock is held only to take the snapshot."""
        columns, batch_size, unwritten = read_options(header, DEFAULT_SCAN_BATCH_ROWS)
        schema = scan_schema(hosted.routing.arrow_schema, columns, unwritten)
        lead = self.leadership(hosted)
        with hosted.lock:
            snapshot = hosted.tablet.snapshot()
        try:
            lead.wait_replicated(snapshot.offset, writing=False)
        except BaseException:
            snapshot.release()
            raise
        schema = schema.with_metadata({SCAN_OFFSET_KEY: str(snapshot.offset).encode()})
        return pa.RecordBatchReader.from_batches(
            schema, snapshot.batches(columns, batch_size, unwritten))

    # --- actions ----------------------------------------------------------------------------

    def offsets(self, body: dict) -> list[list[int]]:
        """[[log start, log end], ...] for the given (partition id, bucket) pairs of a table.
        With `settle`, the end is given only once every record the leader holds is committed
        (see settled_end): what an undo, a baseline or a takeover builds on."""
        table_id, out = field(body, "table_id", int), []
        settle = field(body, "settle", bool, False)
        deadline = time.monotonic() + SETTLE_TIMEOUT
        for pair in field(body, "buckets", list):
            if not isinstance(pair, list) or len(pair) != 2:
                raise InvalidInputError(f"buckets are [partition id, bucket] pairs, not {pair!r}")
            partition_id, bucket = int_items(pair, "buckets")
            hosted = self.tablet(table_id, partition_id, bucket)
            lead = self.leadership(hosted)
            with hosted.lock:
                start = int(hosted.tablet.log_start_offset)
            # the end a reader, a baseline or a commit may rely on: the high watermark
            end = settled_end(lead, deadline) if settle else lead.shown_high_watermark()
            out.append([start, max(start, int(end))])
        return out

    def _no_remote_dir(self, body: dict) -> None:
        raise InvalidOptionError(f"tablet server {self.server_id} has no --remote-dir: it "
                                 f"neither uploads nor restores snapshots")

    def reopen_tablets(self, body: dict) -> None:
        """Reopen the open buckets of a table with its new descriptor (add_column)."""
        from merge_engine import TableDescriptor

        table_id = field(body, "table_id", int)
        descriptor = TableDescriptor.from_json(field(body, "descriptor", str))
        for hosted in self.host.hosted(table_id):
            self.host.reopen(hosted, descriptor)

    def drop_tablets(self, body: dict) -> None:
        table_id = field(body, "table_id", int)
        self.host.drop_table(table_id)
        self.replicas.forget_table(table_id)
        if self.snapshot_uploads is not None:
            self.snapshot_uploads.drop_table(table_id)

    def close(self) -> None:
        self._heartbeat.close()
        if self.snapshot_uploads is not None:
            self.snapshot_uploads.close()
        self.replicas.close()
        self.retention.close()
        self.expiry.close()
        self.storage.close()
        self.host.close()
