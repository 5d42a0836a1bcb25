"""A follower bucket that applies its leader's changelog entries stays equal to the leader.

A hypothesis state machine drives a leader KvTablet with random writes (tests/replica_workload:
sums with retractions, last_value, string_agg, first_value, a row TTL table, a last-row
table; AGGREGATE and OVERWRITE, partial target columns, deletes; idempotent writers, retried
sequences) while a follower fetches `replication_entries` from its log end in chunks of random
`max_bytes` (as small as one entry), sometimes through the Arrow form the cluster ships, and
applies them. Either side is closed and reopened at random, with another row buffer size; the
leader sometimes cuts one write into several changelog entries. The plain model is the leader's
history: its rows, lookups and writer states after each write. After every step the follower
equals the leader as of the follower's log end: changelog record by record, rows of a
snapshot, lookup_many (with `_unwritten`) and the idempotent writers' states. Once caught up,
the whole stored state (hidden parts included) is compared byte for byte, and the follower,
promoted, must answer the next write exactly as the leader does.

Budget: `default` profile 40 runs of up to 30 steps.
"""

from __future__ import annotations

import shutil
import tempfile

import pyarrow as pa
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from merge_engine.kv.replica_entries import ReplicatedEntry
from merge_engine.testing.ops import engine_mode
from merge_engine.testing.profiles import examples, load_profile
from tally.errors import TallyError
from tests import replica_workload as rw

load_profile()

BUFFER_SIZES = (None, "1kb", "0")
WRITERS = ("w1", "w2")


def apply_write(tablet, op) -> int | None:
    """The log end after `op`, or None when the tablet refused it (a TallyError)."""
    try:
        return op.apply(tablet, engine_mode(op.mode))
    except TallyError:
        return None


def ship(entries: list[ReplicatedEntry]) -> list[ReplicatedEntry]:
    """Entries through one Arrow IPC stream and back, as the cluster sends them."""
    sink = pa.BufferOutputStream()
    table = ReplicatedEntry.to_arrow(entries)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return ReplicatedEntry.from_arrow(pa.ipc.open_stream(sink.getvalue()).read_all())


class ReplicaMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="tally-replica-")
        self.clock = rw.Clock()
        self.leader = self.follower = None
        self.history: dict[int, tuple] = {}  # log end -> (time, rows, lookups) of the leader
        self.writes: list[tuple[int, str, int]] = []  # (end, writer, sequence): changing writes
        self.writer_states: dict[str, tuple[int, int]] = {}  # the leader's, no-op writes too
        self.sequences = dict.fromkeys(WRITERS, 0)
        self.last_writer_op = None

    @initialize(kind=st.sampled_from(rw.KINDS), slice_rows=st.sampled_from([None, 2]),
                buffers=st.tuples(st.sampled_from(BUFFER_SIZES), st.sampled_from(BUFFER_SIZES)))
    def open_buckets(self, kind, slice_rows, buffers):
        self.kind, self.slice_rows = kind, slice_rows
        self.leader = self._open("leader", buffers[0])
        self.follower = self._open("follower", buffers[1])
        self._record()

    def _open(self, side: str, buffer_size: str | None):
        return rw.open_bucket(f"{self.directory}/{side}", self.kind, self.clock, buffer_size,
                              self.slice_rows)

    def _record(self) -> None:
        self.history[self.leader.log_end_offset] = (
            self.clock.now, rw.rows_of(self.leader), rw.lookups_of(self.leader))

    def _write(self, op) -> int | None:
        start = self.leader.log_end_offset
        end = apply_write(self.leader, op)
        if end is None:
            return None
        if op.writer is not None and op.writer[1] > self.writer_states.get(op.writer[0], (0,))[0]:
            self.writer_states[op.writer[0]] = (op.writer[1], end)
            if end > start:
                self.writes.append((end, *op.writer))
        self._record()
        return end

    # --- the leader's writes ----------------------------------------------------------------

    @rule(data=st.data())
    def write(self, data):
        self._write(data.draw(rw.writes(self.kind)))

    @rule(data=st.data(), writer=st.sampled_from(WRITERS))
    def write_as_writer(self, data, writer):
        self.sequences[writer] += data.draw(st.integers(1, 2))  # sequences may skip
        op = data.draw(rw.writes(self.kind))
        op = type(op)(**{**op.__dict__, "writer": (writer, self.sequences[writer])})
        # A refused write records no sequence, so resending it is a new attempt that may
        # apply once other writes made it valid: only an applied write's resend is a retry.
        if self._write(op) is not None:
            self.last_writer_op = op

    @precondition(lambda self: self.last_writer_op is not None)
    @rule()
    def retry_writer(self):
        """A client's retry: the leader answers the recorded end offset and changes nothing."""
        before = self.leader.log_end_offset
        answer = apply_write(self.leader, self.last_writer_op)
        state = self.leader.writer_states().get(self.last_writer_op.writer[0])
        assert answer is None or state is None or answer == state[1]
        assert self.leader.log_end_offset == before

    @precondition(lambda self: self.kind == "row-ttl")
    @rule(seconds=st.integers(1, 2 * rw.TTL_SECONDS), sweep=st.booleans())
    def time_passes(self, seconds, sweep):
        self.clock.now += seconds
        if sweep:
            self.leader.expire_rows()
        self._record()

    # --- replication ------------------------------------------------------------------------

    @rule(max_bytes=st.sampled_from([1, 600, 3000, 8 << 20]), arrow=st.booleans())
    def replicate(self, max_bytes, arrow):
        start = self.follower.log_end_offset
        entries = self.leader.replication_entries(start, max_bytes)
        assert (entries == []) == (start == self.leader.log_end_offset)
        if entries and max_bytes == 1:
            assert len(entries) == 1
        end = self.follower.apply_replicated(ship(entries) if arrow else entries)
        assert end == (entries[-1].end_offset if entries else start) == \
            self.follower.log_end_offset

    @rule(side=st.sampled_from(["leader", "follower"]), buffer_size=st.sampled_from(BUFFER_SIZES))
    def reopen(self, side, buffer_size):
        getattr(self, side).close()
        setattr(self, side, self._open(side, buffer_size))

    @rule(data=st.data())
    def caught_up_and_promoted(self, data):
        """Caught up, the follower holds the leader's whole state: every stored row's bytes
        and every writer's state; promoted, it answers the next write as the leader does."""
        while (entries := self.leader.replication_entries(self.follower.log_end_offset)):
            self.follower.apply_replicated(entries)
        assert rw.stored_rows(self.follower) == rw.stored_rows(self.leader)
        # A writer whose last write changed nothing has no changelog entry to copy.
        changed = {writer: (seq, end) for end, writer, seq in self.writes}
        assert self.follower.writer_states() == changed
        assert {w: s for w, s in self.leader.writer_states().items()} == self.writer_states
        op = data.draw(rw.writes(self.kind))
        start = self.leader.log_end_offset
        assert apply_write(self.follower, op) == apply_write(self.leader, op)
        assert self.follower.changelog(start).equals(self.leader.changelog(start))
        self._record()

    # --- the follower equals the leader at its log end --------------------------------------

    @invariant()
    def follower_equals_leader(self):
        if self.follower is None:
            return
        end = self.follower.log_end_offset
        assert end <= self.leader.log_end_offset
        assert self.follower.changelog().equals(self.leader.changelog(0, end))
        expected = {}
        for write_end, writer, sequence in self.writes:
            if write_end <= end:
                expected[writer] = (sequence, write_end)
        assert self.follower.writer_states() == expected
        recorded = self.history.get(end)
        # The leader's rows at a write's end; under a row TTL only while the clock stands.
        if recorded is not None and recorded[0] == self.clock.now:
            assert rw.rows_of(self.follower) == recorded[1]
            assert rw.lookups_of(self.follower) == recorded[2]

    def teardown(self):
        for tablet in (self.leader, self.follower):
            if tablet is not None:
                tablet.close()
        shutil.rmtree(self.directory, ignore_errors=True)


ReplicaMachine.TestCase.settings = settings(
    max_examples=examples(40), stateful_step_count=30, deadline=None)
TestReplicaMachine = ReplicaMachine.TestCase
