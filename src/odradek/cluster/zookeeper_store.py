"""The ZooKeeper adapter of the metadata store port (DESIGN, "Metadata and the cluster"; seed 003,
"Replication": the controller and the brokers coordinate through ZooKeeper).

Nodes are those of `cluster/store.py`, kept where Kafka kept them on ZooKeeper, with JSON values
(UTF-8, as Kafka writes them). `zookeeper.connect` is ZooKeeper's connect string, optionally with a
chroot (`host1:2181,host2:2181/kafka`); as Kafka does, a missing chroot path is created at start.
`zookeeper.session.timeout.ms` is the session timeout: when it expires ZooKeeper deletes this broker's
ephemeral nodes (its registration, and `/controller` if it held it).

Every method blocks on a round trip to ZooKeeper: the broker calls them on its worker pool, never on
the event loop. `multi` is ZooKeeper's multi (kazoo's transaction): all ops or none. A lost
connection or expired session surfaces as `StoreError`, as a failed disk write does in the embedded
adapter; the caller answers with an error code and retries later.

Watches follow ZooKeeper's granularity: `watch(path, cb)` calls `cb(path)` when the node at `path`
changes or appears or goes, and when its list of children changes (a data watch and a child watch,
re-armed after each event by kazoo's recipes). Callbacks run on kazoo's thread: hand them to the loop
with `call_soon_threadsafe`.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable, Sequence

from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.exceptions import (
    BadVersionError as KzBadVersion, KazooException, NodeExistsError as KzNodeExists,
    NoNodeError as KzNoNode, NotEmptyError as KzNotEmpty, RolledBackError,
)
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from odradek.cluster.store import (
    BadVersionError, CheckVersion, Create, Delete, NodeExistsError, NoNodeError, NotEmptyError, Op, SetData,
    StoreError, delete_tree_ops,
)


def encode(value: dict) -> bytes:
    """A node's bytes. {"value": x} with a scalar x is written as x alone: Kafka keeps some nodes as a
    bare JSON number (`/controller_epoch` holds `5`)."""
    if set(value) == {"value"} and not isinstance(value["value"], (dict, list)):
        return json.dumps(value["value"]).encode()
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def decode(raw: bytes | None) -> dict:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise StoreError(f"a ZooKeeper node holds invalid JSON: {e}") from None
    return value if isinstance(value, dict) else {"value": value}


def split_connect(connect: str) -> tuple[str, str]:
    """('host:port,...', '/chroot' or '') from a zookeeper.connect string."""
    hosts, slash, chroot = connect.partition("/")
    chroot = ("/" + chroot.rstrip("/")) if slash and chroot.strip("/") else ""
    if not hosts:
        raise ValueError(f"zookeeper.connect {connect!r} names no server")
    return hosts, chroot


class ZooKeeperStore:
    """The store on a ZooKeeper ensemble, through one kazoo session."""

    def __init__(self, connect: str, session_timeout_ms: int = 18_000,
                 connection_timeout_ms: int | None = None) -> None:
        self.connect = connect
        self.session_timeout_ms = session_timeout_ms
        self.connection_timeout_ms = connection_timeout_ms or session_timeout_ms
        # One request waits at most this long (kazoo would queue it until the connection returns).
        self.request_timeout_s = self.session_timeout_ms / 1000
        self.hosts, self.chroot = split_connect(connect)
        self.client: KazooClient | None = None
        self._watchers: list[object] = []
        self._lock = threading.Lock()

    def start(self) -> "ZooKeeperStore":
        timeout_s = self.connection_timeout_ms / 1000
        if self.chroot:
            bootstrap = self._started(self.hosts, timeout_s)
            try:
                bootstrap.ensure_path(self.chroot)
            finally:
                bootstrap.stop()
                bootstrap.close()
        self.client = self._started(self.hosts + self.chroot, timeout_s)
        return self

    def _started(self, hosts: str, timeout_s: float) -> KazooClient:
        client = KazooClient(hosts=hosts, timeout=self.session_timeout_ms / 1000)
        try:
            client.start(timeout=timeout_s)
        except (KazooException, KazooTimeoutError, OSError) as e:
            client.stop()
            client.close()
            raise StoreError(f"cannot connect to ZooKeeper at {self.connect}: {e!r}") from None
        return client

    def close(self) -> None:
        if self.client is not None:
            self.client.stop()
            self.client.close()
            self.client = None

    def add_session_listener(self, callback: Callable[[str], None]) -> None:
        """callback('LOST' | 'SUSPENDED' | 'CONNECTED') on kazoo's thread when the session changes."""
        self._zk.add_listener(lambda state: callback(str(state)))

    @property
    def _zk(self) -> KazooClient:
        if self.client is None:
            raise StoreError("the ZooKeeper store is not started")
        if self.client.state != KazooState.CONNECTED:
            raise StoreError(f"not connected to ZooKeeper at {self.connect} ({self.client.state})")
        return self.client

    def _wait(self, async_result: Any, what: str) -> Any:
        """The result of a kazoo request within request_timeout_s; ZooKeeper's own errors pass."""
        try:
            return async_result.get(timeout=self.request_timeout_s)
        except KazooTimeoutError:
            raise StoreError(f"{what}: no answer from ZooKeeper within {self.request_timeout_s} s") from None
        except (KzNoNode, KzNodeExists, KzNotEmpty, KzBadVersion):
            raise
        except KazooException as e:
            raise StoreError(f"{what}: {e!r}") from None

    # ------------------------------------------------------------------------------------------ reads
    def get(self, path: str) -> tuple[dict, int]:
        try:
            raw, stat = self._wait(self._zk.get_async(path), f"reading {path}")
        except KzNoNode:
            raise NoNodeError(path) from None
        return decode(raw), stat.version

    def exists(self, path: str) -> bool:
        return self._wait(self._zk.exists_async(path), f"reading {path}") is not None

    def children(self, path: str) -> list[str]:
        try:
            return sorted(self._wait(self._zk.get_children_async(path), f"listing {path}"))
        except KzNoNode:
            return []

    def created_ms(self, path: str) -> int:
        """The node's ctime: when ZooKeeper created it (ms since the epoch)."""
        stat = self._wait(self._zk.exists_async(path), f"reading {path}")
        if stat is None:
            raise NoNodeError(path)
        return int(stat.ctime)

    # ------------------------------------------------------------------------------------------ writes
    def create(self, path: str, value: dict, ephemeral: bool = False) -> None:
        self.multi([Create(path, value, ephemeral)])

    def set(self, path: str, value: dict, version: int = -1) -> int:
        result = self.multi([SetData(path, value, version)])[0]
        assert result is not None
        return result

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        if not recursive:
            self.multi([Delete(path, version)])
            return
        if not self.exists(path):
            return
        self.multi(delete_tree_ops(path, version, self.children))

    def multi(self, ops: Sequence[Op]) -> list[int | None]:
        """Apply every op or none (ZooKeeper's multi). Per op: the node's new version or None."""
        if not ops:
            return []
        t = self._zk.transaction()
        for op in ops:
            if isinstance(op, Create):
                t.create(op.path, encode(op.value), ephemeral=op.ephemeral, sequence=op.sequential)
            elif isinstance(op, SetData):
                t.set_data(op.path, encode(op.value), version=op.version)
            elif isinstance(op, Delete):
                t.delete(op.path, version=op.version)
            elif isinstance(op, CheckVersion):
                t.check(op.path, op.version)
            else:
                raise TypeError(f"not a store op: {op!r}")
        results = self._wait(t.commit_async(), f"writing {len(ops)} node(s) to ZooKeeper")
        failures = [(op, r) for op, r in zip(ops, results)
                    if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if failures:
            op, error = failures[0]
            raise _port_error(op, error)
        if any(isinstance(r, Exception) for r in results):
            raise StoreError(f"ZooKeeper rolled back a multi of {len(ops)} op(s)")
        out: list[int | None] = []
        for op, r in zip(ops, results):
            if isinstance(op, Create):
                out.append(0)
            elif isinstance(op, SetData):
                out.append(r.version)
            else:
                out.append(None)
        return out

    # ------------------------------------------------------------------------------------------ watches
    def watch(self, path: str, callback: Callable[[str], None]) -> None:
        zk = self._zk
        with self._lock:
            self._watchers.append(DataWatch(zk, path, lambda data, stat, event=None: callback(path)))
            self._watchers.append(_children_watch(zk, path, callback))


def _children_watch(zk: KazooClient, path: str, callback: Callable[[str], None]) -> object:
    """A child watch that also works while `path` does not exist yet (armed once it appears)."""
    def on_children(children: list[str]) -> None:
        callback(path)
    try:
        return ChildrenWatch(zk, path, on_children, allow_session_lost=True)
    except KzNoNode:
        zk.ensure_path(path)
        return ChildrenWatch(zk, path, on_children, allow_session_lost=True)


def _port_error(op: Op, error: Exception) -> Exception:
    if isinstance(error, KzNoNode):
        return NoNodeError(op.path)
    if isinstance(error, KzNodeExists):
        return NodeExistsError(op.path)
    if isinstance(error, KzNotEmpty):
        return NotEmptyError(op.path)
    if isinstance(error, KzBadVersion):
        return BadVersionError(f"{op.path}: version {getattr(op, 'version', -1)} does not match")
    return StoreError(f"{op.path}: {error!r}")
