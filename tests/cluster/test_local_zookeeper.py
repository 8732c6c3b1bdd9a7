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
