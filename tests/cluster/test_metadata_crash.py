"""kill -9 at every crash point of the embedded metadata store: it always opens, and atomically.

Each operation (create, set, delete, recursive delete, a transaction with deletes) runs once in
a child process with TALLY_META_CRASH_AT=trace, which lists the crash points it passes (the
store's own CRASH_STEPS: a new step is covered without touching this file), then once per point
with a SIGKILL there. After each kill the test process reopens the store and checks that
- it opens, with no journal, nothing in `.scratch`, and every directory a node;
- its nodes are the model's before or after the operation, never anything in between;
- the operation can be finished, and its nodes deleted, re-created and deleted again.
Opening is crashed into too (a store that must replay a journal or empty `.scratch` is killed
at every point of its open). Children are `python -m` processes that only import the store; the
test waits for each to exit and never sleeps.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from tally.meta import embedded
from tally.meta.embedded import CRASH_STEPS, EmbeddedStore
from tests.cluster.meta_crash import (Model, assert_clean, check_all, crash_everywhere,
                                      make_store, model_apply, op_paths, recreate_and_delete,
                                      run_child, snapshot)
from tests.cluster.meta_crash_child import run_op

# --- every step of every operation --------------------------------------------------------------

OPERATIONS = {
    "create": ([], ["create", "/t/a/b", {"x": 1}]),  # with its missing parents
    "create-under-parent": ([["create", "/t", {}]], ["create", "/t/a", {"x": 1}]),
    "create-ephemeral": ([], ["create", "/live/s1", {"a": 1}, True]),  # a persistent parent
    "set": ([["create", "/t/a", {"x": 1}]], ["set", "/t/a", {"x": 2}]),
    "delete": ([["create", "/t/a", {"x": 1}]], ["delete", "/t/a", False]),
    "delete-recursive": ([["create", "/t/a/b/c", {"c": 1}], ["create", "/t/a/d", {"d": 1}]],
                         ["delete", "/t/a", True]),
    "transaction": (
        [["create", "/t/a", {"v": 1}], ["create", "/t/b", {}], ["create", "/t/c/d", {}]],
        ["txn", [["check", "/t/a", 0], ["set", "/t/a", {"v": 2}, 0], ["delete", "/t/b", 0],
                 ["delete", "/t/c/d", None], ["delete", "/t/c", None],
                 ["create", "/t/n", {"n": 1}], ["create", "/u/v/w", {"w": 1}]]]),
}


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, list[str]]:
    """The crash points of every operation, from one uncrashed child run each."""
    found = {}
    for name, (setup, op) in OPERATIONS.items():
        root = tmp_path_factory.mktemp(f"trace-{name}")
        make_store(root, setup)
        child = run_child(root, [op])
        assert child.returncode == 0 and child.opened == 0, child
        found[name] = child.trace
    return found


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_kill_at_every_step_of(name, traces, tmp_path):
    setup, op = OPERATIONS[name]
    template = tmp_path / "template"
    before = make_store(template, setup)
    after = model_apply(before, op)
    assert before != after and traces[name]

    def check(spec: str, root: Path) -> None:
        with EmbeddedStore(str(root)) as store:
            assert_clean(root)
            state = snapshot(store)
            assert state in (before, after), f"{name} killed at {spec}: {state}"
            if state == before:
                run_op(store, op)  # the operation can be repeated
        with EmbeddedStore(str(root)) as store:  # reopened: ephemeral nodes are gone
            assert snapshot(store) == after, spec
            recreate_and_delete(store, op_paths(op))
        with EmbeddedStore(str(root)):
            assert_clean(root)

    check_all(check, crash_everywhere(template, tmp_path, [op], traces[name]))


# --- every step of an open that has work to do ---------------------------------------------------

TXN_SETUP, TXN = OPERATIONS["transaction"]
RECURSIVE_SETUP, RECURSIVE_DELETE = OPERATIONS["delete-recursive"]


def _crashed(setup: list, op: list, spec: str):
    """A store whose child was killed at `spec` during `op`, and the model's state after `op`."""
    def make(root: Path) -> Model:
        before = make_store(root, setup)
        assert run_child(root, [op], spec).returncode == -signal.SIGKILL
        return model_apply(before, op)
    return make


RECOVERIES = {
    # every change applied, the journal still there: the open replays all of it
    "replay-all": _crashed(TXN_SETUP, TXN, "journal.applied:1"),
    # killed mid-way: some changes applied, a staged subtree in .scratch, the journal to replay
    "replay-half": _crashed(TXN_SETUP, TXN, "create.staged:1"),
    # the doomed subtree of a recursive delete is still in .scratch
    "scratch": _crashed(RECURSIVE_SETUP, RECURSIVE_DELETE, "delete.renamed:1"),
}


@pytest.mark.parametrize("name", sorted(RECOVERIES))
def test_kill_at_every_step_of_recovery(name, tmp_path, recovery_traces):
    template = tmp_path / "template"
    template.mkdir()
    expected = RECOVERIES[name](template)
    trace = recovery_traces[name]
    assert trace, "this open has work to do"

    def check(spec: str, root: Path) -> None:
        with EmbeddedStore(str(root)) as store:
            assert_clean(root)
            assert snapshot(store) == expected, f"open of {name} killed at {spec}"
            recreate_and_delete(store, sorted(expected))

    check_all(check, crash_everywhere(template, tmp_path, [], trace))


@pytest.fixture(scope="module")
def recovery_traces(tmp_path_factory) -> dict[str, list[str]]:
    found = {}
    for name, make in RECOVERIES.items():
        root = tmp_path_factory.mktemp(f"trace-{name}")
        make(root)
        child = run_child(root, [])
        assert child.returncode == 0, child
        found[name] = child.trace
    return found


# --- the list of steps is the store's, and all of it is exercised -------------------------------


def test_every_crash_step_is_listed_and_exercised(traces, recovery_traces):
    source = Path(embedded.__file__).read_text()
    called = set(re.findall(r'_crash_point\("([^"]+)"\)', source))
    assert called == CRASH_STEPS
    exercised = {step for trace in [*traces.values(), *recovery_traces.values()] for step in trace}
    assert exercised == CRASH_STEPS, f"never reached: {sorted(CRASH_STEPS - exercised)}"


def test_crash_hook_refuses_unknown_steps(tmp_path):
    child = run_child(tmp_path, [], "no.such.step:1")
    assert child.returncode != 0 and "InvalidInputError" in child.stderr
    assert run_child(tmp_path, [], "*:0").returncode != 0
