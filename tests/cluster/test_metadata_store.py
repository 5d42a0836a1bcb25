"""The metadata store contract, run against both stores (embedded files and real ZooKeeper)."""

from __future__ import annotations

import threading

import pytest

from tally.errors import (AlreadyExistsError, InvalidInputError, NotFoundError, StorageError,
                          VersionConflictError)
from tally.meta import node_name, open_store, text_of


@pytest.fixture
def store(metadata_store, tmp_path):
    s = open_store(zookeeper=metadata_store, data_dir=str(tmp_path))
    yield s
    s.close()


def test_create_get_set_with_versions(store):
    assert store.get("/a/b") is None
    node = store.create("/a/b", {"x": 1})
    assert node.version == 0
    assert store.get("/a") is not None  # parents are created
    assert store.get("/a/b").value == {"x": 1}
    assert store.set("/a/b", {"x": 2}, version=0).version == 1
    with pytest.raises(VersionConflictError):
        store.set("/a/b", {"x": 3}, version=0)
    assert store.get("/a/b").value == {"x": 2}
    with pytest.raises(AlreadyExistsError):
        store.create("/a/b", {})
    with pytest.raises(NotFoundError):
        store.set("/a/missing", {})


def test_children_and_recursive_delete(store):
    for name in ["c", "a", "b"]:
        store.create(f"/p/{name}", {"n": name})
    store.create("/p/a/deep", {})
    assert store.children("/p") == ["a", "b", "c"]
    assert store.children("/nope") == []
    with pytest.raises(StorageError):
        store.delete("/p/a")
    assert store.delete("/p/a", recursive=True)
    assert not store.delete("/p/a")
    assert store.children("/p") == ["b", "c"]


def test_compare_and_set_has_one_winner(store):
    store.create("/counter", {"n": 0})
    winners = []

    def bump():
        node = store.get("/counter")
        try:
            store.set("/counter", {"n": node.value["n"] + 1}, version=node.version)
            winners.append(1)
        except VersionConflictError:
            pass

    barrier = threading.Barrier(8)

    def racer():
        barrier.wait()
        bump()

    threads = [threading.Thread(target=racer) for _ in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert store.get("/counter").value["n"] == len(winners) >= 1


def test_update_and_ids_are_unique_under_contention(store):
    ids = []
    lock = threading.Lock()

    def take():
        for _ in range(10):
            i = store.next_id("table")
            with lock:
                ids.append(i)

    threads = [threading.Thread(target=take) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(ids) == list(range(1, 41))


def test_transact_retries_lost_races_over_several_nodes(store):
    """Racing multi-node compare-and-sets: an attempt's ops apply together or not at all, and
    one that read stale versions is retried, so no bump is lost or applied twice."""
    store.create("/pair/a", {"n": 0})
    store.create("/pair/b", {"n": 0})
    seen = []
    lock = threading.Lock()

    def attempt():
        a, b = store.get("/pair/a"), store.get("/pair/b")
        n = a.value["n"] + 1
        return [("set", "/pair/a", {"n": n}, a.version),
                ("set", "/pair/b", {"n": b.value["n"] + 1}, b.version)], n

    def bump():
        for _ in range(10):
            n = store.transact(attempt, what="/pair")
            with lock:
                seen.append(n)

    threads = [threading.Thread(target=bump) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert sorted(seen) == list(range(1, 41))
    assert store.get("/pair/a").value == store.get("/pair/b").value == {"n": 40}


def test_transact_gives_up_and_stops_at_other_errors(store):
    store.create("/t/a", {})
    assert store.transact(lambda: ([], "nothing to write"), what="/t") == "nothing to write"
    calls = []

    def stale():
        calls.append(1)
        return [("check", "/t/a", 7), ("create", "/t/b", {})], None

    with pytest.raises(VersionConflictError,
                       match="Could not add b: /t/a kept changing during 3 attempts"):
        store.transact(stale, what="/t/a", doing="add b", attempts=3)
    assert len(calls) == 3 and store.get("/t/b") is None

    def refused():
        calls.append(1)
        raise InvalidInputError("no")

    with pytest.raises(InvalidInputError):
        store.transact(refused, what="/t/a")
    assert len(calls) == 4
    with pytest.raises(NotFoundError):
        store.update("/t/missing", lambda v: v)
    assert store.update("/t/a", lambda v: {**v, "x": 1}).version == 1
    assert store.update("/t/c", lambda v: {"n": v["n"] + 1}, create={"n": 0}).value == {"n": 1}


def test_ephemeral_nodes_and_child_watches(store, metadata_store, tmp_path):
    seen = []
    event = threading.Event()

    def on_change(children):
        seen.append(children)
        event.set()

    store.watch_children("/servers", on_change)
    event.wait(5)
    store.create("/servers/ts-1", {"address": "x"}, ephemeral=True)
    for _ in range(50):
        if seen and seen[-1] == ["ts-1"]:
            break
        event.clear()
        event.wait(0.1)
    assert seen[-1] == ["ts-1"]
    if metadata_store is not None:
        # A second session's ephemeral node disappears when that session closes.
        other = open_store(zookeeper=metadata_store)
        other.create("/servers/ts-2", {}, ephemeral=True)
        assert store.children("/servers") == ["ts-1", "ts-2"]
        other.close()
        assert store.children("/servers") == ["ts-1"]


def test_embedded_store_survives_reopen_and_is_exclusive(tmp_path):
    s = open_store(data_dir=str(tmp_path))
    s.create("/t/x", {"v": [1, 2]})
    s.create("/t/e", {}, ephemeral=True)
    with pytest.raises(StorageError, match="in use"):
        open_store(data_dir=str(tmp_path))
    s.close()
    s = open_store(data_dir=str(tmp_path))
    assert s.get("/t/x").value == {"v": [1, 2]}
    assert s.get("/t/e") is None
    s.close()


def test_bad_paths_and_names(store):
    with pytest.raises(InvalidInputError):
        store.get("relative")
    with pytest.raises(InvalidInputError):
        store.create("/a/../b", {})
    name = node_name("db/with spaces.and$dollars")
    store.create(f"/names/{name}", {})
    assert [text_of(n) for n in store.children("/names")] == ["db/with spaces.and$dollars"]
