"""The local ZooKeeper that `odradek cluster up` and the cluster tests run: a real server, reached with
kazoo, that keeps its persistent nodes across a restart and drops ephemeral ones with their session."""

from __future__ import annotations

from kazoo.client import KazooClient

from .conftest import LocalZooKeeper


def client(zk: LocalZooKeeper) -> KazooClient:
    k = KazooClient(hosts=zk.connect, timeout=10)
    k.start(timeout=30)
    return k


def test_nodes_survive_a_restart_and_ephemerals_die_with_their_session(tmp_path):
    zk = LocalZooKeeper(tmp_path / "zk").start()
    try:
        k = client(zk)
        k.create("/brokers/topics/t", b'{"version": 3}', makepath=True)
        k.create("/brokers/ids/1", b"{}", ephemeral=True, makepath=True)
        assert k.get_children("/brokers/ids") == ["1"]
        k.stop()
        k.close()
        zk.kill()
        zk.start()
        k = client(zk)
        assert k.get("/brokers/topics/t")[0] == b'{"version": 3}'
        assert not k.exists("/brokers/ids/1")
        k.stop()
        k.close()
    finally:
        zk.stop()
    assert not zk.running


def test_the_server_grants_the_session_timeout_a_broker_asks_for(tmp_path):
    """Kafka's default zookeeper.session.timeout.ms (18 s) and a short test one (1 s) both hold: the
    server's bounds do not clamp them (ZooKeeper's default bounds are 2 to 20 ticks)."""
    zk = LocalZooKeeper(tmp_path / "zk").start()
    clients = []
    try:
        for seconds in (18, 1):
            k = KazooClient(hosts=zk.connect, timeout=seconds)
            k.start(timeout=30)
            clients.append((k, seconds))
        granted = zk.session_timeouts()
        for k, seconds in clients:
            assert granted[k.client_id[0]] == seconds * 1000, granted
    finally:
        for k, _ in clients:
            k.stop()
            k.close()
        zk.stop()
