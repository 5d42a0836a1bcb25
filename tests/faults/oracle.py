"""What a fault run is judged by: plain Python over what the workloads saw, no cluster.

- `History`: every lock-free write, each adding its own distinct value and 1 to a few keys,
  recorded as **acknowledged** (flush returned), **refused** (an error that says nothing was
  applied) or **ambiguous** (any other error: it may have been applied, now or later).
- `count_problems`: per key, the table's (sum, count) must be the acknowledged writes plus a
  subset of the ambiguous ones, each at most once: fewer is a lost acknowledged write, more (or
  a sum no such subset makes) a write counted twice.
- `ReadWatch`: a key's sum read twice never goes down (only positive adds), and never lies below
  what was acknowledged before the read began (a read that misses an acknowledged write is a
  stale read, e.g. from a deposed leader).
- `EpochWatch`: the (leader, leader epoch) of each bucket seen over the run: one leader per
  epoch, and epochs that never go back.
- `expected_locked`: the column-lock owners' columns, the sum of every committed epoch exactly
  once (uncommitted epochs were undone by recovery or takeover).
"""

from __future__ import annotations

import dataclasses
import threading

ACKED, REFUSED, AMBIGUOUS, PENDING = "acknowledged", "refused", "ambiguous", "pending"


@dataclasses.dataclass
class Write:
    id: int
    keys: tuple
    value: int
    outcome: str = PENDING
    error: str = ""


class History:
    """The lock-free writes of a run; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.writes: list[Write] = []
        self._floor: dict = {}      # key -> (sum, count) over acknowledged writes

    def begin(self, keys, value: int) -> Write:
        with self._lock:
            w = Write(len(self.writes), tuple(keys), value)
            self.writes.append(w)
            return w

    def end(self, write: Write, outcome: str, error: str = "") -> None:
        with self._lock:
            write.outcome, write.error = outcome, error
            if outcome == ACKED:
                for k in write.keys:
                    s, n = self._floor.get(k, (0, 0))
                    self._floor[k] = (s + write.value, n + 1)

    def floor(self, key) -> tuple[int, int]:
        """(sum, count) of the writes of `key` acknowledged so far."""
        with self._lock:
            return self._floor.get(key, (0, 0))

    def count(self, outcome: str) -> int:
        with self._lock:
            return sum(1 for w in self.writes if w.outcome == outcome)

    def acked_since(self, index: int) -> int:
        with self._lock:
            return sum(1 for w in self.writes[index:] if w.outcome == ACKED)

    def __len__(self) -> int:
        return len(self.writes)


@dataclasses.dataclass
class Verdict:
    acknowledged: int = 0
    ambiguous: int = 0
    lost: int = 0
    duplicated: int = 0
    problems: list = dataclasses.field(default_factory=list)


SUBSET_LIMIT = 24   # ambiguous writes of one key beyond which only the counts are checked


def _reachable(values: list[int], count: int, total: int) -> bool:
    """Whether some `count` of `values`, each used at most once, sum to `total`."""
    states = {(0, 0)}
    for v in values:
        states |= {(c + 1, s + v) for c, s in states if c < count}
    return (count, total) in states


def count_problems(history: History, rows: dict) -> Verdict:
    """Judge `rows` ({key: (sum, count)}, the table's lock-free columns) against `history`."""
    acked: dict = {}
    maybe: dict = {}
    verdict = Verdict()
    for w in history.writes:
        if w.outcome == ACKED:
            verdict.acknowledged += 1
            for k in w.keys:
                s, n = acked.get(k, (0, 0))
                acked[k] = (s + w.value, n + 1)
        elif w.outcome in (AMBIGUOUS, PENDING):
            verdict.ambiguous += 1
            for k in w.keys:
                maybe.setdefault(k, []).append(w.value)
    for k in sorted(set(acked) | set(maybe) | set(rows), key=repr):
        want_sum, want_n = acked.get(k, (0, 0))
        got_sum, got_n = rows.get(k, (0, 0))
        extra = got_n - want_n
        candidates = maybe.get(k, [])
        if extra < 0:
            verdict.lost += -extra
            verdict.problems.append(f"key {k}: {-extra} acknowledged write(s) lost "
                                    f"(count {got_n}, {want_n} acknowledged)")
        elif extra > len(candidates):
            verdict.duplicated += extra - len(candidates)
            verdict.problems.append(f"key {k}: counted {got_n} times, at most "
                                    f"{want_n + len(candidates)} possible "
                                    f"({want_n} acknowledged, {len(candidates)} ambiguous)")
        elif len(candidates) <= SUBSET_LIMIT and not _reachable(candidates, extra,
                                                                 got_sum - want_sum):
            verdict.duplicated += 1
            verdict.problems.append(f"key {k}: sum {got_sum} is not the acknowledged {want_sum} "
                                    f"plus {extra} distinct ambiguous writes of {candidates}: "
                                    "a write was counted twice or another lost")
    return verdict


class ReadWatch:
    """Reads never go back; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.last: dict = {}
        self.reads = 0
        self.problems: list[str] = []

    def saw(self, key, value: tuple[int, int] | None, floor: tuple[int, int]) -> None:
        """A read of `key` answered `value` ((sum, count), None for no row); `floor` is what
        was acknowledged for it before the read was sent."""
        got = value or (0, 0)
        with self._lock:
            self.reads += 1
            before = self.last.get(key, (0, 0))
            if got[0] < before[0] or got[1] < before[1]:
                self.problems.append(f"key {key}: read {got} after {before}: a read went back")
            if got[0] < floor[0] or got[1] < floor[1]:
                self.problems.append(f"key {key}: read {got}, but {floor} was acknowledged "
                                     "before the read began: a stale read")
            self.last[key] = max(before, got)


class EpochWatch:
    """One leader per (bucket, leader epoch), epochs only forward; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.leaders: dict = {}     # (bucket, epoch) -> leader
        self.newest: dict = {}      # bucket -> epoch
        self.problems: list[str] = []

    def saw(self, replicas: dict) -> None:
        with self._lock:
            for bucket, r in replicas.items():
                epoch, leader = r["leader_epoch"], r["leader"]
                if epoch < self.newest.get(bucket, epoch):
                    self.problems.append(f"bucket {bucket}: leader epoch went back from "
                                         f"{self.newest[bucket]} to {epoch}")
                self.newest[bucket] = max(epoch, self.newest.get(bucket, epoch))
                if leader is None:
                    continue
                first = self.leaders.setdefault((bucket, epoch), leader)
                if first != leader:
                    self.problems.append(f"bucket {bucket}: two leaders in epoch {epoch} "
                                         f"({first} and {leader})")

    def epochs(self) -> int:
        with self._lock:
            return len(self.leaders)


def epoch_rows(owner: str, epoch: int, keys: int) -> list[dict]:
    """The rows of an owner's epoch: the same every time the epoch is (re)written."""
    shift = sum(map(ord, owner))
    chosen = sorted({(epoch * 7 + j * 5 + shift) % keys for j in range(6)})
    return [{"k": k, "locked": epoch + 1, "locked_n": 1} for k in chosen]


def expected_locked(committed: dict[str, int], keys: int) -> dict:
    """{key: (sum, count)} of every owner's epochs 0..committed[owner], each once."""
    out: dict = {}
    for owner, last in committed.items():
        for epoch in range(last + 1):
            for row in epoch_rows(owner, epoch, keys):
                s, n = out.get(row["k"], (0, 0))
                out[row["k"]] = (s + row["locked"], n + row["locked_n"])
    return out
