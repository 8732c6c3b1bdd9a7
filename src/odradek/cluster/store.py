"""The metadata store port and its embedded adapter (DESIGN, "Metadata and the cluster").

The cluster state is a small hierarchical store of JSON nodes with versions, laid out as Kafka kept it
on ZooKeeper:

    /cluster/id                                   {"version": "1", "id": "<cluster id>"}
    /brokers/ids/<id>                             {"host", "port", "rack", "endpoints"}   (ephemeral)
    /brokers/topics/<topic>                       {"version": 3, "topic_id", "partitions": {"0": [1, 2]}}
    /brokers/topics/<topic>/partitions/<p>/state  {"leader", "leader_epoch", "isr", "controller_epoch"}
    /config/topics/<topic>                        {"version": 1, "config": {...}}
    /config/brokers/<id> and /config/brokers/<default>
    /controller, /controller_epoch

Two adapters implement the port: `EmbeddedStore` here (one process; persisted to a file in the first
log dir so a restart finds its topics) and the ZooKeeper adapter (kazoo), which the cluster work adds.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Protocol


class NoNodeError(KeyError):
    pass


class NodeExistsError(KeyError):
    pass


class BadVersionError(ValueError):
    pass


class MetadataStore(Protocol):
    def get(self, path: str) -> tuple[dict, int]: ...
    def exists(self, path: str) -> bool: ...
    def children(self, path: str) -> list[str]: ...
    def create(self, path: str, value: dict, ephemeral: bool = False) -> None: ...
    def set(self, path: str, value: dict, version: int = -1) -> int: ...
    def delete(self, path: str, recursive: bool = False) -> None: ...
    def watch(self, prefix: str, callback: Callable[[str], None]) -> None: ...


class EmbeddedStore:
    """An in-process store; every change is written through to `path` (temp file, fsync, rename)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.nodes: dict[str, tuple[dict, int, bool]] = {}
        self.watches: list[tuple[str, Callable[[str], None]]] = []
        if path and os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            for p, (value, version) in saved.items():
                self.nodes[p] = (value, version, False)

    def get(self, path: str) -> tuple[dict, int]:
        try:
            value, version, _ = self.nodes[path]
        except KeyError:
            raise NoNodeError(path) from None
        return value, version

    def exists(self, path: str) -> bool:
        return path in self.nodes

    def children(self, path: str) -> list[str]:
        prefix = path.rstrip("/") + "/"
        out = set()
        for p in self.nodes:
            if p.startswith(prefix):
                out.add(p[len(prefix):].split("/", 1)[0])
        return sorted(out)

    def create(self, path: str, value: dict, ephemeral: bool = False) -> None:
        if path in self.nodes:
            raise NodeExistsError(path)
        self.nodes[path] = (value, 0, ephemeral)
        self._changed(path)

    def set(self, path: str, value: dict, version: int = -1) -> int:
        if path not in self.nodes:
            raise NoNodeError(path)
        _, current, eph = self.nodes[path]
        if version != -1 and version != current:
            raise BadVersionError(f"{path}: expected version {version}, found {current}")
        self.nodes[path] = (value, current + 1, eph)
        self._changed(path)
        return current + 1

    def delete(self, path: str, recursive: bool = False) -> None:
        if path not in self.nodes and not recursive:
            raise NoNodeError(path)
        prefix = path.rstrip("/") + "/"
        doomed = [p for p in self.nodes if p == path or (recursive and p.startswith(prefix))]
        for p in doomed:
            del self.nodes[p]
        self._changed(path)

    def watch(self, prefix: str, callback: Callable[[str], None]) -> None:
        self.watches.append((prefix, callback))

    def _changed(self, path: str) -> None:
        self._persist()
        for prefix, cb in list(self.watches):
            if path.startswith(prefix):
                cb(path)

    def _persist(self) -> None:
        if not self.path:
            return
        saved = {p: (v, ver) for p, (v, ver, eph) in self.nodes.items() if not eph}
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(saved, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
