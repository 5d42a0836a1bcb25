"""Helpers of the embedded metadata store's kill -9 tests: a model, checks, and child processes.

The model computes the nodes an op sequence leaves without any store; `snapshot` reads a store's
nodes through its interface; `assert_clean` reads its files. Children run
tests.cluster.meta_crash_child, killed at a crash point (TALLY_META_CRASH_AT); the parent waits
for each to exit, so nothing depends on timing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from tally.meta.embedded import JOURNAL_FILE, NODE_FILE, SCRATCH_DIR, EmbeddedStore
from tally.meta.store import CrashPoints
from tests.cluster.meta_crash_child import run_op

ROOT = Path(__file__).resolve().parents[2]
Model = dict[str, tuple[dict, int]]  # path -> (value, version)


# --- the model, the store's nodes, and its files ----------------------------------------------


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def model_apply(state: Model, op: list) -> Model:
    """The nodes after `op` (a meta_crash_child op), computed without any store."""
    state = dict(state)

    def put(path, value, version):
        for parent in _parents(path):
            state.setdefault(parent, ({}, 0))
        state[path] = (value, version)

    def remove(path):
        for p in [p for p in state if p == path or p.startswith(path + "/")]:
            del state[p]

    kind = op[0]
    if kind == "create":
        if len(op) > 3 and op[3]:  # ephemeral: only its missing parents persist
            for parent in _parents(op[1]):
                state.setdefault(parent, ({}, 0))
        else:
            put(op[1], op[2], 0)
    elif kind == "set":
        put(op[1], op[2], state[op[1]][1] + 1)
    elif kind == "delete":
        remove(op[1])
    else:
        for sub in op[1]:
            if sub[0] == "create":
                put(sub[1], sub[2], 0)
            elif sub[0] == "set":
                put(sub[1], sub[2], state[sub[1]][1] + 1)
            elif sub[0] == "delete":
                remove(sub[1])
    return state


def snapshot(store: EmbeddedStore, path: str = "/") -> Model:
    """Every node reachable from `path` through children(), with its value and version."""
    nodes = {}
    for name in store.children(path):
        child = path.rstrip("/") + "/" + name
        node = store.get(child)
        nodes[child] = (node.value, node.version)
        nodes.update(snapshot(store, child))
    return nodes


def assert_clean(root: Path) -> None:
    """Nothing a crash left: no journal, an empty scratch, and only node files in node dirs."""
    assert not (root / JOURNAL_FILE).exists()
    assert os.listdir(root / SCRATCH_DIR) == []
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames.remove(SCRATCH_DIR)
            assert set(filenames) == {".lock"}, filenames
        else:
            assert filenames == [NODE_FILE], (dirpath, filenames)


def op_paths(op: list) -> list[str]:
    return [sub[1] for sub in op[1]] if op[0] == "txn" else [op[1]]


def recreate_and_delete(store: EmbeddedStore, paths: list[str]) -> None:
    """Delete, re-create and delete again every node an operation touched."""
    for path in dict.fromkeys(paths):
        store.delete(path, recursive=True)
        assert store.create(path, {"again": 1}).version == 0
        assert store.delete(path) and store.get(path) is None


def check_all(check, runs: list[tuple]) -> None:
    """Run `check(spec, root)` for every crashed store; in threads, as it mostly waits on fsync."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for _ in pool.map(lambda run: check(run[0], run[1]), runs):
            pass


# --- child processes ---------------------------------------------------------------------------


@dataclasses.dataclass
class Child:
    """What a meta_crash_child printed, and how it ended."""

    returncode: int
    opened: int | None  # crash points passed while opening; None: killed before it opened
    done: int           # ops finished
    trace: list[str] | None
    stderr: str


def spawn(root: Path, ops: list, crash_at: str) -> subprocess.Popen:
    env = dict(os.environ, **{CrashPoints.ENV: crash_at},
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.Popen(
        [sys.executable, "-S", "-m", "tests.cluster.meta_crash_child", str(root), json.dumps(ops)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def finish(proc: subprocess.Popen) -> Child:
    out, err = proc.communicate(timeout=120)  # waits for the exit; the timeout only guards a hang
    child = Child(proc.returncode, None, 0, None, err)
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word == "opened":
            child.opened = int(rest)
        elif word == "done":
            child.done += 1
        elif word == "trace":
            child.trace = json.loads(rest)
    return child


def run_child(root: Path, ops: list, crash_at: str = "trace") -> Child:
    return finish(spawn(root, ops, crash_at))


def crash_specs(trace: list[str]) -> list[str]:
    """TALLY_META_CRASH_AT values for every point of `trace`: "<step>:<n-th time>"."""
    return [f"{step}:{trace[: i + 1].count(step)}" for i, step in enumerate(trace)]


def crash_everywhere(template: Path, work: Path, ops: list, trace: list[str]) -> list[tuple]:
    """Copy `template` once per point of `trace`, run `ops` there killed at that point."""
    runs = []
    for i, spec in enumerate(crash_specs(trace)):
        root = work / f"crash-{i}"
        shutil.copytree(template, root)
        runs.append((spec, root, spawn(root, ops, spec)))
    results = []
    for spec, root, proc in runs:
        child = finish(proc)
        assert child.returncode == -signal.SIGKILL, (spec, child)
        results.append((spec, root, child))
    return results


def make_store(root: Path, setup: list) -> Model:
    with EmbeddedStore(str(root)) as store:
        for op in setup:
            run_op(store, op)
        return snapshot(store)
