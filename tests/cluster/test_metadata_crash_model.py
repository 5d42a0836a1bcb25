"""Random programs of metadata store ops, killed at a random crash point, against a dict model.

Hypothesis draws a few ops that are valid in the model (creates of missing nodes, sets and
deletes of present ones, transactions mixing all four kinds) and a crash point k; a child runs
the program with TALLY_META_CRASH_AT="*:<k>" and reports each op it finished. If it was killed
inside op i, the reopened store must hold the model's state before op i or after it; the test
then runs the rest of the program in-process and compares the end with the model.
"""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tally.meta.embedded import EmbeddedStore
from tests.cluster.meta_crash import (Model, assert_clean, make_store, model_apply, run_child,
                                      snapshot)
from tests.cluster.meta_crash_child import run_op

PATHS = ["/a", "/a/b", "/a/b/c", "/a/d", "/e", "/e/f"]  # every parent is listed too
VALUES = st.builds(lambda n: {"n": n}, st.integers(0, 9))


def _has_children(state: Model, path: str) -> bool:
    return any(p.startswith(path + "/") for p in state)


@st.composite
def txn_sub_op(draw, state: Model) -> list:
    present, missing = sorted(state), [p for p in PATHS if p not in state]
    leaves = [p for p in present if not _has_children(state, p)]
    kinds = (["create"] if missing else []) + (["set", "check"] if present else []) + \
        (["delete"] if leaves else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "create":
        return ["create", draw(st.sampled_from(missing)), draw(VALUES)]
    path = draw(st.sampled_from(leaves if kind == "delete" else present))
    version = draw(st.sampled_from([None, state[path][1]]))
    return ["set", path, draw(VALUES), version] if kind == "set" else [kind, path, version]


@st.composite
def program(draw) -> list[list]:
    """1-4 ops, each valid in the model's state after the ones before it."""
    state: Model = {}
    ops = []
    for _ in range(draw(st.integers(1, 4))):
        present, missing = sorted(state), [p for p in PATHS if p not in state]
        kinds = (["create"] if missing else []) + (["set", "delete"] if present else []) + ["txn"]
        kind = draw(st.sampled_from(kinds))
        if kind == "create":
            op = ["create", draw(st.sampled_from(missing)), draw(VALUES)]
        elif kind == "set":
            op = ["set", draw(st.sampled_from(present)), draw(VALUES)]
        elif kind == "delete":
            path = draw(st.sampled_from(present))
            op = ["delete", path, _has_children(state, path) or draw(st.booleans())]
        else:
            subs, view = [], state
            for _ in range(draw(st.integers(1, 4))):
                subs.append(draw(txn_sub_op(view)))
                view = model_apply(view, ["txn", [subs[-1]]])
            op = ["txn", subs]
        ops.append(op)
        state = model_apply(state, op)
    return ops


@settings(max_examples=15, deadline=None)
@given(ops=program(), crash_at=st.integers(1, 30))
def test_random_program_killed_at_a_random_point(ops, crash_at):
    states = [{}]
    for op in ops:
        states.append(model_apply(states[-1], op))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_store(root, [])
        child = run_child(root, ops, f"*:{crash_at}")
        assert child.returncode in (0, -signal.SIGKILL), child.stderr
        done = child.done
        with EmbeddedStore(str(root)) as store:
            assert_clean(root)
            state = snapshot(store)
            allowed = states[done:done + 2] if child.returncode else states[-1:]
            assert state in allowed, f"killed at step {crash_at} after {done} ops: {state}"
            for op in ops[states.index(state, done):]:
                run_op(store, op)
            assert snapshot(store) == states[-1]
        with EmbeddedStore(str(root)) as store:
            assert_clean(root)
            assert snapshot(store) == states[-1]
