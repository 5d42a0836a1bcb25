"""KvTablet's row buffer (merge_engine/kv/buffer.py) and `table.kv.buffer-size`.

A put commits only its changelog entry, offsets and writer sequence; the merged rows stay in the
bucket's RowBuffer until a flush (buffer full, flush(), to_arrow(), log truncation, close) writes
them to RocksDB together with KV_APPLIED, the offset the rows are applied up to. Reopening
replays the changelog from KV_APPLIED. These tests check, on real RocksDB and real processes:

- crash without close: a writer process ends with os._exit(0) while rows exist only in the
  changelog (or after some flushes); the reopened tablet equals the reference model fed the same
  writes and the replay of its changelog, and its replay is itself flushed (a second crash right
  after reopening loses nothing);
- every buffer size (write-through '0', '1kb', '64kb', the 64 MiB default) gives the same
  offsets, errors, lookups, changelog and rows for the same workload, also after reopening;
- truncate_log / enforce_retention / flush() write buffered rows before a crash can lose them;
- the option's validation.

The workload, the table and the writer process are in tests/buffer_writer.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pytest

from merge_engine.kv.storage import END_OFFSET, KV_APPLIED, START_OFFSET, TabletStore
from merge_engine.kv.tablet import KvTablet
from merge_engine.table.descriptor import DEFAULT_KV_BUFFER_SIZE, KV_BUFFER_SIZE
from merge_engine.testing import ReferenceTable, diff_records, records_from_arrow, same_row
from tally.errors import InvalidOptionError, TallyError
from tests import buffer_writer as bw

ROOT = Path(__file__).resolve().parent.parent
WRITER_TIMEOUT = 60.0


def props(size: str | None) -> dict:
    """Table properties with `table.kv.buffer-size` = size (None: the default)."""
    return {} if size is None else {KV_BUFFER_SIZE: size}


# --- the writer process -----------------------------------------------------------------------


@dataclass
class WriterRun:
    """What a tests.buffer_writer process printed before its os._exit(0)."""

    ready: tuple[int, int] | None = None  # (log start, log end) right after opening
    outcomes: dict[int, tuple[str, object]] = field(default_factory=dict)  # index -> ack/error
    events: list[tuple[str, int]] = field(default_factory=list)  # (flushed|truncated|retained, n)
    exit_end: int | None = None
    died: bool = False  # a die:N step ended it inside a write

    def event(self, word: str) -> int:
        found = [n for w, n in self.events if w == word]
        assert len(found) == 1, f"expected one '{word}' line, got {self.events}"
        return found[0]


def run_writer(path: Path, properties: dict, seed: int, *steps: str) -> WriterRun:
    """Run the writer process to its os._exit(0) and parse its report."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(
        [sys.executable, "-m", "tests.buffer_writer", str(path), json.dumps(properties), str(seed),
         *steps],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=WRITER_TIMEOUT)
    assert done.returncode == 0, f"buffer writer failed ({done.returncode}):\n{done.stderr[-3000:]}"
    run = WriterRun()
    for line in done.stdout.splitlines():
        word, *rest = line.split()
        if word == "ready":
            run.ready = (int(rest[0]), int(rest[1]))
        elif word == "ack":
            run.outcomes[int(rest[0])] = ("ack", int(rest[1]))
        elif word == "error":
            run.outcomes[int(rest[0])] = ("error", rest[1])
        elif word == "exit":
            run.exit_end = int(rest[0])
        elif word == "died":
            run.died = True
        else:
            run.events.append((word, int(rest[0])))
    assert run.ready is not None and (run.exit_end is not None or run.died), f"incomplete run:\n{done.stdout[-2000:]}"
    return run


@dataclass
class Stored:
    """A closed tablet's bookkeeping, read straight from its RocksDB."""

    start: int
    end: int
    applied: int
    rows: int  # how many rows RocksDB holds


def stored(path: Path) -> Stored:
    """Read KV_APPLIED and friends; only while no process has the tablet open."""
    store = TabletStore(str(path))
    try:
        rows = sum(len(chunk) for chunk in store.scan_rows())
        return Stored(store.get_int(START_OFFSET), store.get_int(END_OFFSET),
                      store.get_int(KV_APPLIED, -1), rows)
    finally:
        store.close()


# --- the independent expectation --------------------------------------------------------------


def outcome(call) -> tuple[str, object]:
    try:
        return "ack", call()
    except TallyError as exc:
        return "error", type(exc).__name__


def feed(model: ReferenceTable, seed: int, indices) -> dict[int, tuple[str, object]]:
    """Apply workload operations to the reference model; their outcomes by index."""
    return {i: outcome(lambda: bw.apply(model, bw.operation(seed, i))) for i in indices}


def live_rows_at(changelog: list, offset: int) -> int:
    """How many rows the replay of the changelog records below `offset` holds."""
    return len(ReferenceTable(bw.spec()).replay([r for r in changelog if r.offset < offset]))


def check_tablet(tablet: KvTablet, model: ReferenceTable) -> None:
    """The tablet equals the model: offsets, lookups (buffer first, then after to_arrow's flush
    from RocksDB), the changelog record by record, rows, and the replay of its own changelog."""
    start = tablet.log_start_offset
    assert tablet.log_end_offset == model.log_end_offset
    check_lookups(tablet, model, "before to_arrow")
    check_scan(tablet, model)
    records = records_from_arrow(tablet.changelog(), model.names)
    problem = diff_records(model.changelog_records(start), records)
    assert problem is None, problem
    rows = tablet.to_arrow().to_pylist()
    expected = model.rows()
    assert len(rows) == len(expected) and all(map(same_row, rows, expected)), (
        f"to_arrow differs from the model:\n  expected {expected}\n  actual   {rows}")
    if start == 0:
        replayed = ReferenceTable(bw.spec()).replay(records).rows()
        assert len(replayed) == len(rows) and all(map(same_row, replayed, rows)), \
            "to_arrow differs from the replay of the tablet's changelog"
    check_lookups(tablet, model, "after to_arrow")


def check_scan(tablet: KvTablet, model: ReferenceTable) -> None:
    """A scan before to_arrow's flush (buffered rows run by run, in no key order) holds the
    model's rows, each once."""
    key = list(model.key_names)
    batches = list(tablet.snapshot().batches())
    rows = pa.Table.from_batches(batches).to_pylist() if batches else []
    rows.sort(key=lambda r: tuple(r[k] for k in key))
    expected = model.rows()
    assert len(rows) == len(expected) and all(map(same_row, rows, expected)), (
        f"a scan differs from the model:\n  expected {expected}\n  actual   {rows}")


def check_lookups(tablet: KvTablet, model: ReferenceTable, when: str) -> None:
    for key in bw.all_keys():
        found, want = tablet.lookup(key), model.lookup(key)
        assert same_row(found, want), f"lookup({key}) {when}: {found}, expected {want}"


# --- 1. crash without close -------------------------------------------------------------------

# case -> (buffer size, writer steps before the writes, what RocksDB must hold after the
# crash, before any reopen: checks the scenario is real). "persist-from:0" flushes RocksDB's
# memtables with every flush's worth of changelog, so flushed rows outlive the process;
# without it the flushed rows are in the memtables only, without the write-ahead log.
CRASH_CASES = {
    "default": (None, [], "nothing flushed: rows only in the changelog"),
    "write-through": ("0", ["persist-from:0"], "every put wrote its rows"),
    "2kb": ("2kb", ["persist-from:0"], "some flushes, the last puts only buffered"),
    "2kb-memtables": ("2kb", [], "flushes, all to memtables the crash took"),
}


@pytest.mark.parametrize("case", sorted(CRASH_CASES))
def test_crash_without_close_loses_nothing(tmp_path, case):
    size, steps, scenario = CRASH_CASES[case]
    path, seed, first = tmp_path / "tablet", 11, 70
    model = ReferenceTable(bw.spec())

    run = run_writer(path, props(size), seed, *steps, f"write:0:{first}")
    assert run.outcomes == feed(model, seed, range(first)), "offsets/errors differ from the model"
    assert run.exit_end == model.log_end_offset
    disk = stored(path)
    assert disk.end == model.log_end_offset and disk.start == 0
    if size is None or not steps:
        assert disk.applied == 0 and disk.rows == 0, f"{scenario}: {disk}"
    elif size == "0":
        assert disk.applied == disk.end, f"{scenario}: {disk}"
    else:
        assert 0 < disk.applied < disk.end, f"{scenario}: {disk}"
    # whatever was flushed is exactly the table as of KV_APPLIED (the writes had returned, so
    # each flush had written its last batch)
    assert disk.rows == live_rows_at(model.changelog, disk.applied), disk

    # A second writer crashes right after opening: the replay on open must have flushed, so
    # RocksDB alone now holds every row.
    again = run_writer(path, props(size), seed)
    assert again.ready == (0, model.log_end_offset)
    disk = stored(path)
    assert disk.applied == disk.end == model.log_end_offset, disk
    assert disk.rows == len(model)

    # More writes on top of the replayed rows (their written bits and contribution counts
    # decide first_value and the -U images), crashing again; the parent reopens with another
    # buffer size (the option is runtime only).
    more = 40
    run = run_writer(path, props(size), seed, *steps, f"write:{first}:{more}")
    assert run.outcomes == feed(model, seed, range(first, first + more))
    with KvTablet.open(str(path), bw.descriptor(props("1kb" if size is None else None))) as tablet:
        check_tablet(tablet, model)
    disk = stored(path)
    assert disk.applied == disk.end == model.log_end_offset and disk.rows == len(model), disk


# --- 2. every buffer size behaves the same ----------------------------------------------------

SIZES = ["0", "1kb", "64kb", None]


@dataclass
class Observed:
    """Everything a workload run lets the outside see."""

    outcomes: list
    snapshots: list  # lookups of every key every SNAPSHOT_EVERY operations
    changelog: list
    rows: list
    reopened_rows: list
    reopened_lookups: list
    reopened_changelog: list
    applied: int  # KV_APPLIED before to_arrow (checks the size really changed the flushing)
    end: int
    reopen_end: int


SNAPSHOT_EVERY = 10


def run_workload(path: Path, size: str | None, seed: int, count: int, retractions: bool) -> Observed:
    table_spec = bw.spec(props(size))
    open_tablet = lambda: KvTablet.open(str(path), table_spec.descriptor())  # noqa: E731
    tablet = open_tablet()
    outcomes, snapshots, reopen_end = [], [], 0
    try:
        for i in range(count):
            if i == count // 2:  # close (flushes) and reopen halfway
                tablet.close()
                tablet = open_tablet()
                reopen_end = tablet.log_end_offset
            op = bw.operation(seed, i, retractions=retractions)
            outcomes.append(outcome(lambda: bw.apply(tablet, op, table_spec)))
            if i % SNAPSHOT_EVERY == SNAPSHOT_EVERY - 1:
                snapshots.append([tablet.lookup(k) for k in bw.all_keys()])
        # a probe of the store, only to prove that the sizes flushed differently
        applied = tablet._store.get_int(KV_APPLIED)
        end = tablet.log_end_offset
        changelog = records_from_arrow(tablet.changelog(), table_spec.names)
        rows = tablet.to_arrow().to_pylist()
    finally:
        tablet.close()
    with open_tablet() as tablet:
        reopened_lookups = [tablet.lookup(k) for k in bw.all_keys()]
        reopened_rows = tablet.to_arrow().to_pylist()
        reopened_changelog = records_from_arrow(tablet.changelog(), table_spec.names)
    return Observed(outcomes, snapshots, changelog, rows, reopened_rows, reopened_lookups,
                    reopened_changelog, applied, end, reopen_end)


def same_rows(a: list, b: list) -> bool:
    return len(a) == len(b) and all(map(same_row, a, b))


def assert_same_observations(name: str, got: Observed, want: Observed) -> None:
    assert got.outcomes == want.outcomes, f"{name}: offsets/errors differ"
    for n, (g, w) in enumerate(zip(got.snapshots, want.snapshots)):
        assert same_rows(g, w), f"{name}: lookups after operation {(n + 1) * SNAPSHOT_EVERY - 1} differ"
    assert len(got.snapshots) == len(want.snapshots)
    problem = diff_records(want.changelog, got.changelog)
    assert problem is None, f"{name}: {problem}"
    assert same_rows(got.rows, want.rows), f"{name}: to_arrow differs"
    assert same_rows(got.reopened_rows, want.reopened_rows), f"{name}: to_arrow after reopen differs"
    assert same_rows(got.reopened_lookups, want.reopened_lookups), f"{name}: lookups after reopen differ"
    assert diff_records(want.reopened_changelog, got.reopened_changelog) is None, name


@pytest.mark.parametrize("retractions", [False, True], ids=["model", "retractions"])
def test_buffer_sizes_give_identical_results(tmp_path, retractions):
    seed, count = 5, 300
    runs = {str(size): run_workload(tmp_path / str(size), size, seed, count, retractions)
            for size in SIZES}

    # the sizes really flush differently (else this test would compare one thing with itself)
    assert runs["0"].applied == runs["0"].end
    for size in ("1kb", "64kb"):
        assert runs[size].reopen_end < runs[size].applied, f"{size} never flushed after reopen"
    assert runs["None"].applied == runs["None"].reopen_end < runs["None"].end, \
        "the default size should only have flushed at the close halfway"
    errors = [o for o in runs["0"].outcomes if o[0] == "error"]
    assert errors, "the workload has no rejected write"
    if retractions:
        assert "RetractionError" in {e[1] for e in errors}

    for size in SIZES[1:]:
        assert_same_observations(f"buffer-size {size}", runs[str(size)], runs["0"])
    assert runs["0"].reopened_rows == runs["0"].rows

    if not retractions:  # the reference model knows no retractions
        model = ReferenceTable(bw.spec())
        snapshots, outcomes = [], []
        for i in range(count):
            outcomes.append(outcome(lambda: bw.apply(model, bw.operation(seed, i))))
            if i % SNAPSHOT_EVERY == SNAPSHOT_EVERY - 1:
                snapshots.append([model.lookup(k) for k in bw.all_keys()])
        expected = Observed(outcomes, snapshots, model.changelog_records(), model.rows(),
                            model.rows(), [model.lookup(k) for k in bw.all_keys()],
                            model.changelog_records(), 0, model.log_end_offset, 0)
        assert_same_observations("reference model", runs["None"], expected)


# --- 3. truncation and retention persist buffered rows; flush() writes them --------------


def step_between_writes(path: Path, properties: dict, seed: int, step: str, before: int,
                        after: int) -> tuple[WriterRun, ReferenceTable, int]:
    """The writer runs `before` operations, `step`, `after` more, then dies; a reference model
    takes the same operations and the writer must have seen the same outcomes. Returns the run,
    the model and the model's log end offset when the step ran."""
    model = ReferenceTable(bw.spec())
    run = run_writer(path, properties, seed, f"write:0:{before}", step,
                     f"write:{before}:{after}")
    outcomes = feed(model, seed, range(before))
    at = model.log_end_offset
    outcomes.update(feed(model, seed, range(before, before + after)))
    assert run.outcomes == outcomes
    return run, model, at


def test_truncate_log_flushes_buffered_rows_before_a_crash(tmp_path):
    path = tmp_path / "tablet"
    run, model, truncated_at = step_between_writes(path, {}, 23, "truncate", 50, 20)
    assert run.event("truncated") == truncated_at
    disk = stored(path)
    # the truncation flushed the 50 buffered writes; the next 20 are only in the changelog
    assert (disk.start, disk.applied, disk.end) == (truncated_at, truncated_at, model.log_end_offset)
    assert disk.rows == live_rows_at(model.changelog, truncated_at)
    assert model.log_end_offset > truncated_at, "the writes after the truncation changed nothing"
    with KvTablet.open(str(path), bw.descriptor()) as tablet:
        assert tablet.log_start_offset == truncated_at
        check_tablet(tablet, model)


def test_truncate_log_to_the_end_then_crash(tmp_path):
    path = tmp_path / "tablet"
    run, model, end = step_between_writes(path, {}, 29, "truncate", 40, 0)
    assert run.event("truncated") == end
    disk = stored(path)
    assert (disk.start, disk.applied, disk.end, disk.rows) == (end, end, end, len(model))
    with KvTablet.open(str(path), bw.descriptor()) as tablet:
        assert tablet.changelog().num_rows == 0
        check_tablet(tablet, model)


def test_enforce_retention_flushes_buffered_rows_before_a_crash(tmp_path):
    path, keep = tmp_path / "tablet", 10
    options = {"table.log.retention.offsets": str(keep)}
    run, model, retained_at = step_between_writes(path, options, 31, "retain", 40, 15)
    assert run.event("retained") == retained_at - keep
    disk = stored(path)
    assert (disk.start, disk.applied, disk.end) == (retained_at - keep, retained_at, model.log_end_offset)
    with KvTablet.open(str(path), bw.descriptor(options)) as tablet:
        assert tablet.log_start_offset == retained_at - keep
        check_tablet(tablet, model)


def test_flushed_rows_only_in_memtables_come_back_after_a_crash(tmp_path):
    """flush() writes the rows to RocksDB without its write-ahead log: the crash takes them
    with the memtables, and the reopened bucket replays them from the changelog."""
    path = tmp_path / "tablet"
    run, model, flushed_at = step_between_writes(path, {}, 37, "flush", 30, 10)
    assert run.event("flushed") == flushed_at > 0
    disk = stored(path)
    assert (disk.applied, disk.rows, disk.end) == (0, 0, model.log_end_offset)
    with KvTablet.open(str(path), bw.descriptor()) as tablet:
        check_tablet(tablet, model)


def test_close_writes_buffered_rows(tmp_path):
    path, seed = tmp_path / "tablet", 41
    model = ReferenceTable(bw.spec())
    table_spec = bw.spec()
    with KvTablet.open(str(path), table_spec.descriptor()) as tablet:
        for i in range(30):
            op = bw.operation(seed, i)
            assert outcome(lambda: bw.apply(tablet, op, table_spec)) == \
                outcome(lambda: bw.apply(model, op)), f"operation {i}"
        check_lookups(tablet, model, "while buffered")
    disk = stored(path)
    assert (disk.applied, disk.end, disk.rows) == (model.log_end_offset,) * 2 + (len(model),), disk


# --- 4. the option ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "1.5mb", "abc", "", "64 mib", "10tb", "mb"])
def test_invalid_buffer_size_is_rejected(value):
    with pytest.raises(InvalidOptionError, match=re.escape("'table.kv.buffer-size'")):
        bw.descriptor({KV_BUFFER_SIZE: value})


@pytest.mark.parametrize("value, size", [
    ("64mb", 64 << 20), ("0", 0), ("10 KB", 10 << 10), ("4096", 4096), ("64kb", 64 << 10),
    (" 2 MB ", 2 << 20), ("1gb", 1 << 30), ("12b", 12), (0, 0), (8192, 8192),
])
def test_valid_buffer_sizes_are_parsed_to_bytes(value, size):
    assert bw.descriptor({KV_BUFFER_SIZE: value}).kv_buffer_size == size


def test_default_buffer_size_is_64_mib():
    assert bw.descriptor({}).kv_buffer_size == DEFAULT_KV_BUFFER_SIZE == 64 << 20
