"""Runs embedded metadata store operations in a child process, for the kill -9 tests.

`python -m tests.cluster.meta_crash_child <store dir> <ops as JSON>` opens the store, runs the
ops and prints `opened <crash points passed while opening>`, then `done <i>` after each op, flushed, so the parent knows which ops
finished before a crash point (TALLY_META_CRASH_AT) killed it; last, `trace <steps as JSON>`.

Ops are JSON lists: ["create", path, value] (with a 4th item true: ephemeral), ["set", path,
value], ["delete", path, recursive], and ["txn", [store transaction ops as lists]].
"""

from __future__ import annotations

import json
import sys

from tally.meta.embedded import EmbeddedStore, _crash_point
from tally.meta.store import MetadataStore


def run_op(store: MetadataStore, op: list) -> None:
    """Apply one op to `store` (the parent runs the same ops to repeat or finish a program)."""
    kind = op[0]
    if kind == "create":
        store.create(op[1], op[2], ephemeral=len(op) > 3 and op[3])
    elif kind == "set":
        store.set(op[1], op[2])
    elif kind == "delete":
        store.delete(op[1], recursive=op[2])
    elif kind == "txn":
        store.transaction([tuple(sub) for sub in op[1]])
    else:
        raise ValueError(f"unknown op {op!r}")


def main() -> None:
    root, ops = sys.argv[1], json.loads(sys.argv[2])
    store = EmbeddedStore(root)
    print("opened", len(_crash_point.trace()), flush=True)
    for i, op in enumerate(ops):
        run_op(store, op)
        print("done", i, flush=True)
    print("trace", json.dumps(_crash_point.trace()), flush=True)
    store.close()


if __name__ == "__main__":
    main()
