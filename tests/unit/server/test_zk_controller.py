"""The active controller's decisions, on the in-memory store with the ZooKeeper layout and a fake of the
brokers it sends requests to: elections for dead brokers recorded and propagated, ElectLeaders both
types, auto leader rebalance, controlled shutdown, and a stale controller fenced."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from odradek.cluster.controller import Controller
from odradek.cluster.registration import Endpoint, broker_node, register_broker, try_become_controller
from odradek.cluster.store import BadVersionError, EmbeddedStore, SetData
from odradek.cluster.topics import PartitionState, TopicInfo, initial_state, state_path
from odradek.protocol.error_codes import ErrorCode
from odradek.server.zk_controller import LEADER_AND_ISR_KEY, STOP_REPLICA_KEY, UPDATE_METADATA_KEY, ActiveController


class FakeBrokers:
    """Records every request the controller sends, per broker; answers with no error."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int, Any]] = []

    async def request(self, purpose: str, broker_id: int, api_key: int, body: Any, *, timeout_ms: int | None = None) -> Any:
        self.sent.append((broker_id, api_key, body))
        return type("Answer", (), {"error_code": 0})()

    def drop_broker(self, broker_id: int) -> None:
        pass

    def to(self, broker: int, api_key: int) -> list[Any]:
        return [b for i, k, b in self.sent if i == broker and k == api_key]


async def run_now(fn, *args):
    return fn(*args)


def make(store: EmbeddedStore, brokers: list[int], topics: dict[str, dict[int, list[int]]],
         unclean: bool = False) -> tuple[ActiveController, FakeBrokers]:
    Controller(store, 0).start()
    for b in brokers:
        register_broker(store, b, broker_node([Endpoint("PLAINTEXT", "127.0.0.1", 9000 + b)], None, 0))
    plan = Controller(store, 0)
    infos = [TopicInfo(name, __import__("uuid").uuid4(), {p: initial_state(r) for p, r in parts.items()})
             for name, parts in topics.items()]
    plan.commit(plan.creation_ops(infos))
    lease = try_become_controller(store, brokers[0], 0)
    assert lease is not None
    fake = FakeBrokers()
    return ActiveController(brokers[0], store, lease, run_now, fake, lambda topic: unclean), fake  # type: ignore[arg-type]


def state(ac: ActiveController, topic: str, p: int) -> PartitionState:
    return ac.cluster.image.get(topic).partitions[p]


def stored(store: EmbeddedStore, topic: str, p: int) -> dict:
    return store.get(state_path(topic, p))[0]


def test_start_tells_every_broker_everything():
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2, 3], 1: [2, 3, 1]}})
    asyncio.run(ac.start())
    for b in (1, 2, 3):
        (um,) = fake.to(b, UPDATE_METADATA_KEY)
        assert sorted(x.id for x in um.live_brokers) == [1, 2, 3]
        (lai,) = fake.to(b, LEADER_AND_ISR_KEY)
        assert sorted(s.partition_index for ts in lai.topic_states for s in ts.partition_states) == [0, 1]


def test_a_dead_leader_is_replaced_from_the_isr_recorded_and_propagated():
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2, 3]}})
    asyncio.run(ac.start())
    fake.sent.clear()
    store.delete("/brokers/ids/1")
    asyncio.run(ac.brokers_changed())
    assert state(ac, "t", 0) == PartitionState(2, 1, [2, 3], [1, 2, 3])
    assert stored(store, "t", 0)["leader"] == 2 and stored(store, "t", 0)["isr"] == [2, 3]
    assert fake.to(1, LEADER_AND_ISR_KEY) == []            # the dead broker is not sent anything
    (lai,) = fake.to(3, LEADER_AND_ISR_KEY)
    s = lai.topic_states[0].partition_states[0]
    assert (s.leader, s.leader_epoch, s.isr) == (2, 1, [2, 3])


def test_unclean_election_only_when_allowed():
    for unclean, leader in ((False, -1), (True, 3)):
        store = EmbeddedStore()
        ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2, 3]}}, unclean=unclean)
        asyncio.run(ac.start())
        # the ISR has shrunk to [1, 2] by the leader's own write
        node, version = store.get(state_path("t", 0))
        store.set(state_path("t", 0), {**node, "isr": [1, 2]}, version)
        store.delete("/brokers/ids/1")
        store.delete("/brokers/ids/2")
        asyncio.run(ac.brokers_changed())
        assert state(ac, "t", 0).leader == leader


def test_elect_leaders_preferred_and_auto_rebalance():
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2, 3], 1: [1, 3, 2]}})
    asyncio.run(ac.start())
    store.delete("/brokers/ids/1")
    asyncio.run(ac.brokers_changed())
    assert state(ac, "t", 0).leader == 2 and state(ac, "t", 1).leader == 3
    register_broker(store, 1, broker_node([Endpoint("PLAINTEXT", "127.0.0.1", 9001)], None, 5))
    asyncio.run(ac.brokers_changed())
    # back, but not yet in the ISR: the preferred replica cannot lead
    assert asyncio.run(ac.elect_leaders(0, [("t", 0)])) == {("t", 0): ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE}
    for p in (0, 1):       # it caught up: its leaders recorded it in the ISR
        node, version = store.get(state_path("t", p))
        store.set(state_path("t", p), {**node, "isr": [1, 2, 3]}, version)
    nodes = ac.cluster.read_states([("t", 0), ("t", 1)])
    ac.cluster.states_read(nodes)
    assert asyncio.run(ac.elect_leaders(0, [("t", 0), ("t", 9)])) == {
        ("t", 0): ErrorCode.NONE, ("t", 9): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    assert state(ac, "t", 0).leader == 1
    assert asyncio.run(ac.rebalance_leaders(10)) == 1       # t-1: half of broker 1's partitions moved
    assert state(ac, "t", 1).leader == 1
    assert asyncio.run(ac.rebalance_leaders(10)) == 0
    assert asyncio.run(ac.elect_leaders(0, [("t", 1)])) == {("t", 1): ErrorCode.ELECTION_NOT_NEEDED}
    assert asyncio.run(ac.elect_leaders(1, [("t", 1)])) == {("t", 1): ErrorCode.ELECTION_NOT_NEEDED}


def test_controlled_shutdown_moves_leadership_and_stops_the_followers():
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2, 3], 1: [2, 1, 3]}})
    asyncio.run(ac.start())
    fake.sent.clear()
    assert asyncio.run(ac.controlled_shutdown(1)) == []
    assert state(ac, "t", 0).leader == 2 and 1 not in state(ac, "t", 0).isr
    assert 1 not in state(ac, "t", 1).isr
    (stop,) = fake.to(1, STOP_REPLICA_KEY)
    assert sorted(p.partition_index for ts in stop.topic_states for p in ts.partition_states) == [0, 1]


def test_a_stale_controller_cannot_write():
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2, 3]}})
    asyncio.run(ac.start())
    # another controller took over: the epoch node moved on
    store.delete("/controller")
    node, version = store.get("/controller_epoch")
    store.set("/controller_epoch", {"value": node["value"] + 1}, version)
    store.delete("/brokers/ids/1")
    with pytest.raises(BadVersionError):
        asyncio.run(ac.brokers_changed())
    assert stored(store, "t", 0)["leader"] == 1


def test_an_isr_written_by_the_leader_meanwhile_makes_the_controller_elect_again():
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2, 3]}})
    asyncio.run(ac.start())
    node, version = store.get(state_path("t", 0))
    store.multi([SetData(state_path("t", 0), {**node, "isr": [1, 3]}, version)])   # the leader dropped 2
    store.delete("/brokers/ids/1")
    asyncio.run(ac.brokers_changed())
    assert state(ac, "t", 0) == PartitionState(3, 1, [3], [1, 2, 3])


def test_a_reassignment_adds_then_removes_and_is_listed_meanwhile():
    from odradek.cluster.controller import ISR_CHANGE_NOTIFICATION_PATH
    from odradek.cluster.topics import topic_path
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2]}})
    asyncio.run(ac.start())
    fake.sent.clear()
    assert asyncio.run(ac.reassign({("t", 0): [2, 3], ("t", 5): [1]})) == {
        ("t", 0): (ErrorCode.NONE, None), ("t", 5): (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, None)}
    assert state(ac, "t", 0) == PartitionState(1, 1, [1, 2], [2, 3, 1])
    node = store.get(topic_path("t"))[0]
    assert node["partitions"]["0"] == [2, 3, 1] and node["adding_replicas"] == {"0": [3]} \
        and node["removing_replicas"] == {"0": [1]}
    assert ac.list_reassignments(None) == {("t", 0): ([2, 3, 1], [3], [1])}
    assert fake.to(3, LEADER_AND_ISR_KEY)                     # the new replica starts following
    # the leader records the caught-up replica in the ISR and notifies the controller
    node, version = store.get(state_path("t", 0))
    store.multi([SetData(state_path("t", 0), {**node, "isr": [1, 2, 3]}, version)])
    store.create(f"{ISR_CHANGE_NOTIFICATION_PATH}/isr_change_1_0", {"version": 1, "partitions": [
        {"topic": "t", "partition": 0}]})
    asyncio.run(ac.isr_changed())
    assert state(ac, "t", 0) == PartitionState(2, 2, [2, 3], [2, 3])
    assert ac.list_reassignments(None) == {}
    node = store.get(topic_path("t"))[0]
    assert node["partitions"]["0"] == [2, 3] and node["adding_replicas"] == {} and node["removing_replicas"] == {}
    (stop,) = fake.to(1, STOP_REPLICA_KEY)
    assert stop.topic_states[0].partition_states[0].delete_partition
    # a new controller reads the same state back
    assert Controller(store, 0).read_topic("t").partitions[0].replicas == [2, 3]


def test_a_reassignment_is_refused_for_unknown_brokers_and_cancelled_back():
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2]}})
    asyncio.run(ac.start())
    assert asyncio.run(ac.reassign({("t", 0): [1, 7]}))[("t", 0)][0] is ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert asyncio.run(ac.reassign({("t", 0): None}))[("t", 0)][0] is ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
    asyncio.run(ac.reassign({("t", 0): [1, 3]}))
    assert state(ac, "t", 0).replicas == [1, 3, 2]
    asyncio.run(ac.reassign({("t", 0): None}))
    assert state(ac, "t", 0).replicas == [1, 2] and ac.list_reassignments(None) == {}


def test_create_partitions_is_refused_while_the_topic_is_reassigned_and_keeps_the_lists():
    """Kafka's ZooKeeper-mode CreatePartitions answers REASSIGNMENT_IN_PROGRESS for a topic being
    reassigned; other topics grow meanwhile, and the topic node keeps the adding and removing lists."""
    from odradek.cluster.topics import topic_path
    from odradek.protocol.error_codes import KafkaApiError
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2]}, "u": {0: [1, 2]}})
    asyncio.run(ac.start())
    asyncio.run(ac.reassign({("t", 0): [2, 3]}))
    with pytest.raises(KafkaApiError) as refused:
        ac.cluster.plan_partitions("t", 2, None, [1, 2, 3])
    assert refused.value.code is ErrorCode.REASSIGNMENT_IN_PROGRESS
    assert refused.value.detail == "A partition reassignment is in progress for the topic 't'."
    old_u = ac.cluster.image.get("u")
    asyncio.run(ac.add_partitions([(old_u, ac.cluster.plan_partitions("u", 3, None, [1, 2, 3]))]))
    assert sorted(store.get(topic_path("u"))[0]["partitions"]) == ["0", "1", "2"]
    # the write a plan made before the reassignment started still keeps the reassignment's lists
    old_t = ac.cluster.image.get("t")
    grown = __import__("dataclasses").replace(old_t, partitions={**old_t.partitions, 1: initial_state([3, 1])})
    asyncio.run(ac.add_partitions([(old_t, grown)]))
    node = store.get(topic_path("t"))[0]
    assert node["adding_replicas"] == {"0": [3]} and node["removing_replicas"] == {"0": [1]}
    assert ac.list_reassignments(None) == {("t", 0): ([2, 3, 1], [3], [1])}
    # once the reassignment is done (here: cancelled) the topic grows again
    asyncio.run(ac.reassign({("t", 0): None}))
    assert ac.list_reassignments(None) == {}
    plan = ac.cluster.plan_partitions("t", 3, None, [1, 2, 3])
    assert sorted(plan.partitions) == [0, 1, 2]


def test_the_controller_purges_config_change_notifications_after_fifteen_minutes():
    from odradek.cluster.config_changes import CONFIG_CHANGES_PATH, topic_entity, write_configs
    store = EmbeddedStore()
    ac, fake = make(store, [1, 2, 3], {"t": {0: [1, 2, 3]}})
    assert ac.config_change_expiration_ms == 15 * 60 * 1000
    asyncio.run(ac.start())
    write_configs(store, {topic_entity("t"): {"retention.ms": "1"}})
    (name,) = store.children(CONFIG_CHANGES_PATH)
    created = store.created_ms(f"{CONFIG_CHANGES_PATH}/{name}")
    assert asyncio.run(ac.purge_config_changes(created + 15 * 60 * 1000)) == []
    assert asyncio.run(ac.purge_config_changes(created + 15 * 60 * 1000 + 1)) == [name]
    assert store.children(CONFIG_CHANGES_PATH) == []
    ac.stop()                       # a controller that lost its place purges nothing
    write_configs(store, {topic_entity("t"): {}})
    assert asyncio.run(ac.purge_config_changes(2**62)) == [] and len(store.children(CONFIG_CHANGES_PATH)) == 1
