"""kill -9 tests: a writer process is killed at random moments, the tablet reopened and checked.

One directory goes through many kill/reopen cycles, so recovery after a crash is itself crashed
into. After each kill the parent reopens the tablet and checks (issue 2, section 5):
- every acknowledged write is there: log_end_offset >= the last acknowledged offset;
- re-sending an acknowledged (writer, seq) is a no-op returning the recorded offset;
- the KV state (to_arrow) equals the replay of the whole changelog;
- the KV state equals a plain-Python recomputation of the acknowledged writes, or of those plus
  the one write in flight at the kill (which may or may not have landed, but never half).

Every other writer runs with a small row buffer (`table.kv.buffer-size` = SMALL_BUFFER), so it
flushes buffered rows to RocksDB every few writes and kills land in flushes too (half of those
also flush RocksDB's memtables as often, so their flushed rows outlive the kill; in the other
half the flushed rows wait in the memtables, without the write-ahead log); the others keep
the default size, so their rows exist only in the changelog until the tablet is reopened. The
parent reopens with either size (the option is runtime only), in all four combinations.
"""

from __future__ import annotations

import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests import crash_model
from tests.crash_writer import PERSISTED, make_write, send

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("during-start", "after-sleep", "mid-write", "mid-big-write", "applied-not-acked")
KILLS_PER_STRATEGY = 5  # 25 kills in all
READY_TIMEOUT = 30.0
SMALL_BUFFER = "8kb"


@dataclass
class ChildRun:
    """What one writer process reported before it was killed."""

    acks: list[tuple[int, int]] = field(default_factory=list)  # (seq, returned offset)
    begun: list[int] = field(default_factory=list)
    applied: list[tuple[int, int]] = field(default_factory=list)  # returned, not yet acked
    ready: bool = False


def spawn(path: Path, seed: int, start_seq: int, pause: float,
          buffer_size: str | None = None) -> tuple[subprocess.Popen, queue.Queue]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.crash_writer", str(path), str(seed), str(start_seq), str(pause),
         buffer_size or "default"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )
    lines: queue.Queue = queue.Queue()

    def pump():  # a thread, so the parent can wait for a line with a timeout
        for line in child.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return child, lines


def wait_for(lines: queue.Queue, seen: list[str], prefix: str, timeout: float) -> bool:
    """Collect lines until one starts with `prefix` (True) or the time is up / EOF (False)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            return False
        if line is None:
            lines.put(None)
            return False
        seen.append(line)
        if line.startswith(prefix):
            return True
    return False


def drain(lines: queue.Queue, seen: list[str]) -> None:
    """Take the lines already written, so the next wait sees a fresh event, not a backlog."""
    while True:
        try:
            line = lines.get_nowait()
        except queue.Empty:
            return
        if line is None:
            lines.put(None)
            return
        seen.append(line)


def kill_at_random(path: Path, seed: int, start_seq: int, strategy: str, rnd: random.Random,
                   durations: dict[str, list[float]], buffer_size: str | None = None) -> ChildRun:
    """Start a writer, SIGKILL it at a random moment chosen by `strategy`, parse what it said.

    during-start: at a random time after spawn (maybe while opening or recovering the tablet);
    after-sleep: at a random time after the tablet is open; mid-write: right after a write began;
    mid-big-write: during a 4,000-row write; applied-not-acked: after a write returned and before
    its ack was printed (the writer pauses there), so it landed but is unacknowledged. The two
    mid-write strategies wait a random part of the typical duration of such a write (measured by
    earlier writes in `durations`), so kills spread over the whole put, its commit included.
    """
    # only the last strategy slows the writer: it pauses between a write's return and its ack
    child, lines = spawn(path, seed, start_seq, 0.5 if strategy == "applied-not-acked" else 0.0,
                         buffer_size)
    seen: list[str] = []
    if strategy == "during-start":
        time.sleep(rnd.uniform(0.0, 0.6))  # maybe while opening / recovering the tablet
    else:
        assert wait_for(lines, seen, "ready", READY_TIMEOUT), _failure(child, seen, "never got ready")
        if strategy == "after-sleep":
            time.sleep(rnd.uniform(0.0, 1.0))
        elif strategy == "mid-big-write":
            drain(lines, seen)
            while wait_for(lines, seen, "begin", 5.0) and int(seen[-1].split()[3]) <= 100:
                pass  # skip small writes
            time.sleep(rnd.uniform(0.0, 1.2 * statistics.median(durations["big"] or [0.05])))
        elif strategy == "mid-write":
            time.sleep(rnd.uniform(0.05, 0.3))
            drain(lines, seen)
            wait_for(lines, seen, "begin", 5.0)
            time.sleep(rnd.uniform(0.0, 1.2 * statistics.median(durations["small"] or [0.002])))
        else:
            time.sleep(rnd.uniform(0.0, 1.0))
            wait_for(lines, seen, "applied", 5.0)
    assert child.poll() is None, _failure(child, seen, "the writer exited by itself")
    child.send_signal(signal.SIGKILL)
    child.wait()
    while (line := lines.get()) is not None:
        seen.append(line)
    run = ChildRun()
    sizes = {}
    for line in seen:
        if not line.endswith("\n"):
            continue  # cut by the kill
        word, *rest = line.split()
        if word == "ready":
            run.ready = True
        elif word == "begin":
            run.begun.append(int(rest[0]))
            sizes[int(rest[0])] = int(rest[2])
        elif word == "applied":
            run.applied.append((int(rest[0]), int(rest[1])))
        elif word == "ack":
            run.acks.append((int(rest[0]), int(rest[1])))
            kind = "big" if sizes.get(int(rest[0]), 0) > 100 else "small"
            durations[kind].append(float(rest[2]))
    return run


def _failure(child: subprocess.Popen, seen: list[str], what: str) -> str:
    if child.poll() is None:
        child.kill()
    child.wait()
    return f"crash writer {what}; stdout tail {seen[-5:]}; stderr:\n{child.stderr.read()[-3000:]}"


def rows_applied(path: Path) -> tuple[int, int]:
    """(KV_APPLIED, log end offset) as the killed writer left them: how far RocksDB's rows
    were flushed. Read straight from RocksDB, before the tablet is reopened."""
    from merge_engine.kv.storage import END_OFFSET, KV_APPLIED, TabletStore

    store = TabletStore(str(path))
    try:
        return store.get_int(KV_APPLIED), store.get_int(END_OFFSET)
    finally:
        store.close()


def check_reopened(path: Path, seed: int, last_seq: int, last_offset: int,
                   acked: crash_model.State, with_inflight: crash_model.State,
                   applied_offset: int | None, buffer_size: str | None = None) -> bool:
    """Reopen after a kill (with `table.kv.buffer-size` = buffer_size) and check every
    invariant; True when the in-flight write landed."""
    from merge_engine.kv.tablet import KvTablet
    from merge_engine.testing.model import ReferenceTable
    from tests.crash_writer import descriptor

    with KvTablet.open(path, descriptor(buffer_size)) as tablet:
        end = tablet.log_end_offset
        assert end >= last_offset, f"acknowledged offset {last_offset} lost: log end {end}"
        assert tablet.log_start_offset == 0
        changelog = tablet.changelog(0)
        assert changelog.column("_offset").to_pylist() == list(range(end)), "changelog offsets have gaps"
        table = tablet.to_arrow()
        state = crash_model.table_state(table)
        assert state == crash_model.replay(changelog), "KV state differs from the changelog replay"
        # the engine's reference model replays it too (it also checks the written bits)
        assert ReferenceTable(descriptor()).replay(changelog).rows() == table.to_pylist()
        assert state in (acked, with_inflight), (
            f"state after seq {last_seq} is neither the acknowledged writes nor those plus the "
            f"in-flight one: {_diff(state, acked)}"
        )
        landed = state == with_inflight and state != acked
        if end > last_offset:
            assert state == with_inflight, "offsets grew past the last ack, but not by seq+1"
        if applied_offset is not None:  # the in-flight write had returned: it must have landed
            assert end == applied_offset, f"write {last_seq + 1} returned {applied_offset}, log end {end}"
            assert state == with_inflight, f"write {last_seq + 1} returned but is not in the table"
        if last_seq > 0:
            # a retried request: applies nothing, answers the offset recorded with the writer's
            # last applied write (the last ack's, or the in-flight one's when that landed)
            for seq in {last_seq, 1}:
                assert send(tablet, make_write(seed, seq), seq) == end, f"retry of seq {seq}"
            assert tablet.log_end_offset == end, "a retried write added changelog records"
            assert crash_model.table_state(tablet.to_arrow()) == state, "a retried write changed the table"
    return landed


def _diff(state: crash_model.State, expected: crash_model.State) -> str:
    keys = sorted(set(state) | set(expected))
    bad = [(k, state.get(k), expected.get(k)) for k in keys if state.get(k) != expected.get(k)]
    return f"{len(bad)} keys differ, e.g. {bad[:3]}"


@pytest.mark.parametrize("seed", [7])
def test_kill9_cycles_keep_acknowledged_writes_and_replay(tmp_path, seed):
    rnd = random.Random(seed)
    path = tmp_path / "tablet"
    model: crash_model.State = {}  # the table after writes 1..last_seq
    last_seq, last_offset = 0, 0
    stats = {"kills": 0, "mid_write": 0, "inflight_landed": 0, "acks": 0, "small_buffer": 0,
             "flushed_by_writer": 0, "replayed": 0}
    reopened_end = 0  # the log end when the parent last closed the tablet (all rows flushed)
    started = time.monotonic()
    durations: dict[str, list[float]] = {"small": [], "big": []}
    strategies = list(STRATEGIES) * KILLS_PER_STRATEGY
    rnd.shuffle(strategies)
    for cycle, strategy in enumerate(strategies):
        # the writer's row buffer: small in even cycles; the parent's: small in cycles 2, 3, 6, 7, ...
        # (and in every other of those, RocksDB's memtables flushed as often, so the rows the
        # writer flushed outlive it: both recoveries below need one or the other)
        child_buffer = None if cycle % 2 else SMALL_BUFFER + (PERSISTED if cycle % 4 == 0 else "")
        reopen_buffer = SMALL_BUFFER if cycle // 2 % 2 else None
        run = kill_at_random(path, seed, last_seq + 1, strategy, rnd, durations, child_buffer)
        stats["kills"] += 1
        stats["small_buffer"] += child_buffer is not None
        kv_applied, kv_end = rows_applied(path)
        # the parent closed the tablet with every row flushed; since then only the writer's
        # flushes (small buffer) can have moved KV_APPLIED, and never past the log end
        assert reopened_end <= kv_applied <= kv_end, \
            f"KV_APPLIED {kv_applied} outside [{reopened_end}, {kv_end}]"
        stats["flushed_by_writer"] += kv_applied > reopened_end
        stats["replayed"] += kv_applied < kv_end
        seqs = [s for s, _ in run.acks]
        assert seqs == list(range(last_seq + 1, last_seq + 1 + len(seqs))), f"acks out of order: {seqs}"
        offsets = [last_offset] + [o for _, o in run.acks]
        assert offsets == sorted(offsets), f"acknowledged offsets went backwards: {offsets}"
        for seq in seqs:
            model = crash_model.apply(model, make_write(seed, seq))
        if seqs:
            last_seq, last_offset = seqs[-1], offsets[-1]
        stats["acks"] += len(seqs)
        stats["mid_write"] += bool(run.begun and run.begun[-1] == last_seq + 1)
        with_inflight = crash_model.apply(model, make_write(seed, last_seq + 1))
        applied = [o for s, o in run.applied if s == last_seq + 1]
        landed = check_reopened(path, seed, last_seq, last_offset, model, with_inflight,
                                applied[0] if applied else None, reopen_buffer)
        stats["inflight_landed"] += landed
        reopened_end = rows_applied(path)[1]
        print(f"cycle {cycle + 1}/{len(strategies)} ({strategy}, buffer {child_buffer or 'default'}"
              f" then {reopen_buffer or 'default'}): {len(seqs)} acks, last seq {last_seq}, "
              f"offset {last_offset}, in-flight landed: {landed}, rows flushed up to {kv_applied} of "
              f"{kv_end}", flush=True)
    medians = {k: f"{statistics.median(v) * 1000:.1f} ms" for k, v in durations.items() if v}
    print(f"crash summary: {stats}, median put/delete time {medians}, {time.monotonic() - started:.1f} s")
    assert stats["kills"] >= 20
    assert stats["acks"] > 0, "the writer never acknowledged a write: nothing was tested"
    assert stats["small_buffer"] >= 10
    # both recoveries were exercised: rows flushed by a killed writer, and rows replayed
    assert stats["flushed_by_writer"] > 0, "no small-buffer writer flushed before its kill"
    assert stats["replayed"] > 0, "no kill left rows to replay from the changelog"
