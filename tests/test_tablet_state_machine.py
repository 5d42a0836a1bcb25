"""A hypothesis state machine driving a real KvTablet against the reference model.

Each run draws a table (aggregation or default engine, 1-2 key columns, up to four value
columns over the supported function/type pairs, a delete behavior), opens a KvTablet in a
temporary directory, and applies puts in every merge mode (full-row and partial), deletes
(full-row and partial, every mode), idempotent-writer retries and close/reopen. After every step
the TabletHarness compares the tablet with the model: rows in key order, lookups, offsets, the
changelog record by record, and the replay of the tablet's changelog into a fresh model.

Budget: `default` profile 200 runs of up to 20 steps (~30 s on 2 cores when the engine agrees); TALLY_HYPOTHESIS_PROFILE=thorough raises it.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from merge_engine.testing.harness import TabletHarness
from merge_engine.testing.ops import Reopen
from merge_engine.testing.profiles import examples, load_profile
from merge_engine.testing.strategies import deletes, puts, table_specs

load_profile()


class TabletMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="tally-machine-")
        self.harness: TabletHarness | None = None
        self.sequences = {"w1": 0, "w2": 0}
        self.last_writer_op = None

    @initialize(spec=table_specs())
    def open_tablet(self, spec):
        self.harness = TabletHarness(spec, self.directory)

    def _apply(self, op, kind: str) -> None:
        accepted = self.harness.apply(op, check=False)
        # Visible with --hypothesis-show-statistics: how often writes are accepted vs rejected.
        event(f"{kind} {getattr(op, 'mode', '')}: {'accepted' if accepted else 'rejected'}")

    def _put(self, data, mode: str) -> None:
        self._apply(data.draw(puts(self.harness.spec, [mode]), label="put"), "put")

    @rule(data=st.data())
    def put_aggregate(self, data):
        self._put(data, "AGGREGATE")

    @rule(data=st.data())
    def put_merge_state(self, data):
        self._put(data, "MERGE_STATE")

    @rule(data=st.data())
    def put_overwrite(self, data):
        self._put(data, "OVERWRITE")

    @rule(data=st.data())
    def delete(self, data):
        self._apply(data.draw(deletes(self.harness.spec), label="delete"), "delete")

    @rule(data=st.data(), writer=st.sampled_from(["w1", "w2"]), kind=st.sampled_from(["put", "delete"]))
    def write_as_writer(self, data, writer, kind):
        """A write with a fresh sequence number for an idempotent writer."""
        self.sequences[writer] += 1
        strategy = puts(self.harness.spec) if kind == "put" else deletes(self.harness.spec)
        op = dataclasses.replace(data.draw(strategy, label=kind), writer=(writer, self.sequences[writer]))
        self.last_writer_op = op
        self._apply(op, f"writer {kind}")

    @precondition(lambda self: self.last_writer_op is not None)
    @rule()
    def retry_last_writer_op(self):
        """The same request again (a client retry): nothing applies, the same offset returns."""
        self._apply(self.last_writer_op, "retry")

    @rule()
    def reopen(self):
        self.harness.apply(Reopen(), check=False)

    @invariant()
    def tablet_matches_model(self):
        if self.harness is not None:
            self.harness.check()

    def teardown(self):
        if self.harness is not None:
            self.harness.close()
        shutil.rmtree(self.directory, ignore_errors=True)


TabletMachine.TestCase.settings = settings(
    max_examples=examples(200), stateful_step_count=20, deadline=None
)
TestTabletStateMachine = TabletMachine.TestCase
