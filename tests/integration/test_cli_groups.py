"""`odradek groups` as a subprocess against a real broker, with groups made by confluent-kafka
consumers: list, describe with lag and members, reset-offsets (every strategy, dry run and execute,
refused on an active group), delete and delete-offsets; error paths."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from .cli_support import new_name, odradek, unreachable
from .clients import Msg, confluent_config, confluent_consumer, produce_confluent, wait_until

BROKER_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}
BASE_TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def topic(broker, admin):
    """Two partitions of 10 records each; record i of a partition has timestamp BASE_TS + i * 1000."""
    t = new_name("cli-groups")
    admin.create_topics([NewTopic(t, 2, 1)])[t].result(timeout=20)
    produce_confluent(broker.bootstrap, t, [Msg(None, f"{p}-{i}".encode(), (), BASE_TS + i * 1000, p)
                                            for p in (0, 1) for i in range(10)])
    return t


def commit(bootstrap: str, group: str, topic: str, offsets: dict) -> None:
    c = confluent_consumer(bootstrap, **{"group.id": group})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def committed(bootstrap: str, group: str, topic: str) -> dict:
    c = confluent_consumer(bootstrap, **{"group.id": group})
    try:
        return {tp.partition: tp.offset for tp in c.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=20)}
    finally:
        c.close()


@pytest.fixture
def active_member(broker, topic):
    """A live confluent-kafka member of a new group, subscribed to the topic and assigned."""
    g = new_name("cli-active")
    c = confluent_consumer(broker.bootstrap, **{"group.id": g, "session.timeout.ms": 10000})
    c.subscribe([topic])
    deadline = time.monotonic() + 30
    while not c.assignment():
        assert time.monotonic() < deadline, "the confluent consumer was never assigned"
        c.poll(0.2)
    yield g, c
    c.close()


def test_list_matches_confluent(broker, admin, topic):
    groups = [new_name("cli-list") for _ in range(2)]
    for g in groups:
        commit(broker.bootstrap, g, topic, {0: 1})
    listed = {g["group"]: g for g in odradek("groups", "list", "--json", bootstrap=broker.bootstrap).ok().json()}
    theirs = {g.group_id: g for g in admin.list_consumer_groups().result(timeout=20).valid}
    assert set(groups) <= set(listed) and set(listed) == set(theirs)
    assert all(listed[g]["state"] == "Empty" and listed[g]["type"] == "classic" for g in groups)
    assert all(g in odradek("groups", "list", bootstrap=broker.bootstrap).ok().stdout for g in groups)
    only_stable = odradek("groups", "list", "--state", "Stable", "--json", bootstrap=broker.bootstrap).ok().json()
    assert not set(groups) & {g["group"] for g in only_stable}


def test_describe_shows_committed_offsets_and_lag(broker, topic):
    g = new_name("cli-lag")
    commit(broker.bootstrap, g, topic, {0: 3, 1: 10})
    [d] = odradek("groups", "describe", "--group", g, "--json", bootstrap=broker.bootstrap).ok().json()
    assert d["state"] == "Empty" and d["members"] == []
    assert [(r["partition"], r["current_offset"], r["log_end_offset"], r["lag"]) for r in d["offsets"]] == [
        (0, 3, 10, 7), (1, 10, 10, 0)]
    text = odradek("groups", "describe", "--group", g, bootstrap=broker.bootstrap).ok().stdout
    assert "LAG" in text and "State: Empty" in text


def test_describe_an_active_group_names_its_member(broker, topic, active_member):
    g, c = active_member
    [d] = odradek("groups", "describe", "--group", g, "--json", bootstrap=broker.bootstrap).ok().json()
    assert d["state"] == "Stable" and d["protocol_type"] == "consumer"
    [m] = d["members"]
    assert m["member_id"] == c.memberid()
    assert sorted(map(tuple, m["assignment"])) == [(topic, 0), (topic, 1)]
    assert {r["partition"]: (r["consumer_id"], r["current_offset"], r["log_end_offset"]) for r in d["offsets"]} == {
        0: (c.memberid(), None, 10), 1: (c.memberid(), None, 10)}


def test_reset_offsets_is_refused_on_an_active_group(broker, topic, active_member):
    g, _ = active_member
    odradek("groups", "reset-offsets", "--group", g, "--topic", topic, "--to-earliest", "--execute",
            bootstrap=broker.bootstrap).fails("is not empty", "Stable")


@pytest.mark.parametrize("how, expected", [
    (["--to-earliest"], {0: 0, 1: 0}),
    (["--to-latest"], {0: 10, 1: 10}),
    (["--to-offset", "4"], {0: 4, 1: 4}),
    (["--to-offset", "99"], {0: 10, 1: 10}),
    (["--shift-by", "-3"], {0: 2, 1: 4}),
    (["--shift-by", "50"], {0: 10, 1: 10}),
    (["--to-current"], {0: 5, 1: 7}),
    (["--to-datetime", str(BASE_TS + 6500)], {0: 7, 1: 7}),
    (["--to-datetime", "2023-11-14T22:13:26.500Z"], {0: 7, 1: 7}),
    (["--to-datetime", "2030-01-01T00:00:00Z"], {0: 10, 1: 10}),
])
def test_reset_offsets_strategies(broker, topic, how, expected):
    g = new_name("cli-reset")
    commit(broker.bootstrap, g, topic, {0: 5, 1: 7})
    plan = odradek("groups", "reset-offsets", "--group", g, "--topic", topic, *how, "--json",
                   bootstrap=broker.bootstrap).ok()
    assert "Dry run" in plan.stderr and plan.json()["executed"] is False
    assert {o["partition"]: o["new_offset"] for o in plan.json()["offsets"]} == expected
    assert committed(broker.bootstrap, g, topic) == {0: 5, 1: 7}, "a dry run changed the offsets"
    odradek("groups", "reset-offsets", "--group", g, "--topic", topic, *how, "--execute",
            bootstrap=broker.bootstrap).ok()
    assert committed(broker.bootstrap, g, topic) == expected


def test_reset_some_partitions_of_a_new_group_and_all_topics(broker, topic):
    g = new_name("cli-reset-new")
    out = odradek("groups", "reset-offsets", "--group", g, "--topic", f"{topic}:1", "--to-offset", "6", "--execute",
                  bootstrap=broker.bootstrap).ok()
    assert g in out.stdout and "NEW-OFFSET" in out.stdout
    assert committed(broker.bootstrap, g, topic)[1] == 6
    odradek("groups", "reset-offsets", "--group", g, "--all-topics", "--shift-by", "1", "--execute",
            bootstrap=broker.bootstrap).ok()
    c = committed(broker.bootstrap, g, topic)
    assert c[1] == 7 and c[0] < 0   # partition 0 was never committed and is left alone


def test_reset_offsets_errors(broker, topic):
    g = new_name("cli-reset-err")
    missing = new_name("cli-nosuch")
    odradek("groups", "reset-offsets", "--group", g, "--topic", missing, "--to-earliest",
            bootstrap=broker.bootstrap).fails("UNKNOWN_TOPIC_OR_PARTITION", missing)
    odradek("groups", "reset-offsets", "--group", g, "--topic", f"{topic}:5", "--to-earliest",
            bootstrap=broker.bootstrap).fails("has no partition 5")
    odradek("groups", "reset-offsets", "--group", g, "--topic", topic, "--shift-by", "1",
            bootstrap=broker.bootstrap).fails("no committed offset")
    odradek("groups", "reset-offsets", "--group", g, "--all-topics", "--to-latest",
            bootstrap=broker.bootstrap).fails("has no committed offsets")
    odradek("groups", "reset-offsets", "--group", g, "--topic", topic, "--to-datetime", "soon",
            bootstrap=broker.bootstrap).fails("ISO 8601", status=2)


def test_delete_offsets_and_groups(broker, admin, topic):
    g = new_name("cli-del")
    commit(broker.bootstrap, g, topic, {0: 2, 1: 3})
    odradek("groups", "delete-offsets", "--group", g, "--topic", f"{topic}:0", bootstrap=broker.bootstrap).ok()
    c = committed(broker.bootstrap, g, topic)
    assert c[0] < 0 and c[1] == 3
    out = odradek("groups", "delete", "--group", g, "--json", bootstrap=broker.bootstrap).ok().json()
    assert out == {"deleted": [g]}
    wait_until(lambda: g not in {x.group_id for x in admin.list_consumer_groups().result(timeout=20).valid}, 10,
               "the group to disappear")
    odradek("groups", "delete", "--group", g, bootstrap=broker.bootstrap).fails("GROUP_ID_NOT_FOUND", g)
    odradek("groups", "describe", "--group", g, bootstrap=broker.bootstrap).fails("does not exist", g)


def test_delete_an_active_group_is_refused(broker, active_member):
    g, _ = active_member
    odradek("groups", "delete", "--group", g, bootstrap=broker.bootstrap).fails("NON_EMPTY_GROUP", g)


def test_broker_unreachable():
    addr = unreachable()
    odradek("groups", "list", "--timeout", "1", bootstrap=addr).fails(f"cannot reach the cluster at {addr}")
