"""The metadata store interface: a small tree of versioned JSON documents.

The coordinator keeps everything it must not forget (databases, tables, partitions, bucket
assignments, id counters; later column locks and commits) in one of two stores with exactly these
semantics, so one code path and one test suite serve both:

- `ZooKeeperStore` (tally.meta.zookeeper) when a ZooKeeper ensemble is given;
- `EmbeddedStore` (tally.meta.embedded), atomic fsynced files in the coordinator's data directory.

The model is ZooKeeper's, reduced to what Tally needs: nodes addressed by '/'-separated paths,
each holding a JSON object and a version that grows by one on every `set`. `set(..., version=v)`
is a compare-and-set, which is how two coordinators' (or two lock acquirers') writes can never
both win. Ephemeral nodes vanish with the session that made them (tablet server liveness).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import os
import signal
import urllib.parse
from typing import Any, Callable, TypeVar

from tally.errors import AlreadyExistsError, InvalidInputError, NotFoundError, VersionConflictError

ChildrenCallback = Callable[[list[str]], None]
T = TypeVar("T")
# What a write raises when another writer got in between its reads and it: read again and retry.
_RACES = (VersionConflictError, AlreadyExistsError, NotFoundError)


@dataclasses.dataclass(frozen=True)
class Node:
    """One stored document and the version to pass back for a compare-and-set."""

    value: dict[str, Any]
    version: int


# Both stores refuse the same names: the embedded store keeps a node as a directory named after
# it, and file systems refuse names over 255 bytes (NAME_MAX), where ZooKeeper would take far
# longer ones, so every node name is held to that on both.
MAX_NODE_NAME_BYTES = 255


def split_path(path: str) -> list[str]:
    """The components of an absolute node path; rejects names a store could not hold."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidInputError(f"metadata path must start with '/': {path!r}")
    parts = [p for p in path.split("/") if p != ""]
    for part in parts:
        if part in (".", "..") or part.startswith(".") or "\x00" in part:
            raise InvalidInputError(f"metadata path component {part!r} is not allowed in {path!r}")
        if len(part.encode()) > MAX_NODE_NAME_BYTES:
            raise InvalidInputError(f"metadata path component {part[:60]!r}... is longer than "
                                    f"{MAX_NODE_NAME_BYTES} bytes")
    return parts


def join_path(*parts: str) -> str:
    """An absolute node path from components (each already a valid node name)."""
    return "/" + "/".join(p.strip("/") for p in parts if p.strip("/"))


def node_name(text: str, kind: str = "name") -> str:
    """A node name for arbitrary user text (database, table, partition names, owner ids),
    reversibly quoted; InvalidInputError naming `kind` and the text when the quoted name passes
    MAX_NODE_NAME_BYTES (letters, digits and '-_.~' take one byte, every other UTF-8 byte
    three, plus two for the prefix)."""
    if not isinstance(text, str):
        raise InvalidInputError(f"a {kind} must be text, not {type(text).__name__}")
    name = "n-" + urllib.parse.quote(text, safe="")
    if len(name) > MAX_NODE_NAME_BYTES:
        raise InvalidInputError(
            f"the {kind} {text[:80]!r}{'...' if len(text) > 80 else ''} is too long: "
            f"{len(name) - 2} bytes once quoted for the metadata store, over the limit of "
            f"{MAX_NODE_NAME_BYTES - 2} (letters, digits and '-_.~' count one byte, every other "
            "UTF-8 byte three)")
    return name


def text_of(name: str) -> str:
    """The user text a `node_name` was made from."""
    if not name.startswith("n-"):
        raise InvalidInputError(f"not a quoted node name: {name!r}")
    return urllib.parse.unquote(name[2:])


class CrashPoints:
    """A test hook: kill this process at a named point of a store's work, to test crash safety.

    A store calls its `CrashPoints` between any two file operations. With the environment
    variable TALLY_META_CRASH_AT="<step>:<n>" (read once, when the store module is imported),
    the n-th call with <step> ("*": with any step) sends SIGKILL to this process: no cleanup
    runs, as with kill -9. "trace" only records the steps passed (`trace()`). Unset, a call
    costs one comparison.
    """

    ENV = "TALLY_META_CRASH_AT"

    def __init__(self, steps: frozenset[str]) -> None:
        self.steps = steps
        self._at: tuple[str, int] | None = None
        self._hits: collections.Counter[str] = collections.Counter()
        self._trace: list[str] = []
        text = os.environ.get(self.ENV)
        if text == "trace":
            self._at = ("trace", 0)
        elif text:
            step, _, n = text.rpartition(":")
            if (step != "*" and step not in steps) or not n.isdigit() or int(n) < 1:
                raise InvalidInputError(f"{self.ENV}={text!r}: expected trace or <step>:<n>, "
                                        f"n >= 1, <step> '*' or one of {sorted(steps)}")
            self._at = (step, int(n))

    def __call__(self, step: str) -> None:
        if self._at is None:
            return
        if step not in self.steps:
            raise InvalidInputError(f"crash point {step!r} is not among the store's steps")
        self._trace.append(step)
        self._hits.update((step, "*"))
        if self._at[0] in (step, "*") and self._hits[self._at[0]] == self._at[1]:
            os.kill(os.getpid(), signal.SIGKILL)

    def trace(self) -> list[str]:
        """The steps this process passed, in order (recorded only while the hook is on)."""
        return list(self._trace)


class MetadataStore(abc.ABC):
    """A tree of versioned JSON documents (see the module docstring for the contract)."""

    @abc.abstractmethod
    def get(self, path: str) -> Node | None:
        """The node at `path`, or None when it does not exist."""

    @abc.abstractmethod
    def create(self, path: str, value: dict, *, ephemeral: bool = False) -> Node:
        """Create a node (and any missing parents, as empty persistent nodes).

        Raises AlreadyExistsError when the node exists: creation is how a store arbitrates
        between racing creators, so exactly one wins.
        """

    @abc.abstractmethod
    def set(self, path: str, value: dict, *, version: int | None = None) -> Node:
        """Replace a node's value; with `version`, only if the node is still at that version.

        Raises NotFoundError when the node is missing, VersionConflictError when it moved on.
        """

    @abc.abstractmethod
    def delete(self, path: str, *, version: int | None = None, recursive: bool = False) -> bool:
        """Delete a node (with its subtree when `recursive`); False when it did not exist."""

    @abc.abstractmethod
    def children(self, path: str) -> list[str]:
        """The sorted names of a node's children; [] when the node does not exist."""

    @abc.abstractmethod
    def watch_children(self, path: str, callback: ChildrenCallback) -> None:
        """Call `callback(children)` now and after every change of the children of `path`.

        Callbacks run on a store-owned thread and must not block for long.
        """

    @abc.abstractmethod
    def transaction(self, ops: list[tuple]) -> None:
        """Apply several changes atomically: all of them, or none.

        Each op is ("check", path, version), ("create", path, value), ("set", path, value,
        version) or ("delete", path, version); a version of None skips that check. Parents of
        created nodes are made as needed. Raises VersionConflictError, AlreadyExistsError or
        NotFoundError for the first op that does not hold, and then nothing was applied. This
        is how column locks keep one node per lock and still let only one acquirer win.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the store; this session's ephemeral nodes disappear."""

    @property
    @abc.abstractmethod
    def kind(self) -> str:
        """'zookeeper' or 'embedded' (for describe and docs)."""

    # --- helpers shared by both stores --------------------------------------------------------

    def ensure(self, path: str, value: dict | None = None) -> Node:
        """The node at `path`, created with `value` (default {}) when missing."""
        node = self.get(path)
        if node is not None:
            return node
        try:
            return self.create(path, value or {})
        except AlreadyExistsError:
            found = self.get(path)
            if found is None:  # created and deleted in between: a caller bug worth seeing
                raise NotFoundError(f"metadata node {path} vanished while being ensured")
            return found

    def transact(self, attempt: Callable[[], tuple[list[tuple], T]], *, what: str,
                 doing: str | None = None, attempts: int = 100) -> T:
        """Compare-and-set over any number of nodes: apply the ops `attempt()` builds from
        fresh reads, all or none, and read again whenever another writer got in between.

        `attempt()` returns (ops, result): ops in `transaction`'s form, carrying the versions
        it read, and what to return once they are applied (no ops: nothing to write, returned
        at once). A version check that failed, a node to create that appeared or a node to
        change that vanished (VersionConflictError, AlreadyExistsError, NotFoundError, from the
        write or from `attempt` itself) runs `attempt` again; any other error ends the loop.
        After `attempts` lost races: VersionConflictError saying that `what` kept changing
        (and, with `doing`, what could not be done).

        A single create or set goes through `create` or `set`: each is atomic on its own, so
        it needs no transaction (nor, in the embedded store, its journal), and `set` keeps an
        ephemeral node ephemeral. Anything else is one `transaction`.
        """
        for _ in range(attempts):
            try:
                ops, result = attempt()
                if len(ops) == 1 and ops[0][0] == "create":
                    self.create(ops[0][1], ops[0][2])
                elif len(ops) == 1 and ops[0][0] == "set":
                    self.set(ops[0][1], ops[0][2], version=ops[0][3])
                elif ops:
                    self.transaction(ops)
            except _RACES:
                continue
            return result
        message = f"{what} kept changing during {attempts} attempts; try again"
        raise VersionConflictError(f"Could not {doing}: {message}" if doing else message)

    def update(self, path: str, change: Callable[[dict], dict], *, create: dict | None = None,
               attempts: int = 100) -> Node:
        """Read-modify-write `path` with compare-and-set, retrying when another writer won.

        `change` receives a copy of the current value and returns the new one; with `create`,
        a missing node is created from `change(create)`, else NotFoundError.
        """
        def attempt() -> tuple[list[tuple], Node | None]:
            node = self.get(path)
            if node is None:
                if create is None:
                    return [], None
                value = change(dict(create))
                return [("create", path, value)], Node(dict(value), 0)
            value = change(dict(node.value))
            return [("set", path, value, node.version)], Node(dict(value), node.version + 1)

        updated = self.transact(attempt, what=f"metadata node {path}", attempts=attempts)
        if updated is None:
            raise NotFoundError(f"metadata node {path} does not exist")
        return updated

    def next_id(self, counter: str) -> int:
        """A fresh integer from a persistent counter at /ids/<counter> (never reused)."""
        node = self.update(join_path("ids", counter),
                           lambda v: {"next": int(v["next"]) + 1}, create={"next": 1})
        return int(node.value["next"]) - 1

    def __enter__(self) -> "MetadataStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
