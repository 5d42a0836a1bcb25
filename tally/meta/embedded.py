"""The embedded metadata store: one fsynced JSON file per node under the data directory.

Why files and not one big document: every write touches one small file. Node `/a/b` lives in
directory `<root>/a/b/` as `.node.json`; its children are the subdirectories.

Crash safety (kill -9, power loss): every change reaches the tree in one rename, so a crash at
any point leaves the old state or the new one. A set writes the file in `.scratch/` and renames
it over the old one; a create builds the node (and missing parents, as {}) in `.scratch/` and
renames it into place; a delete renames the subtree into `.scratch/` under a fresh name, then
removes it; a transaction journals its changes in `.txn.json`, applies them, removes the journal.
Opening replays a journal from its start (each change sets or removes a whole node, so a replay
ends where one run does) and empties `.scratch/`, so no crash leaves anything in a later change's
way.

Only one process may own a store: an exclusive `fcntl` lock on `<root>/.lock` guarantees it, so
in a cluster without ZooKeeper the coordinator is the single writer and tablet servers reach the
metadata through it. Ephemeral nodes live in memory and vanish on `close()` (or when the process
dies), which matches ZooKeeper's session semantics for a single-process store.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading

from tally.errors import AlreadyExistsError, NotFoundError, StorageError, VersionConflictError
from tally.fsync import fsync_dir
from tally.meta.store import (ChildrenCallback, CrashPoints, MetadataStore, Node, join_path,
                              split_path)

NODE_FILE = ".node.json"
JOURNAL_FILE = ".txn.json"
SCRATCH_DIR = ".scratch"

# Crash points, a test hook (see `CrashPoints`): TALLY_META_CRASH_AT="<step>:<n>" kills this
# process with SIGKILL the n-th time it reaches <step>. Every step of this store is listed here.
CRASH_STEPS = frozenset({
    "file.written",     # a temporary file is complete in .scratch, not yet renamed into place
    "file.renamed",     # ... renamed into place, its directory not yet fsynced
    "create.staged",    # one more node of a new subtree is complete in .scratch
    "create.renamed",   # the new subtree is renamed into place
    "delete.renamed",   # a node's directory is renamed into .scratch, not yet removed
    "tree.removed",     # one file or directory of a doomed subtree is removed
    "journal.applied",  # every change of a transaction is applied, the journal still there
    "journal.removed",  # ... the journal removed, the root not yet fsynced
})
_crash_point = CrashPoints(CRASH_STEPS)


# --- file primitives -----------------------------------------------------------------------------


def _write_new(path: str, payload: bytes) -> None:
    with open(path, "xb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())


def _node_payload(node: Node) -> bytes:
    return json.dumps({"version": node.version, "value": node.value}, sort_keys=True).encode()


def _remove_tree(path: str) -> None:
    """Remove a file or a directory tree, one entry at a time (each a crash point)."""
    if not os.path.isdir(path) or os.path.islink(path):
        os.unlink(path)
        _crash_point("tree.removed")
        return
    for name in os.listdir(path):
        _remove_tree(os.path.join(path, name))
    os.rmdir(path)
    _crash_point("tree.removed")


class EmbeddedStore(MetadataStore):
    """A `MetadataStore` in a local directory, owned by exactly one process."""

    def __init__(self, root: str) -> None:
        self._root = os.path.abspath(root)
        os.makedirs(self._root, exist_ok=True)
        self._lock_file = open(os.path.join(self._root, ".lock"), "a+")
        try:
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise StorageError(f"metadata directory {self._root} is in use by another process")
        self._scratch = os.path.join(self._root, SCRATCH_DIR)
        self._journal = os.path.join(self._root, JOURNAL_FILE)
        self._mutex = threading.RLock()
        self._ephemeral: dict[str, Node] = {}
        self._watches: dict[str, list[ChildrenCallback]] = {}
        self._closed = False
        self._failed: str | None = None
        try:
            self._recover()
        except BaseException:
            self.close()
            raise

    @property
    def kind(self) -> str:
        return "embedded"

    # --- recovery: whatever a crash left, the store opens and every operation works ------------

    def _recover(self) -> None:
        os.makedirs(self._scratch, exist_ok=True)
        for entry in os.listdir(self._scratch):
            _remove_tree(os.path.join(self._scratch, entry))
        if os.path.exists(self._journal):
            try:
                with open(self._journal, "rb") as f:
                    changes = json.loads(f.read())
            except (OSError, ValueError) as e:
                raise StorageError(f"metadata journal {self._journal} is unreadable: {e}") from e
            self._apply_journal(changes)

    # --- paths and single-rename changes ---------------------------------------------------------

    def _dir(self, path: str) -> str:
        return os.path.join(self._root, *split_path(path))

    def _scratch_name(self) -> str:
        return os.path.join(self._scratch, os.urandom(12).hex())

    def _read(self, path: str) -> Node | None:
        if path in self._ephemeral:
            return self._ephemeral[path]
        file = os.path.join(self._dir(path), NODE_FILE)
        try:
            with open(file, "rb") as f:
                doc = json.loads(f.read())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise StorageError(f"metadata node {path} is unreadable ({file}): {e}") from e
        return Node(doc["value"], int(doc["version"]))

    def _write_file(self, target: str, payload: bytes) -> None:
        """Replace `target` with `payload`: a crash leaves the old or the new file, whole."""
        tmp = self._scratch_name()
        _write_new(tmp, payload)
        _crash_point("file.written")
        os.replace(tmp, target)
        _crash_point("file.renamed")
        fsync_dir(os.path.dirname(target))

    def _put(self, path: str, node: Node) -> None:
        """Write a persistent node, creating it and its missing parents (as {}) in one rename."""
        parts = split_path(path)
        if os.path.exists(os.path.join(self._dir(path), NODE_FILE)):
            self._write_file(os.path.join(self._dir(path), NODE_FILE), _node_payload(node))
            return
        top = 0  # the highest missing node: it and all below it are built in scratch
        while top < len(parts) - 1 and os.path.exists(
                os.path.join(self._root, *parts[: top + 1], NODE_FILE)):
            top += 1
        staged = directory = self._scratch_name()
        for i in range(top, len(parts)):
            if i > top:
                directory = os.path.join(directory, parts[i])
            os.mkdir(directory)
            _write_new(os.path.join(directory, NODE_FILE),
                       _node_payload(node if i == len(parts) - 1 else Node({}, 0)))
            fsync_dir(directory)
            fsync_dir(os.path.dirname(directory))
            _crash_point("create.staged")
        target = os.path.join(self._root, *parts[: top + 1])
        try:
            os.rename(staged, target)  # absent: the tree never keeps a directory without a node
        except OSError as e:
            raise StorageError(f"metadata node {path}: cannot place {target}: {e}") from e
        _crash_point("create.renamed")
        fsync_dir(os.path.dirname(target))

    def _remove(self, path: str) -> None:
        """Delete a persistent node and its subtree: gone with one rename, then cleaned up."""
        directory = self._dir(path)
        if not os.path.isdir(directory):
            return
        doomed = self._scratch_name()
        os.rename(directory, doomed)
        _crash_point("delete.renamed")
        fsync_dir(os.path.dirname(directory))
        _remove_tree(doomed)

    def _parent(self, path: str) -> str:
        return join_path(*split_path(path)[:-1])

    def _check_parent(self, path: str) -> None:
        if self._parent(path) in self._ephemeral:
            raise StorageError(f"metadata node {path}: an ephemeral node cannot have children")

    # --- the interface --------------------------------------------------------------------------

    def get(self, path: str) -> Node | None:
        with self._mutex:
            self._check_open()
            return self._read(path)

    def create(self, path: str, value: dict, *, ephemeral: bool = False) -> Node:
        with self._mutex:
            self._check_open()
            if not split_path(path):
                raise AlreadyExistsError("the root node always exists")
            if self._read(path) is not None:
                raise AlreadyExistsError(f"metadata node {path} already exists")
            self._check_parent(path)
            node = Node(dict(value), 0)
            parent = self._parent(path)
            if not ephemeral:
                self._put(path, node)
            else:
                if parent != "/" and self._read(parent) is None:
                    self._put(parent, Node({}, 0))
                self._ephemeral[path] = node
        self._fire(parent)
        return node

    def set(self, path: str, value: dict, *, version: int | None = None) -> Node:
        with self._mutex:
            self._check_open()
            current = self._read(path)
            if current is None:
                raise NotFoundError(f"metadata node {path} does not exist")
            if version is not None and current.version != version:
                raise VersionConflictError(
                    f"metadata node {path} is at version {current.version}, not {version}")
            node = Node(dict(value), current.version + 1)
            if path in self._ephemeral:
                self._ephemeral[path] = node
            else:
                self._put(path, node)
            return node

    def delete(self, path: str, *, version: int | None = None, recursive: bool = False) -> bool:
        with self._mutex:
            self._check_open()
            current = self._read(path)
            if current is None:
                return False
            if version is not None and current.version != version:
                raise VersionConflictError(
                    f"metadata node {path} is at version {current.version}, not {version}")
            if self._children(path) and not recursive:
                raise StorageError(f"metadata node {path} has children; delete them first")
            for eph in [p for p in self._ephemeral if p == path or p.startswith(path + "/")]:
                del self._ephemeral[eph]
            self._remove(path)
        self._fire(self._parent(path))
        return True

    def _children(self, path: str) -> list[str]:
        names = set()
        directory = self._dir(path)
        if os.path.isdir(directory):
            for entry in os.listdir(directory):
                if not entry.startswith(".") and \
                        os.path.exists(os.path.join(directory, entry, NODE_FILE)):
                    names.add(entry)
        prefix = path.rstrip("/") + "/"
        for eph in self._ephemeral:
            if eph.startswith(prefix) and "/" not in eph[len(prefix):]:
                names.add(eph[len(prefix):])
        return sorted(names)

    def children(self, path: str) -> list[str]:
        with self._mutex:
            self._check_open()
            return self._children(path)

    def watch_children(self, path: str, callback: ChildrenCallback) -> None:
        key = join_path(*split_path(path))
        with self._mutex:
            self._watches.setdefault(key, []).append(callback)
        callback(self.children(key))

    def _fire(self, parent: str) -> None:
        key = join_path(*split_path(parent)) if parent != "/" else "/"
        callbacks = list(self._watches.get(key, ()))
        if callbacks:
            names = self.children(key)
            for callback in callbacks:
                callback(names)

    # --- transactions: validated in memory, journaled, then applied ------------------------------

    def transaction(self, ops: list[tuple]) -> None:
        touched = set()
        with self._mutex:
            self._check_open()
            view: dict[str, Node | None] = {}

            def current(path):
                return view[path] if path in view else self._read(path)

            changes = []
            for op in ops:
                kind, path = op[0], op[1]
                node = current(path)
                if kind == "create":
                    if node is not None or not split_path(path):
                        raise AlreadyExistsError(f"metadata node {path} already exists")
                    self._check_parent(path)
                    parts = split_path(path)
                    for parent in (join_path(*parts[:i]) for i in range(1, len(parts))):
                        if current(parent) is None:  # `_put` makes missing parents as {}
                            view[parent] = Node({}, 0)
                    view[path] = Node(dict(op[2]), 0)
                    changes.append(["put", path, dict(op[2]), 0])
                    touched.add(self._parent(path))
                    continue
                if node is None:
                    raise NotFoundError(f"metadata node {path} does not exist")
                version = op[3] if kind == "set" else op[2]
                if version is not None and node.version != version:
                    raise VersionConflictError(
                        f"metadata node {path} is at version {node.version}, not {version}")
                if kind == "set":
                    view[path] = Node(dict(op[2]), node.version + 1)
                    changes.append(["put", path, dict(op[2]), node.version + 1])
                elif kind == "delete":
                    view[path] = None
                    changes.append(["delete", path])
                    touched.add(self._parent(path))
                elif kind != "check":
                    raise StorageError(f"unknown metadata transaction op {kind!r}")
            if changes:
                try:  # committed once the journal is in place: replayed on open if need be
                    self._write_file(self._journal, json.dumps(changes).encode())
                    self._apply_journal(changes)
                except OSError as e:
                    if os.path.exists(self._journal):  # committed: the next open finishes it
                        self._failed = f"a committed transaction is half applied ({e}); reopen it"
                    raise StorageError(f"metadata transaction failed: {e}") from e
        for parent in touched:
            self._fire(parent)

    def _apply_journal(self, changes: list) -> None:
        """Apply journaled changes, then drop the journal; each change sets or removes a whole
        node, so a replay after a crash at any point ends where one uninterrupted run does."""
        for change in changes:
            if change[0] == "put":
                self._put(change[1], Node(change[2], change[3]))
            else:
                self._remove(change[1])
        _crash_point("journal.applied")
        os.remove(self._journal)
        _crash_point("journal.removed")
        fsync_dir(self._root)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the metadata store is closed")
        if self._failed:
            raise StorageError(f"metadata store: {self._failed}")

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._ephemeral.clear()
            self._watches.clear()
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
