"""What a server process counts for Prometheus, and the HTTP endpoint that exposes it.

Every metric of a server is defined here (the coordinator's lake metrics apart, in
lake_metrics, on the same registry), in one `ServerMetrics` per process with a registry of
its own (never prometheus_client's global one), so two servers in one process, and the tests,
never share a counter. The server's parts call it at a few choke points (the Flight calls, the
tablet write, bucket opens, retention, the undo report); what is cheap to read on demand (row buffer and
memtable memory, lock holders) is read when the endpoint is scraped instead of being kept up
to date on every write.

Labels carry table names, call names and refusal reasons; bucket and partition labels only
with `per_bucket`, because they multiply the series by the bucket count of every table.
Recording always happens (microseconds a call, and one code path whether scraped or not); the
endpoint exists only when `serve` is called (`--metrics-port`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily

from tally.errors import (AuthenticationError, ColumnLockConflict, LeaseLostError,
                          PermissionDeniedError, UnrecoveredLockError)

log = logging.getLogger(__name__)

# Request latencies span a lookup (sub-millisecond) to a 64 MiB write or a long scan.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0)
UNDO_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)

# refusal reason of each error class a server answers with, most specific first
_REFUSALS = (
    (UnrecoveredLockError, "unrecovered_lock"),
    (ColumnLockConflict, "lock_conflict"),
    (LeaseLostError, "lease_lost"),
    (PermissionDeniedError, "permission_denied"),
    (AuthenticationError, "unauthenticated"),
)


def refusal_reason(exc: BaseException) -> str | None:
    """The refusal an error stands for, or None when it is no refusal (a bad request, a
    missing table, a failure)."""
    return next((reason for cls, reason in _REFUSALS if isinstance(exc, cls)), None)


class _Call:
    """The call a request turns out to be, once its header has been read."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class ServerMetrics:
    """The metrics of one server process (see the module docstring)."""

    def __init__(self, per_bucket: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.per_bucket = per_bucket
        self.where = ("table", "partition", "bucket") if per_bucket else ("table",)
        r = self.registry
        self.writes = Counter("tally_writes", "Write requests applied by this tablet server",
                              self.where + ("op",), registry=r)
        self.rows_written = Counter("tally_written_rows", "Rows in the write requests applied",
                                    self.where + ("op",), registry=r)
        self.bytes_written = Counter("tally_written_bytes",
                                     "Arrow bytes of the rows in the write requests applied",
                                     self.where + ("op",), registry=r)
        self.latency = Histogram("tally_request_seconds",
                                 "Time to answer a call, by action or DoPut/DoGet op (a scan "
                                 "until its stream ends), refused calls included",
                                 ("call",), buckets=LATENCY_BUCKETS, registry=r)
        self.refusals = Counter("tally_refusals",
                                "Calls refused: unauthenticated, permission_denied (roles, "
                                "lease secrets), and the fencing of column locks "
                                "(lock_conflict, unrecovered_lock, lease_lost)",
                                ("call", "reason"), registry=r)
        self.undo_runs = Counter("tally_undo_runs",
                                 "Bucket undos reported by the clients that ran them",
                                 ("table",), registry=r)
        self.undo_keys = Counter("tally_undo_keys", "Keys an undo restored or deleted",
                                 ("table", "action"), registry=r)
        self.undo_records = Counter("tally_undo_scanned_records",
                                    "Changelog records undo runs read", ("table",), registry=r)
        self.undo_seconds = Histogram("tally_undo_seconds", "Duration of one bucket's undo",
                                      ("table",), buckets=UNDO_BUCKETS, registry=r)
        self.opens = Counter("tally_bucket_opens",
                             "Buckets opened (on first use after the server started)",
                             ("table",), registry=r)
        self.replayed = Counter("tally_replayed_records",
                                "Changelog records replayed into row buffers when buckets "
                                "opened (what was not yet flushed when the server stopped)",
                                ("table",), registry=r)
        self.open_seconds = Histogram("tally_bucket_open_seconds",
                                      "Time to open a bucket, its replay included", ("table",),
                                      buckets=UNDO_BUCKETS, registry=r)
        self.truncations = Counter("tally_log_truncations",
                                   "Changelog truncations that moved a bucket's log start, by "
                                   "trigger: retention (the table's options) or admin",
                                   ("table", "trigger"), registry=r)
        self.truncated_records = Counter("tally_log_truncated_records",
                                         "Changelog records truncation dropped",
                                         ("table", "trigger"), registry=r)
        self.isr_shrinks = Counter("tally_isr_shrinks",
                                   "Followers that left the in-sync set of a bucket led here "
                                   "(not caught up within the replica lag time, or lost data)",
                                   ("table",), registry=r)
        self.isr_expands = Counter("tally_isr_expands",
                                   "Followers that joined the in-sync set of a bucket led here "
                                   "once caught up", ("table",), registry=r)
        self._http = None
        # labels() validates its arguments on every call: a write finds its three children here
        self._write_children: dict[tuple[str, ...], tuple] = {}
        self._latency_children: dict[str, object] = {}

    # --- recording ----------------------------------------------------------------------

    def location(self, hosted) -> tuple[str, ...]:
        """The values of the `where` labels of a hosted bucket."""
        table = hosted.routing.name
        if not self.per_bucket:
            return (table,)
        return (table, hosted.partition or "", str(hosted.key.bucket))

    def written(self, hosted, op: str, rows) -> None:
        """One put or delete applied to a hosted bucket."""
        labels = self.location(hosted) + (op,)
        children = self._write_children.get(labels)
        if children is None:
            children = self._write_children.setdefault(labels, (
                self.writes.labels(*labels), self.rows_written.labels(*labels),
                self.bytes_written.labels(*labels)))
        writes, rows_written, bytes_written = children
        writes.inc()
        rows_written.inc(rows.num_rows)
        bytes_written.inc(rows.nbytes)

    @contextlib.contextmanager
    def timed(self, call: str) -> Iterator[_Call]:
        """Times the block as `call`; the block may rename the call once it knows it."""
        named = _Call(call)
        started = time.perf_counter()
        try:
            yield named
        finally:
            self.observe(named.name, started)

    def observe(self, call: str, started: float) -> None:
        """A call that began at `started` (time.perf_counter) has been answered."""
        child = self._latency_children.get(call)
        if child is None:  # labels() costs microseconds a point lookup feels: made once
            child = self._latency_children.setdefault(call, self.latency.labels(call))
        child.observe(time.perf_counter() - started)

    def streamed(self, call: str, started: float, batches: Iterable) -> Iterator:
        """`batches`, timing `call` from `started` until the stream ends (or is abandoned)."""
        try:
            yield from batches
        finally:
            self.observe(call, started)

    def refused(self, call: str, exc: BaseException) -> None:
        """Count `exc` if it is a refusal."""
        reason = refusal_reason(exc)
        if reason is not None:
            self.refusals.labels(call, reason).inc()

    def undone(self, table: str, restored: int, deleted: int, scanned: int,
               seconds: float) -> None:
        self.undo_runs.labels(table).inc()
        self.undo_keys.labels(table, "restored").inc(restored)
        self.undo_keys.labels(table, "deleted").inc(deleted)
        self.undo_records.labels(table).inc(scanned)
        self.undo_seconds.labels(table).observe(seconds)

    def opened(self, hosted, started: float) -> None:
        """A bucket was opened, beginning at `started` (time.perf_counter)."""
        table = hosted.routing.name
        self.opens.labels(table).inc()
        self.replayed.labels(table).inc(hosted.tablet.replayed_records)
        self.open_seconds.labels(table).observe(time.perf_counter() - started)

    def truncated(self, hosted, trigger: str, before: int, after: int) -> None:
        """A bucket's log start moved from `before` to `after` (nothing when it did not)."""
        if after > before:
            table = hosted.routing.name
            self.truncations.labels(table, trigger).inc()
            self.truncated_records.labels(table, trigger).inc(after - before)

    def isr_changed(self, table: str, shrunk: int, expanded: int) -> None:
        """A led bucket's in-sync set lost `shrunk` followers and gained `expanded`."""
        if shrunk:
            self.isr_shrinks.labels(table).inc(shrunk)
        if expanded:
            self.isr_expands.labels(table).inc(expanded)

    # --- read when scraped --------------------------------------------------------------

    def watch_memory(self, host) -> None:
        """Row buffer and memtable bytes of a TabletHost's buckets, read at each scrape."""
        self.registry.register(_MemoryCollector(host, self))

    def watch_locks(self, holders: Callable[[], dict[str, tuple[int, int]]]) -> None:
        """Lock holders per table, `holders()` -> {table: (live, expired unreleased)}."""
        self.registry.register(_LockCollector(holders))

    def watch_replication(self, led: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        """In-sync copies of the buckets this server leads, `led()` -> [(table, in sync,
        copies), ...], read at each scrape."""
        self.registry.register(_ReplicationCollector(led))

    # --- the endpoint -------------------------------------------------------------------

    def serve(self, host: str, port: int) -> str:
        """Expose the registry over HTTP at host:port (0: a free one); its /metrics URL."""
        self._http, _ = start_http_server(port, addr=host, registry=self.registry)
        bound = self._http.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{bound}/metrics"

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


class _MemoryCollector:
    def __init__(self, host, metrics: ServerMetrics) -> None:
        self._host = host
        self._metrics = metrics

    def collect(self):
        where = list(self._metrics.where)
        buffers = GaugeMetricFamily("tally_row_buffer_bytes",
                                    "Rows merged in memory since the last flush (an estimate)",
                                    labels=where)
        memtables = GaugeMetricFamily("tally_memtable_bytes", "RocksDB memtable bytes",
                                      labels=where)
        sums: dict[tuple, list[int]] = {}
        for hosted in self._host.all_hosted():
            tablet = hosted.tablet
            try:
                sizes = (tablet.buffered_bytes, tablet.memtable_bytes)
            except Exception:  # noqa: BLE001 - closed meanwhile (dropped, reopened): skip it
                continue
            total = sums.setdefault(self._metrics.location(hosted), [0, 0])
            total[0] += sizes[0]
            total[1] += sizes[1]
        for labels, (buffered, memtable) in sorted(sums.items()):
            buffers.add_metric(list(labels), buffered)
            memtables.add_metric(list(labels), memtable)
        yield buffers
        yield memtables
        budget = self._host.budget
        if budget is not None:
            limit = GaugeMetricFamily("tally_memory_budget_bytes",
                                      "The write memory budget, by part", labels=["part"])
            limit.add_metric(["row_buffers"], budget.row_buffer_bytes)
            limit.add_metric(["memtables"], budget.memtables.cap_bytes)
            yield limit


class _LockCollector:
    def __init__(self, holders: Callable[[], dict[str, tuple[int, int]]]) -> None:
        self._holders = holders

    def collect(self):
        family = GaugeMetricFamily("tally_lock_holders",
                                   "Owners holding column locks: live, or expired and not yet "
                                   "recovered or released", labels=["table", "state"])
        try:
            holders = self._holders()
        except Exception as e:  # noqa: BLE001 - the metadata store is away: no lock series
            log.info("lock holders not read for metrics: %s", e)
            holders = {}
        for table, (live, expired) in sorted(holders.items()):
            family.add_metric([table, "live"], live)
            family.add_metric([table, "expired"], expired)
        yield family


class _ReplicationCollector:
    def __init__(self, led: Callable[[], Iterable[tuple[str, int, int]]]) -> None:
        self._led = led

    def collect(self):
        in_sync = GaugeMetricFamily("tally_led_in_sync_replicas",
                                    "In-sync copies (the leader's included) summed over the "
                                    "buckets this server leads", labels=["table"])
        under = GaugeMetricFamily("tally_under_replicated_buckets",
                                  "Buckets led here with a copy out of the in-sync set",
                                  labels=["table"])
        sums: dict[str, list[int]] = {}
        for table, isr, copies in self._led():
            total = sums.setdefault(table, [0, 0])
            total[0] += isr
            total[1] += 1 if isr < copies else 0
        for table, (isr, lagging) in sorted(sums.items()):
            in_sync.add_metric([table], isr)
            under.add_metric([table], lagging)
        yield in_sync
        yield under
