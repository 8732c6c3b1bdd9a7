"""Broker registration and controller election on a real ZooKeeper: one winner, failover to another
broker with a larger epoch when the controller's session ends, and a stale controller fenced."""

from __future__ import annotations

import uuid

import pytest

from odradek.cluster.registration import (
    Endpoint, broker_node, controller_epoch, current_controller, live_brokers, parse_endpoints,
    register_broker, try_become_controller,
)
from odradek.cluster.store import BadVersionError, Create, NodeExistsError
from odradek.cluster.zookeeper_store import ZooKeeperStore


@pytest.fixture
def chroot(zookeeper):
    root = f"{zookeeper.connect}/odradek-{uuid.uuid4().hex[:8]}"
    s = ZooKeeperStore(root).start()
    s.create("/brokers", {})
    s.create("/brokers/ids", {})
    s.close()
    return root


def test_brokers_register_once_and_leave_with_their_session(chroot):
    one, two, observer = (ZooKeeperStore(chroot).start() for _ in range(3))
    try:
        node = broker_node([Endpoint("PLAINTEXT", "127.0.0.1", 9092)], "rack-a", 1)
        register_broker(one, 1, node)
        register_broker(two, 2, broker_node([Endpoint("PLAINTEXT", "127.0.0.1", 9093)], None, 2))
        with pytest.raises(NodeExistsError):
            register_broker(two, 1, node)
        assert sorted(live_brokers(observer)) == [1, 2]
        assert parse_endpoints(live_brokers(observer)[1]) == [Endpoint("PLAINTEXT", "127.0.0.1", 9092)]
        one.close()
        assert sorted(live_brokers(observer)) == [2]
    finally:
        for s in (one, two, observer):
            s.close()


def test_one_controller_then_failover_with_a_larger_epoch_and_the_old_one_fenced(chroot):
    one, two = ZooKeeperStore(chroot).start(), ZooKeeperStore(chroot).start()
    try:
        lease1 = try_become_controller(one, 1, now_ms=1)
        assert lease1 is not None and lease1.epoch == 1
        assert try_become_controller(two, 2, now_ms=2) is None
        assert current_controller(two) == 1
        one.multi(lease1.fenced([Create("/by-controller-1", {})]))
        one.close()                        # controller 1's session ends: /controller is free
        lease2 = try_become_controller(two, 2, now_ms=3)
        assert lease2 is not None and lease2.epoch == 2 and current_controller(two) == 2
        assert controller_epoch(two)[0] == 2
        stale = ZooKeeperStore(chroot).start()   # controller 1 comes back with its old lease
        try:
            with pytest.raises(BadVersionError):
                stale.multi(lease1.fenced([Create("/by-stale-controller", {})]))
            assert not stale.exists("/by-stale-controller")
        finally:
            stale.close()
    finally:
        one.close()
        two.close()
