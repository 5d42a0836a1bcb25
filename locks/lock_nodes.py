"""Where the lock service keeps a table's locks in the metadata store, and how they are read.

    /locks/<table_id>                 the guard: {"next_token", "column_tokens"}; its node
                                      version counts every change of the table's locks
    /locks/<table_id>/<owner>         one lock (a LockRecord)
"""

from __future__ import annotations

from locks.lease import LockRecord
from tally.meta import MetadataStore, join_path, node_name


def guard_path(table_id: int) -> str:
    return join_path("locks", str(table_id))


def lock_path(table_id: int, owner_id: str) -> str:
    return join_path("locks", str(table_id), node_name(owner_id, "lock owner id"))


def stored_locks(store: MetadataStore, table_id: int) -> dict[str, tuple[LockRecord, int]]:
    """{owner node name: (record, node version)} of every stored lock of a table."""
    found = {}
    for child in store.children(guard_path(table_id)):
        node = store.get(join_path("locks", str(table_id), child))
        if node is not None:
            found[child] = (LockRecord.from_json(node.value), node.version)
    return found


def column_tokens(guard) -> dict[int, int]:
    """The newest token per column id a guard node records."""
    return {int(k): int(v) for k, v in guard.value.get("column_tokens", {}).items()}


def view_state(store: MetadataStore, table_id: int, tries: int = 5
               ) -> tuple[int, list[LockRecord], dict[int, int]]:
    """(version, records, column tokens) of a table's locks, read as one state: the guard,
    then the lock nodes, then the guard again, until the guard did not move in between (every
    change bumps it, so nothing changed meanwhile). If it keeps moving, the last read is used
    with its first guard's version: its contents are then at least as new as that version
    (they were read after it), which is all a tablet server relies on."""
    for _ in range(tries):
        first = store.get(guard_path(table_id))
        records = [r for r, _ in stored_locks(store, table_id).values()]
        again = store.get(guard_path(table_id))
        if (first is None) == (again is None) and \
                (first is None or first.version == again.version):
            break
    version = 0 if first is None else first.version + 1  # a guard not yet made: 0
    return version, records, {} if again is None else column_tokens(again)
