"""The metadata store port and its embedded adapter (DESIGN, "Metadata and the cluster").

The cluster state is a small hierarchical store of JSON nodes with versions, laid out as Kafka kept it
on ZooKeeper (paths and node formats: `cluster/topics.py`, `cluster/controller.py`):

    /cluster/id                                   {"version": "1", "id": "<cluster id>"}
    /brokers/ids/<id>                             (ephemeral)
    /brokers/topics/<topic>                       {"version": 3, "topic_id", "partitions": {"0": [1, 2]}, ...}
    /brokers/topics/<topic>/partitions/<p>/state  {"controller_epoch", "leader", "version", "leader_epoch", "isr"}
    /config/topics/<topic>                        {"version": 1, "config": {...}}
    /config/brokers/<id> and /config/brokers/<default>
    /config/changes/config_change_<seq>           {"version": 2, "entity_path": "topics/<t>"} (cluster/config_changes.py)
    /admin/delete_topics/<topic>                  a deletion under way
    /latest_producer_id_block                     {"version": 1, "broker", "block_start", "block_end"}

The port is ZooKeeper's: a node is created under an existing parent, deleted only without children,
and `multi(ops)` applies a list of create / set (with a version check) / delete / check-version
operations all or nothing (ZooKeeper's multi; kazoo's transaction). A sequential create appends a
10-digit counter of its parent to the name, as ZooKeeper's PERSISTENT_SEQUENTIAL does, and
`created_ms` is a node's creation time (ZooKeeper's ctime; in the embedded store the time this process
created or loaded it). A failed check raises
NoNodeError, NodeExistsError, NotEmptyError or BadVersionError and changes nothing; a failed write
raises StoreError and changes nothing either. Two adapters implement it: `EmbeddedStore` here (one
process, persisted through `cluster/journal.py`) and the ZooKeeper adapter (kazoo), which the cluster
work adds.

Threads: one writer at a time (a lock); reads take no lock and may run on any thread. Every read is a
single dict or set operation, so a reader never sees a half-written node, though it may see some
nodes of a multi that another thread is applying (the controller serves readers from its own image,
so only it reads the store).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, Union

if TYPE_CHECKING:
    from odradek.cluster.journal import FileJournal


class StoreError(Exception):
    """A change that could not be made durable (ENOSPC, EIO, ...): nothing changed, in memory or on disk."""


class NoNodeError(KeyError):
    pass


class NodeExistsError(KeyError):
    pass


class NotEmptyError(ValueError):
    pass


class BadVersionError(ValueError):
    pass


@dataclass(frozen=True)
class Create:
    path: str
    value: dict
    ephemeral: bool = False
    sequential: bool = False   # the name gets the parent's next 10-digit sequence number appended


@dataclass(frozen=True)
class SetData:
    path: str
    value: dict
    version: int = -1          # -1: any version


@dataclass(frozen=True)
class Delete:
    path: str
    version: int = -1


@dataclass(frozen=True)
class CheckVersion:
    path: str
    version: int


Op = Union[Create, SetData, Delete, CheckVersion]


class MetadataStore(Protocol):
    def get(self, path: str) -> tuple[dict, int]: ...
    def exists(self, path: str) -> bool: ...
    def children(self, path: str) -> list[str]: ...
    def create(self, path: str, value: dict, ephemeral: bool = False) -> None: ...
    def set(self, path: str, value: dict, version: int = -1) -> int: ...
    def delete(self, path: str, version: int = -1, recursive: bool = False) -> None: ...
    def multi(self, ops: Sequence[Op]) -> list[int | None]: ...
    def watch(self, prefix: str, callback: Callable[[str], None]) -> None: ...
    def created_ms(self, path: str) -> int: ...


def parent_of(path: str) -> str:
    head, _, _ = path.rpartition("/")
    return head or "/"


def delete_tree_ops(path: str, version: int, children: Callable[[str], list[str]]) -> list[Op]:
    """The deletes of a node and everything below it, children before their parent (a recursive
    delete as one multi, as ZooKeeper needs it)."""
    doomed: list[str] = []
    stack = [path]
    while stack:     # pre-order; reversed below so children go before their parent
        p = stack.pop()
        doomed.append(p)
        stack.extend(f"{p.rstrip('/')}/{c}" for c in children(p))
    return [Delete(p, version if p == path else -1) for p in reversed(doomed)]


_GONE = object()   # a node deleted earlier in the same multi


class EmbeddedStore:
    """The store in this process. With a journal every multi is persisted once (one checksummed line,
    one fsync) before memory changes; without one the store lives in memory only (tests)."""

    def __init__(self, journal: "FileJournal | None" = None) -> None:
        self.journal = journal
        self.nodes: dict[str, tuple[dict, int, bool]] = {}     # path -> (value, version, ephemeral)
        self._children: dict[str, set[str]] = {}
        self.watches: list[tuple[str, Callable[[str], None]]] = []
        self._write_lock = threading.Lock()
        self._created: dict[str, int] = {}          # path -> creation time (ms), in this process
        self._sequence: dict[str, int] = {}         # parent -> its next sequence number
        if journal is not None:
            loaded_at = int(time.time() * 1000)
            for path, (value, version) in journal.load().items():
                self.nodes[path] = (value, version, False)
                self._created[path] = loaded_at
            for path in self.nodes:
                self._children.setdefault(parent_of(path), set()).add(path.rsplit("/", 1)[1])

    @classmethod
    def open(cls, directory: str) -> "EmbeddedStore":
        from odradek.cluster.journal import FileJournal
        return cls(FileJournal(directory))

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()

    # ------------------------------------------------------------------------------------------ reads
    def get(self, path: str) -> tuple[dict, int]:
        node = self.nodes.get(path)
        if node is None:
            raise NoNodeError(path)
        return node[0], node[1]

    def exists(self, path: str) -> bool:
        return path in self.nodes

    def children(self, path: str) -> list[str]:
        return sorted(self._children.get(path.rstrip("/") or "/", ()))

    def created_ms(self, path: str) -> int:
        if path not in self.nodes:
            raise NoNodeError(path)
        return self._created.get(path, 0)

    # ------------------------------------------------------------------------------------------ writes
    def create(self, path: str, value: dict, ephemeral: bool = False) -> None:
        self.multi([Create(path, value, ephemeral)])

    def set(self, path: str, value: dict, version: int = -1) -> int:
        version_now = self.multi([SetData(path, value, version)])[0]
        assert version_now is not None
        return version_now

    def delete(self, path: str, version: int = -1, recursive: bool = False) -> None:
        if not recursive:
            self.multi([Delete(path, version)])
            return
        if path not in self.nodes:
            return
        self.multi(delete_tree_ops(path, version, self.children))

    def multi(self, ops: Sequence[Op]) -> list[int | None]:
        """Apply every op or none. Returns, per op, the node's new version (create, set) or None."""
        with self._write_lock:
            results, changes = self._check(ops)
            if self.journal is not None:
                durable = [c for c in changes if not c[3]]
                if durable:
                    self.journal.append([(kind, path, value) for kind, path, value, _ in durable])
            for kind, path, value, ephemeral in changes:
                self._apply(kind, path, value, ephemeral)
            if self.journal is not None:
                self.journal.maybe_compact(self._persistent_nodes)
        for _, path, _, _ in changes:
            for prefix, cb in list(self.watches):
                if path.startswith(prefix):
                    cb(path)
        return results

    def watch(self, prefix: str, callback: Callable[[str], None]) -> None:
        self.watches.append((prefix, callback))

    # ------------------------------------------------------------------------------------------ internals
    def _check(self, ops: Sequence[Op]) -> tuple[list[int | None], list[tuple]]:
        """Validate `ops` in order against the current state plus the effect of the ops before them.
        Returns the results and the changes to apply: (kind "c"/"s"/"d", path, value, ephemeral)."""
        overlay: dict[str, object] = {}          # path -> (value, version, ephemeral) or _GONE
        child_delta: dict[str, int] = {}
        results: list[int | None] = []
        changes: list[tuple] = []
        overlay_seq: dict[str, int] = {}         # parent -> sequence numbers taken by this multi

        def node(p: str) -> Any:
            n = overlay.get(p)
            if n is None:
                return self.nodes.get(p)
            return None if n is _GONE else n

        for op in ops:
            path = op.path
            if not path.startswith("/") or path.endswith("/") or "//" in path:
                raise ValueError(f"invalid path {path!r}")
            if isinstance(op, Create) and op.sequential:
                path = f"{path}{self._next_sequence(parent_of(path), overlay_seq):010d}"
            current = node(path)
            if isinstance(op, Create):
                if current is not None:
                    raise NodeExistsError(path)
                parent = parent_of(path)
                if parent != "/" and node(parent) is None:
                    raise NoNodeError(parent)
                if parent != "/" and node(parent)[2]:
                    raise ValueError(f"{path}: ephemeral nodes have no children")
                overlay[path] = (op.value, 0, op.ephemeral)
                child_delta[parent] = child_delta.get(parent, 0) + 1
                changes.append(("c", path, op.value, op.ephemeral))
                results.append(0)
                continue
            if current is None:
                raise NoNodeError(path)
            if op.version != -1 and op.version != current[1]:
                raise BadVersionError(f"{path}: expected version {op.version}, found {current[1]}")
            if isinstance(op, SetData):
                overlay[path] = (op.value, current[1] + 1, current[2])
                changes.append(("s", path, op.value, current[2]))
                results.append(current[1] + 1)
            elif isinstance(op, Delete):
                if len(self._children.get(path, ())) + child_delta.get(path, 0) > 0:
                    raise NotEmptyError(path)
                overlay[path] = _GONE
                parent = parent_of(path)
                child_delta[parent] = child_delta.get(parent, 0) - 1
                changes.append(("d", path, None, current[2]))
                results.append(None)
            elif isinstance(op, CheckVersion):
                results.append(None)
            else:
                raise TypeError(f"not a store op: {op!r}")
        return results, changes

    def _next_sequence(self, parent: str, taken: dict[str, int]) -> int:
        """ZooKeeper's counter of a parent: one more than the last sequence number handed out."""
        if parent not in taken:
            first = self._sequence.get(parent)
            if first is None:     # after a restart: past every numbered child
                numbers = [int(c[-10:]) for c in self._children.get(parent, ()) if c[-10:].isdigit()]
                first = max(numbers) + 1 if numbers else 0
            taken[parent] = first
        number = taken[parent]
        taken[parent] = number + 1
        return number

    def _apply(self, kind: str, path: str, value: Any, ephemeral: bool) -> None:
        parent, _, name = path.rpartition("/")
        parent = parent or "/"
        if kind == "c":
            self.nodes[path] = (value, 0, ephemeral)
            self._created[path] = int(time.time() * 1000)
            self._children.setdefault(parent, set()).add(name)
            if name[-10:].isdigit():
                self._sequence[parent] = max(self._sequence.get(parent, 0), int(name[-10:]) + 1)
        elif kind == "s":
            _, version, eph = self.nodes[path]
            self.nodes[path] = (value, version + 1, eph)
        else:
            del self.nodes[path]
            self._created.pop(path, None)
            siblings = self._children.get(parent)
            if siblings is not None:
                siblings.discard(name)
                if not siblings:
                    del self._children[parent]

    def _persistent_nodes(self) -> dict[str, list]:
        return {p: [v, ver] for p, (v, ver, eph) in self.nodes.items() if not eph}
