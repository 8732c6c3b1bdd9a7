"""The ZooKeeper adapter of the metadata store port, against a real ZooKeeper: the same node rules and
all-or-nothing multis as the embedded adapter (each contract test runs on both), and what only a real
ensemble has: a chroot created at start, ephemeral nodes that die with their session, watches that fire
on data and children, and StoreError when ZooKeeper is gone."""

from __future__ import annotations

import threading
import uuid

import pytest

from odradek.cluster.store import (
    BadVersionError, CheckVersion, Create, Delete, EmbeddedStore, NodeExistsError, NoNodeError, NotEmptyError,
    SetData, StoreError,
)
from odradek.cluster.zookeeper_store import ZooKeeperStore, split_connect

from .conftest import LocalZooKeeper


@pytest.fixture(params=["embedded", "zookeeper"])
def store(request, zookeeper):
    if request.param == "embedded":
        yield EmbeddedStore()
        return
    s = ZooKeeperStore(f"{zookeeper.connect}/odradek-{uuid.uuid4().hex[:8]}", session_timeout_ms=6000).start()
    yield s
    s.close()


def test_nodes_follow_zookeeper_rules(store):
    with pytest.raises(NoNodeError):
        store.create("/a/b", {})
    store.create("/a", {"x": 1})
    store.create("/a/b", {"y": 2})
    assert store.get("/a") == ({"x": 1}, 0)
    assert store.children("/a") == ["b"] and store.children("/") == ["a"]
    with pytest.raises(NodeExistsError):
        store.create("/a", {})
    assert store.set("/a", {"x": 2}) == 1
    with pytest.raises(BadVersionError):
        store.set("/a", {"x": 3}, version=0)
    assert store.set("/a", {"x": 3}, version=1) == 2
    with pytest.raises(NotEmptyError):
        store.delete("/a")
    with pytest.raises(NoNodeError):
        store.delete("/nope")
    store.delete("/a", recursive=True)
    assert not store.exists("/a") and not store.exists("/a/b") and store.children("/") == []


def test_sequential_nodes_are_numbered_by_their_parent_and_carry_a_creation_time(store):
    import time
    before = int(time.time() * 1000) - 5000     # ZooKeeper's clock is this machine's, give or take
    store.create("/changes", {})
    store.multi([Create("/changes/change_", {"n": 0}, sequential=True),
                 Create("/changes/change_", {"n": 1}, sequential=True)])
    store.create("/changes/change_", {"n": 2})        # a plain node, no number
    store.multi([Create("/changes/change_", {"n": 3}, sequential=True)])
    numbered = [c for c in store.children("/changes") if c != "change_"]
    assert len(numbered) == 3 and all(len(c) == len("change_") + 10 and c[-10:].isdigit() for c in numbered)
    numbers = [int(c[-10:]) for c in numbered]
    assert numbers == sorted(numbers) and len(set(numbers)) == 3
    assert [store.get(f"/changes/{c}")[0]["n"] for c in numbered] == [0, 1, 3]
    store.delete(f"/changes/{numbered[-1]}")
    store.multi([Create("/changes/change_", {"n": 4}, sequential=True)])
    assert int(max(store.children("/changes"))[-10:]) > numbers[-1]        # numbers never go back
    created = store.created_ms(f"/changes/{numbered[0]}")
    assert before <= created <= int(time.time() * 1000) + 5000
    with pytest.raises(NoNodeError):
        store.created_ms("/changes/nope")


def test_multi_is_all_or_nothing(store):
    store.multi([Create("/t", {}), Create("/t/p", {"v": 0})])
    with pytest.raises(NodeExistsError):
        store.multi([Create("/u", {}), SetData("/t/p", {"v": 1}), Create("/t/p", {})])
    assert not store.exists("/u") and store.get("/t/p") == ({"v": 0}, 0)
    with pytest.raises(BadVersionError):
        store.multi([Delete("/t/p"), CheckVersion("/t", 5)])
    assert store.exists("/t/p")
    assert store.multi([Create("/t/q", {}), Delete("/t/q"), Delete("/t/p"), Delete("/t")]) == [0, None, None, None]
    assert store.children("/") == []


def test_the_chroot_is_created_and_confines_the_store(zookeeper):
    root = f"/kafka-{uuid.uuid4().hex[:8]}"
    s = ZooKeeperStore(zookeeper.connect + root + "/cluster").start()
    try:
        s.create("/brokers", {"v": 1})
        assert s.children("/") == ["brokers"]
    finally:
        s.close()
    outside = ZooKeeperStore(zookeeper.connect).start()
    try:
        assert outside.get(root + "/cluster/brokers") == ({"v": 1}, 0)
    finally:
        outside.close()
    assert split_connect("h1:2181,h2:2181/kafka/") == ("h1:2181,h2:2181", "/kafka")
    assert split_connect("h1:2181") == ("h1:2181", "")


def test_ephemeral_nodes_die_with_their_session_and_watches_fire(zookeeper):
    chroot = f"{zookeeper.connect}/odradek-{uuid.uuid4().hex[:8]}"
    watcher = ZooKeeperStore(chroot).start()
    broker = ZooKeeperStore(chroot).start()
    try:
        watcher.create("/brokers", {})
        watcher.create("/brokers/ids", {})
        seen: list[str] = []
        changed = threading.Event()

        def on_change(path: str) -> None:
            seen.append(path)
            changed.set()

        watcher.watch("/brokers/ids", on_change)
        changed.wait(10)                  # the first call reports the current state
        changed.clear()
        broker.create("/brokers/ids/1", {"host": "127.0.0.1", "port": 9092}, ephemeral=True)
        assert changed.wait(10), "no watch event for a registration"
        assert watcher.children("/brokers/ids") == ["1"]
        changed.clear()
        broker.close()                    # the session ends: ZooKeeper deletes its ephemeral nodes
        assert changed.wait(10), "no watch event for a session's end"
        assert watcher.children("/brokers/ids") == []
    finally:
        broker.close()
        watcher.close()


def test_a_missing_zookeeper_is_a_store_error(tmp_path):
    zk = LocalZooKeeper(tmp_path / "zk").start()
    s = ZooKeeperStore(zk.connect, session_timeout_ms=4000).start()
    try:
        s.create("/x", {})
        zk.kill()
        with pytest.raises(StoreError):
            s.create("/y", {})
    finally:
        s.close()
        zk.stop()
    with pytest.raises(StoreError):
        ZooKeeperStore(zk.connect, connection_timeout_ms=1500).start()
