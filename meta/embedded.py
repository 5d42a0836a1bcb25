"""The embedded metadata store: one fsynced JSON file per node under the data directory.

Why files and not one big document: every write touches one small file, written to a temporary
name, fsynced, renamed over the old one and the directory fsynced, so a crash (kill -9, power
loss) leaves either the old or the new version of that node and never a torn one. Node `/a/b`
lives in directory `<root>/a/b/` as `.node.json`; its children are the subdirectories.

Only one process may own a store: an exclusive `fcntl` lock on `<root>/.lock` guarantees it, so
in a cluster without ZooKeeper the coordinator is the single writer and tablet servers reach the
metadata through it. Ephemeral nodes live in memory and vanish on `close()` (or when the process
dies), which matches ZooKeeper's session semantics for a single-process store.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading

from meta.store import ChildrenCallback, MetadataStore, Node, join_path, split_path
from tally.errors import AlreadyExistsError, NotFoundError, StorageError, VersionConflictError

NODE_FILE = ".node.json"
JOURNAL_FILE = ".txn.json"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomically(path: str, payload: bytes) -> None:
    """Replace `path` with `payload` so that a crash leaves the old or the new file, whole."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))


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
        self._mutex = threading.RLock()
        self._ephemeral: dict[str, Node] = {}
        self._watches: dict[str, list[ChildrenCallback]] = {}
        self._closed = False
        self._finish_journal()

    @property
    def kind(self) -> str:
        return "embedded"

    # --- paths ----------------------------------------------------------------------------------

    def _dir(self, path: str) -> str:
        return os.path.join(self._root, *split_path(path))

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

    def _write(self, path: str, node: Node) -> None:
        payload = json.dumps({"version": node.version, "value": node.value},
                             sort_keys=True).encode()
        _write_atomically(os.path.join(self._dir(path), NODE_FILE), payload)

    def _make_dirs(self, path: str) -> None:
        """Create the node directories down to `path`, each parent a persistent empty node."""
        current = self._root
        parts = split_path(path)
        for i, part in enumerate(parts):
            current = os.path.join(current, part)
            if not os.path.isdir(current):
                os.mkdir(current)
                _fsync_dir(os.path.dirname(current))
            if i < len(parts) - 1 and not os.path.exists(os.path.join(current, NODE_FILE)):
                self._write(join_path(*parts[: i + 1]), Node({}, 0))

    def _parent(self, path: str) -> str:
        parts = split_path(path)
        return join_path(*parts[:-1])

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
            node = Node(dict(value), 0)
            parent = self._parent(path)
            if parent != "/" and self._read(parent) is None:
                self._make_dirs(parent)
                self._write(parent, Node({}, 0))
            if ephemeral:
                self._ephemeral[path] = node
            else:
                os.makedirs(self._dir(path), exist_ok=True)
                self._write(path, node)
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
                self._write(path, node)
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
            directory = self._dir(path)
            if os.path.isdir(directory):
                # Rename first so a crash mid-delete never leaves a half-deleted live node.
                doomed = directory + ".deleting"
                os.replace(directory, doomed)
                _fsync_dir(os.path.dirname(directory))
                shutil.rmtree(doomed, ignore_errors=True)
        self._fire(self._parent(path))
        return True

    def _children(self, path: str) -> list[str]:
        names = set()
        directory = self._dir(path)
        if os.path.isdir(directory):
            for entry in os.listdir(directory):
                if not entry.startswith(".") and not entry.endswith(".deleting") and \
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
                    if node is not None:
                        raise AlreadyExistsError(f"metadata node {path} already exists")
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
                journal = os.path.join(self._root, JOURNAL_FILE)
                _write_atomically(journal, json.dumps(changes).encode())
                self._apply_journal(changes)
                os.remove(journal)
                _fsync_dir(self._root)
        for parent in touched:
            self._fire(parent)

    def _apply_journal(self, changes: list) -> None:
        """Apply journaled changes; each is idempotent, so a crash mid-way is finished on open."""
        for change in changes:
            if change[0] == "put":
                path = change[1]
                parent = self._parent(path)
                if parent != "/" and self._read(parent) is None:
                    self._make_dirs(parent)
                    self._write(parent, Node({}, 0))
                os.makedirs(self._dir(path), exist_ok=True)
                self._write(path, Node(change[2], change[3]))
            else:
                directory = self._dir(change[1])
                if os.path.isdir(directory):
                    doomed = directory + ".deleting"
                    os.replace(directory, doomed)
                    _fsync_dir(os.path.dirname(directory))
                    shutil.rmtree(doomed, ignore_errors=True)

    def _finish_journal(self) -> None:
        journal = os.path.join(self._root, JOURNAL_FILE)
        if os.path.exists(journal):
            with open(journal, "rb") as f:
                self._apply_journal(json.loads(f.read()))
            os.remove(journal)
            _fsync_dir(self._root)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the metadata store is closed")

    def close(self) -> None:
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._ephemeral.clear()
            self._watches.clear()
            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            self._lock_file.close()
