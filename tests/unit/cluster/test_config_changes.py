"""Config change notifications on the store with ZooKeeper's layout: a config write comes with a
sequential notification naming its entity, readers see each entity once and in order from the last
number they applied, notifications of other kinds or in other shapes are skipped, and expired ones go."""

from __future__ import annotations

from odradek.cluster.config_changes import (
    CONFIG_CHANGES_PATH, broker_entity, change_number, purge_expired_changes, read_changes, read_configs,
    topic_entity, write_configs,
)
from odradek.cluster.controller import Controller
from odradek.cluster.store import Create, EmbeddedStore


def _store() -> EmbeddedStore:
    store = EmbeddedStore()
    Controller(store, 0).start()          # the persistent paths, /config/changes among them
    return store


def test_a_config_write_comes_with_a_notification_in_kafkas_format():
    store = _store()
    write_configs(store, {topic_entity("t"): {"retention.ms": "1000"}})
    write_configs(store, {topic_entity("t"): {"retention.ms": "2000"}})     # replaced, not created again
    write_configs(store, {broker_entity(None): {"log.retention.ms": "5"}, broker_entity(3): {}})
    assert store.get("/config/topics/t")[0] == {"version": 1, "config": {"retention.ms": "2000"}}
    assert store.get("/config/brokers/<default>")[0]["config"] == {"log.retention.ms": "5"}
    children = store.children(CONFIG_CHANGES_PATH)
    assert [c[:len("config_change_")] for c in children] == ["config_change_"] * 4
    assert [store.get(f"{CONFIG_CHANGES_PATH}/{c}")[0] for c in children] == [
        {"version": 2, "entity_path": "topics/t"}, {"version": 2, "entity_path": "topics/t"},
        {"version": 2, "entity_path": "brokers/<default>"}, {"version": 2, "entity_path": "brokers/3"}]


def test_readers_take_each_entity_once_from_the_last_number_they_applied():
    store = _store()
    write_configs(store, {topic_entity("a"): {"x": "1"}})
    write_configs(store, {topic_entity("b"): {}})
    write_configs(store, {topic_entity("a"): {"x": "2"}})
    entities, last = read_changes(store, -1)
    assert entities == ["topics/a", "topics/b"] and last == change_number(max(store.children(CONFIG_CHANGES_PATH)))
    assert read_changes(store, last) == ([], last)
    # other shapes and kinds are skipped, but still counted as seen
    store.multi([Create(f"{CONFIG_CHANGES_PATH}/config_change_", {"version": 1, "entity_path": "topics/a"},
                        sequential=True),
                 Create(f"{CONFIG_CHANGES_PATH}/config_change_", {"version": 2, "entity_path": "users/alice"},
                        sequential=True),
                 Create(f"{CONFIG_CHANGES_PATH}/config_change_", {"version": 2}, sequential=True)])
    write_configs(store, {broker_entity(1): {"log.cleaner.threads": "2"}})
    entities, newer = read_changes(store, last)
    assert entities == ["brokers/1"] and newer == last + 4
    assert read_configs(store, ["topics/a", "brokers/1", "topics/none"]) == {
        "topics/a": {"x": "2"}, "brokers/1": {"log.cleaner.threads": "2"}, "topics/none": {}}
    assert change_number("config_change_0000000012") == 12
    assert change_number("config_change_12") is None and change_number("other_0000000012") is None


def test_notifications_expire_by_their_creation_time():
    store = _store()
    write_configs(store, {topic_entity("a"): {}})
    (first,) = store.children(CONFIG_CHANGES_PATH)
    created = store.created_ms(f"{CONFIG_CHANGES_PATH}/{first}")
    write_configs(store, {topic_entity("b"): {}})
    assert purge_expired_changes(store, created + 1000, expiration_ms=1000) == []
    purged = purge_expired_changes(store, created + 1001, expiration_ms=1000)
    assert first in purged
    assert not any(c in purged for c in store.children(CONFIG_CHANGES_PATH))
