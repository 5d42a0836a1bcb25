"""The ZooKeeper metadata store, through kazoo.

`ZooKeeperStore("host:port[,host:port...][/chroot]")` keeps every node under the chroot
(default `/tally`) so several clusters (or test runs) can share one ensemble. Values are JSON;
versions are ZooKeeper's own `stat.version`, so `set(..., version=v)` is ZooKeeper's native
compare-and-set and ephemeral nodes are ZooKeeper's, tied to this client's session.

Reads and idempotent writes go through kazoo's retry (connection loss while ZooKeeper restarts
is ridden out); a store that cannot reach ZooKeeper within `timeout` raises UnavailableError.
"""

from __future__ import annotations

import json
import logging
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import (BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError,
                              NotEmptyError, OperationTimeoutError, RolledBackError,
                              SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry, RetryFailedError

from tally.errors import (AlreadyExistsError, InvalidInputError, NotFoundError, StorageError,
                          UnavailableError, VersionConflictError)
from tally.meta.store import ChildrenCallback, MetadataStore, Node, join_path, split_path

log = logging.getLogger(__name__)

DEFAULT_CHROOT = "/tally"
# ZooKeeper closes the connection on a request over its packet limit (jute.maxbuffer, 1 MB by
# default), and kazoo then retries it until the caller gives up: a request that large must be
# refused before it is sent. Paths are user names (quoted); values are JSON documents.
MAX_PATH_BYTES = 16 << 10
MAX_VALUE_BYTES = 512 << 10


def parse_connect_string(connect: str) -> tuple[str, str]:
    """('host:port,...', '/chroot') from 'host:port,...[/chroot]' (chroot defaults to /tally)."""
    hosts, slash, chroot = connect.partition("/")
    if not hosts:
        raise StorageError(f"ZooKeeper connect string has no hosts: {connect!r}")
    chroot = "/" + chroot.strip("/") if slash and chroot.strip("/") else DEFAULT_CHROOT
    split_path(chroot)
    return hosts, chroot


class ZooKeeperStore(MetadataStore):
    """A `MetadataStore` in ZooKeeper under a chroot."""

    def __init__(self, connect: str, *, timeout: float = 15.0, session_timeout: float = 6.0,
                 retry_deadline: float | None = None):
        """`timeout` bounds connecting; `retry_deadline` (default: `timeout`) how long one
        operation is retried across connection losses before it fails as unavailable."""
        hosts, self._chroot = parse_connect_string(connect)
        retry = dict(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0,
                     deadline=timeout if retry_deadline is None else retry_deadline)
        self._client = KazooClient(hosts=hosts, timeout=session_timeout,
                                   connection_retry=dict(max_tries=-1, delay=0.05, max_delay=1.0),
                                   command_retry=retry)
        self._retry = KazooRetry(**retry, ignore_expire=True)
        self._watches: list[object] = []
        self._lock = threading.Lock()
        try:
            self._client.start(timeout=timeout)
        except KazooTimeoutError as e:
            self._client.close()
            raise UnavailableError(f"cannot reach ZooKeeper at {hosts} within {timeout}s") from e
        self._call(self._client.ensure_path, self._chroot)

    @property
    def kind(self) -> str:
        return "zookeeper"

    @property
    def kazoo(self) -> KazooClient:
        """The underlying kazoo client, for recipes that need it (session state listeners)."""
        return self._client

    def _abs(self, path: str) -> str:
        full = join_path(self._chroot, *split_path(path))
        if len(full.encode()) > MAX_PATH_BYTES:
            raise InvalidInputError(f"metadata path too long ({len(full.encode()):,} bytes, at "
                                    f"most {MAX_PATH_BYTES:,}): {full[:80]}...")
        return full

    @staticmethod
    def _payload(path: str, value: dict) -> bytes:
        data = json.dumps(value, sort_keys=True).encode()
        if len(data) > MAX_VALUE_BYTES:
            raise InvalidInputError(f"metadata value too large for {path[:80]} ({len(data):,} "
                                    f"bytes, at most {MAX_VALUE_BYTES:,})")
        return data

    def _call(self, fn, *args, retry: bool = True, **kwargs):
        try:
            if retry:
                return self._retry(fn, *args, **kwargs)
            return fn(*args, **kwargs)
        except (ConnectionLoss, SessionExpiredError, KazooTimeoutError,
                OperationTimeoutError) as e:
            raise UnavailableError(f"ZooKeeper unavailable: {type(e).__name__}") from e
        except RetryFailedError as e:  # an outage longer than the retry deadline: still transient
            raise UnavailableError(f"ZooKeeper unavailable for {self._retry.deadline:g}s "
                                   f"({e})") from e

    @staticmethod
    def _decode(path: str, data: bytes, stat) -> Node:
        try:
            value = json.loads(data.decode()) if data else {}
        except ValueError as e:
            raise StorageError(f"metadata node {path} does not hold JSON: {e}") from e
        return Node(value, stat.version)

    def get(self, path: str) -> Node | None:
        try:
            data, stat = self._call(self._client.get, self._abs(path))
        except NoNodeError:
            return None
        return self._decode(path, data, stat)

    def create(self, path: str, value: dict, *, ephemeral: bool = False) -> Node:
        if not split_path(path):
            raise AlreadyExistsError("the root node always exists")
        payload = self._payload(path, value)
        try:
            # No automatic retry: after a connection loss the create may have landed, and a
            # retried create would then report "exists" for our own node. Callers decide.
            self._call(self._client.create, self._abs(path), payload, ephemeral=ephemeral,
                       makepath=True, retry=False)
        except NodeExistsError:
            raise AlreadyExistsError(f"metadata node {path} already exists") from None
        return Node(dict(value), 0)

    def set(self, path: str, value: dict, *, version: int | None = None) -> Node:
        payload = self._payload(path, value)
        try:
            stat = self._call(self._client.set, self._abs(path), payload,
                              version=-1 if version is None else version,
                              retry=version is None)
        except NoNodeError:
            raise NotFoundError(f"metadata node {path} does not exist") from None
        except BadVersionError:
            raise VersionConflictError(
                f"metadata node {path} is no longer at version {version}") from None
        return Node(dict(value), stat.version)

    def delete(self, path: str, *, version: int | None = None, recursive: bool = False) -> bool:
        try:
            self._call(self._client.delete, self._abs(path),
                       version=-1 if version is None else version, recursive=recursive)
        except NoNodeError:
            return False
        except BadVersionError:
            raise VersionConflictError(
                f"metadata node {path} is no longer at version {version}") from None
        except NotEmptyError:
            raise StorageError(f"metadata node {path} has children; delete them first") from None
        return True

    def children(self, path: str) -> list[str]:
        try:
            return sorted(self._call(self._client.get_children, self._abs(path)))
        except NoNodeError:
            return []

    def watch_children(self, path: str, callback: ChildrenCallback) -> None:
        target = self._abs(path)
        self._call(self._client.ensure_path, target)

        def fire(children):
            try:
                callback(sorted(children))
            except Exception:  # a failing callback must not kill kazoo's watch thread
                log.exception("children watch on %s failed", path)
            return True

        with self._lock:
            self._watches.append(self._client.ChildrenWatch(target, fire))

    def transaction(self, ops: list[tuple]) -> None:
        for op in ops:  # ZooKeeper transactions cannot make parents: make them first
            if op[0] == "create":
                parent = self._abs(op[1]).rsplit("/", 1)[0]
                if parent:
                    self._call(self._client.ensure_path, parent)
        txn = self._client.transaction()
        for op in ops:
            kind, path = op[0], self._abs(op[1])
            if kind == "check":
                txn.check(path, -1 if op[2] is None else op[2])
            elif kind == "create":
                txn.create(path, self._payload(path, op[2]))
            elif kind == "set":
                txn.set_data(path, self._payload(path, op[2]), -1 if op[3] is None else op[3])
            elif kind == "delete":
                txn.delete(path, -1 if op[2] is None else op[2])
            else:
                raise StorageError(f"unknown metadata transaction op {kind!r}")
        # Not retried: after a connection loss the transaction may have been applied.
        results = self._call(txn.commit, retry=False)
        for op, result in zip(ops, results):
            if isinstance(result, NodeExistsError):
                raise AlreadyExistsError(f"metadata node {op[1]} already exists")
            if isinstance(result, NoNodeError):
                raise NotFoundError(f"metadata node {op[1]} does not exist")
            if isinstance(result, BadVersionError):
                raise VersionConflictError(f"metadata node {op[1]} moved on (version check failed)")
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise StorageError(f"metadata transaction failed at {op[1]}: {result!r}")

    def close(self) -> None:
        try:
            self._client.stop()
        finally:
            self._client.close()
