"""Lookups in other threads while a KvTablet's puts fill, merge, compact and flush its row
buffer: they see only row states that existed, never a torn row, never a row going backwards.

Readers run either as real threads (with a short switch interval, so they interleave often) or
as probes called from inside the engine's own code by a trace function, at points a thread
switch could land on.
"""

from __future__ import annotations

import os
import random
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest

import merge_engine
from aggfuncs import AggFunction
from merge_engine import Schema, TableDescriptor
from merge_engine.kv.storage import KV_APPLIED
from merge_engine.kv.tablet import KvTablet
from merge_engine.table.descriptor import KV_BUFFER_SIZE

CONCURRENT_PUTS = 400
READERS = 2
PROBE_CHANCE = 0.02
FIRST_PROBES = 3
ENGINE_DIR = os.path.dirname(os.path.abspath(merge_engine.__file__)) + os.sep


def counter_tablet(path: Path, size: str) -> KvTablet:
    schema = (Schema.builder()
              .column("k", pa.int64(), nullable=False)
              .agg_column("qty", pa.int64(), AggFunction.SUM)
              .agg_column("twice", pa.int64(), AggFunction.SUM)
              .agg_column("label", pa.string(), AggFunction.LAST_VALUE)
              .primary_key("k").build())
    return KvTablet.open(str(path), TableDescriptor(
        schema, properties={"table.merge-engine": "aggregation", KV_BUFFER_SIZE: size}))


class CounterReader:
    """One reader's checks: a lookup must return a whole row of one moment (twice == 2 * qty,
    label == qty), at least as new as every put acknowledged before it started and as this
    reader's earlier lookups, no newer than the puts begun before it ended, and None only while
    no put of the key was acknowledged or seen."""

    def __init__(self, name: str, tablet: KvTablet, begun: list, acked: list, problems: list):
        self.name, self.tablet, self.begun, self.acked = name, tablet, begun, acked
        self.problems = problems
        self.seen = [0] * len(begun)
        self.reads = 0

    def check(self, k: int) -> None:
        low = self.acked[k]
        row = self.tablet.lookup({"k": k})
        high = self.begun[k]
        self.reads += 1
        if row is None:
            if low or self.seen[k]:
                self.problems.append(f"{self.name}: key {k} vanished (acked {low}, seen {self.seen[k]})")
            return
        qty = row["qty"]
        if row != {"k": k, "qty": qty, "twice": 2 * qty, "label": str(qty)}:
            self.problems.append(f"{self.name}: torn row {row}")
        elif not max(low, self.seen[k]) <= qty <= high:
            self.problems.append(f"{self.name}: key {k} qty {qty} outside [{low}, {high}], "
                                 f"previously seen {self.seen[k]}")
        self.seen[k] = max(self.seen[k], qty)


def probing_inside_engine(probe: CounterReader | None, keys: int, seed: int, calls: dict):
    """A trace function for the writer thread that looks a key up from inside the engine, in the
    middle of a put, a flush or a compaction: the first FIRST_PROBES times each line of
    merge_engine/ runs, and at PROBE_CHANCE of its later runs. The interpreter switches threads
    only every so many microseconds, so reader threads alone rarely land in a window of a line
    or two (say, between publishing an empty buffer and committing the rows to RocksDB), and
    rare code (a compaction) runs too seldom to be hit by chance; these probes reach every line
    boundary of it. lookup() takes no lock, so a probe sees what a reader thread would see
    there. Tracing is off while a trace function runs: the probe's own lookup is not probed.
    `calls` counts the engine functions called, by name (to check the scenario ran). Without
    a `probe` it only counts."""
    rnd = random.Random(seed)
    runs: dict[tuple, int] = {}

    def on_line(frame, event, arg):
        if probe is None or event != "line":
            return on_line
        where = (frame.f_code, frame.f_lineno)
        runs[where] = n = runs.get(where, 0) + 1
        if n <= FIRST_PROBES or rnd.random() < PROBE_CHANCE:
            try:
                probe.check(rnd.randrange(keys))
            except Exception as exc:  # reported, not raised into the put
                probe.problems.append(f"{probe.name}: {exc!r}")
        return on_line

    def on_call(frame, event, arg):
        if not frame.f_code.co_filename.startswith(ENGINE_DIR):
            return None
        calls[frame.f_code.co_name] = calls.get(frame.f_code.co_name, 0) + 1
        return on_line

    return on_call


# flushing: '2kb' with puts of 1-3 of 6 keys flushes every ten puts or so (lookups move from
# the buffer to RocksDB). compacting: '512kb' with puts of 150 of 200 keys; the buffer merges
# its newest runs every other put or so and compacts itself once superseded rows dominate (a new
# index and fewer runs replace the old ones under the readers' feet), and flushes now and then.
@pytest.mark.parametrize("size, keys, per_put", [("2kb", 6, (1, 3)), ("512kb", 200, (150, 150))],
                         ids=["flushing", "compacting"])
@pytest.mark.parametrize("how", ["threads", "probes"])
def test_lookups_during_puts_see_only_states_that_existed(tmp_path, size, keys, per_put, how):
    """A writer thread runs CONCURRENT_PUTS puts, each adding 1 to qty, 2 to twice and setting
    label to the key's new count for `per_put` keys. With `threads`, READERS threads look keys up all
    along; with `probes`, the writer looks keys up from random lines inside the engine (see
    probing_inside_engine; both at once would mostly measure GIL hand-offs). Every lookup
    passes CounterReader's checks; the end state is exact."""
    tablet = counter_tablet(tmp_path / "tablet", size)
    begun = [0] * keys
    acked = [0] * keys
    done = threading.Event()
    problems: list[str] = []
    readers = [CounterReader(f"reader {n}", tablet, begun, acked, problems)
               for n in range(READERS if how == "threads" else 0)]
    probe = CounterReader("probe inside a put", tablet, begun, acked, problems) \
        if how == "probes" else None
    calls: dict[str, int] = {}

    def writer():
        rnd = random.Random(size)
        sys.settrace(probing_inside_engine(probe, keys, seed=keys, calls=calls))  # this thread only
        try:
            for _ in range(CONCURRENT_PUTS):
                chosen = rnd.sample(range(keys), rnd.randint(*per_put))
                for k in chosen:
                    begun[k] += 1
                tablet.put([{"k": k, "qty": 1, "twice": 2, "label": str(begun[k])} for k in chosen])
                for k in chosen:
                    acked[k] += 1
        except Exception as exc:  # reported, not swallowed
            problems.append(f"writer: {exc!r}")
        finally:
            sys.settrace(None)
            done.set()

    def read(reader: CounterReader, seed: int):
        rnd = random.Random(seed)
        try:
            while not done.is_set() and len(problems) < 10:
                reader.check(rnd.randrange(keys))
        except Exception as exc:
            problems.append(f"{reader.name}: {exc!r}")

    threads = [threading.Thread(target=read, args=(r, n)) for n, r in enumerate(readers)]
    threads.append(threading.Thread(target=writer))
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)  # switch threads more often than the default 5 ms
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a thread hung"
        assert not problems, "\n".join(problems[:10])
        reads = [r.reads for r in readers] + ([probe.reads] if probe else [])
        assert min(reads) > CONCURRENT_PUTS, f"few lookups during the puts: {reads}"
        assert begun == acked and sum(acked) > CONCURRENT_PUTS
        # the scenario ran: with 2kb the puts flushed (a probe of the store); with 512kb the
        # buffer was replaced (RowBuffer.compacted or merged_from, as seen by the tracer)
        if size == "2kb":
            assert 0 < tablet._store.get_int(KV_APPLIED) <= tablet.log_end_offset
        else:
            replaced = calls.get("compacted", 0) + calls.get("merged_from", 0)
            assert replaced > 3, f"the buffer was replaced {replaced} times"
        expected = [{"k": k, "qty": n, "twice": 2 * n, "label": str(n)} for k, n in enumerate(acked)]
        assert [tablet.lookup({"k": k}) for k in range(keys)] == expected
        assert tablet.to_arrow().to_pylist() == expected
    finally:
        sys.setswitchinterval(interval)
        done.set()
        tablet.close()
    with counter_tablet(tmp_path / "tablet", "0") as tablet:
        assert tablet.to_arrow().to_pylist() == expected


