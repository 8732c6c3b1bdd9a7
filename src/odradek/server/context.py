"""What a request handler is given: a typed context of the broker's collaborators, never the broker
(DESIGN, "Layers": "Handlers receive a typed context of collaborators ... each collaborator has an
in-memory fake so handlers are unit-tested without sockets").

`Services` is built once per broker (`Broker.start`); a `RequestContext` is one request's view of it,
with the request header and the connection (and its listener) it came on. Collaborators:

- `replica_manager`: partitions, appends, reads, the high watermark, delayed produce and fetch;
- `metadata`: the metadata cache, the only thing handlers read about topics, brokers and configs;
- `coordinators`: the group coordinator runtime (transactions next) and its offsets topic;
- `controller`: the channel for changes the controller makes (topics, configs, producer ids;
  `controller_channel.py`);
- `log_dirs`: the log directories (DescribeLogDirs, AlterReplicaLogDirs);
- `workers`: the bounded worker pool for work that grows with its input; `clock`: milliseconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from odradek.protocol.headers import RequestHeader
from odradek.server.config import BrokerConfig
from odradek.server.controller_channel import ControllerChannel
from odradek.server.coordinators import Coordinators
from odradek.server.fetch_session import FetchSessionCache
from odradek.server.metadata_cache import MetadataCache
from odradek.server.network import Connection
from odradek.server.replica_manager import ReplicaManager
from odradek.server.workers import Workers

Clock = Callable[[], int]


class LogDirs(Protocol):
    """The log directories and the logs in each (the LogManager)."""

    @property
    def log_dirs(self) -> list[Path]: ...

    def logs(self) -> Iterator[tuple[tuple[str, int], Any]]: ...

    def get_log(self, topic: str, partition: int) -> Any: ...

    def log_dir_of(self, topic: str, partition: int) -> Path | None: ...

    def future_logs(self) -> Iterator[tuple[tuple[str, int], Any, Path]]:
        """Replicas being moved to another log dir: (partition, future log, destination dir)."""

    def alter_replica_log_dir(self, topic: str, partition: int, path: str, now_ms: int) -> bool:
        """Move a replica to the log dir `path` (AlterReplicaLogDirs); storage errors carry the code."""


@dataclass(frozen=True, slots=True)
class Services:
    broker_id: int
    clock: Clock
    metadata: MetadataCache
    replica_manager: ReplicaManager
    coordinators: Coordinators
    controller: ControllerChannel
    log_dirs: LogDirs
    workers: Workers
    fetch_sessions: FetchSessionCache
    api_versions: list[Any] = field(default_factory=list)   # ApiVersions' answer: what the handlers serve


@dataclass(slots=True)
class RequestContext:
    services: Services
    header: RequestHeader
    connection: Connection | None = None
    listener_name: str | None = None   # the listener the request came on (None: every listener)

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def broker_id(self) -> int:
        return self.services.broker_id

    @property
    def clock(self) -> Clock:
        return self.services.clock

    @property
    def config(self) -> BrokerConfig:
        """This broker's effective config (static and dynamic layers), as of the current image."""
        return self.services.metadata.image.config

    @property
    def metadata(self) -> MetadataCache:
        return self.services.metadata

    @property
    def replica_manager(self) -> ReplicaManager:
        return self.services.replica_manager

    @property
    def coordinators(self) -> Coordinators:
        return self.services.coordinators

    @property
    def controller(self) -> ControllerChannel:
        return self.services.controller

    @property
    def log_dirs(self) -> LogDirs:
        return self.services.log_dirs

    @property
    def workers(self) -> Workers:
        return self.services.workers

    @property
    def fetch_sessions(self) -> FetchSessionCache:
        return self.services.fetch_sessions
