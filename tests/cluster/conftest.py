"""Fixtures of the cluster tests: a real ZooKeeper server on a loopback port (Debian's zookeeper
package, installed by the README's test command; a missing one fails loudly), one per module."""

from __future__ import annotations

import pytest

from odradek.cluster.local_zookeeper import LocalZooKeeper


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    zk = LocalZooKeeper(tmp_path_factory.mktemp("zookeeper"))
    zk.start()
    try:
        yield zk
    finally:
        zk.stop()
