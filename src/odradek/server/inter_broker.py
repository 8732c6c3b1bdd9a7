"""Connections from this broker to the others (seed 003, "Replication": followers fetch from leaders;
the controller sends LeaderAndIsr, UpdateMetadata and StopReplica; Kafka's ControllerChannelManager and
the broker-to-controller channel).

`BrokerChannels` keeps at most one connection per (purpose, broker) (the controller's requests, each
replica fetcher's, the forwarding of requests to the controller) so that a slow purpose never queues
behind another. Connections are opened on first use with the endpoint the broker registered for the
inter-broker listener (`inter.broker.listener.name`, else the first one), and dropped on any error: the
next request opens a new one. Every request has a deadline.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from odradek.client.errors import KafkaError
from odradek.client.network import BrokerConnection

log = logging.getLogger("odradek.inter_broker")

Address = tuple[str, int]
# Followers fetch by topic name (Fetch v12, the last version before topic ids), as Kafka's ZooKeeper-era
# brokers did whenever a topic id was not known yet.
VERSION_CAPS = {1: 12}
# Versions only brokers send, above what the client package speaks to brokers: AddPartitionsToTxn v4+
# (KIP-890's verification, several transactions per request) goes from partition leaders to
# transaction coordinators.
BROKER_ONLY_VERSIONS = {24: (4, 5)}


class BrokerUnreachable(Exception):
    """A request to another broker could not be sent or answered."""


class BrokerChannels:
    def __init__(self, broker_id: int, address_of: Callable[[int], Address | None], *,
                 request_timeout_ms: int = 30_000, connect_timeout_ms: int = 10_000) -> None:
        self.broker_id = broker_id
        self.address_of = address_of
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._conns: dict[tuple[str, int], tuple[Address, BrokerConnection]] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def request(self, purpose: str, broker_id: int, api_key: int, body: Any, *,
                      timeout_ms: int | None = None) -> Any:
        """Send `body` to `broker_id` on the `purpose` connection; its response. Raises BrokerUnreachable."""
        conn = await self._connection(purpose, broker_id)
        try:
            return await conn.request(api_key, body, timeout_ms=timeout_ms or self.request_timeout_ms)
        except (KafkaError, OSError, asyncio.TimeoutError) as e:
            self.drop(purpose, broker_id)
            raise BrokerUnreachable(f"broker {broker_id}: {e}") from e

    async def _connection(self, purpose: str, broker_id: int) -> BrokerConnection:
        key = (purpose, broker_id)
        address = self.address_of(broker_id)
        if address is None:
            raise BrokerUnreachable(f"broker {broker_id} is not registered")
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            held = self._conns.get(key)
            if held is not None and held[0] == address and not held[1].closed:
                return held[1]
            if held is not None:
                held[1].close()
            try:
                conn = await BrokerConnection.connect(
                    address[0], address[1], node_id=broker_id, client_id=f"broker-{self.broker_id}-{purpose}",
                    request_timeout_ms=self.request_timeout_ms, connect_timeout_ms=self.connect_timeout_ms,
                    max_in_flight_requests=1)
            except (KafkaError, OSError) as e:
                raise BrokerUnreachable(f"broker {broker_id} at {address[0]}:{address[1]}: {e}") from e
            for api_key, cap in VERSION_CAPS.items():    # what brokers send by name, not topic id
                if api_key in conn.conn.versions:
                    conn.conn.versions[api_key] = min(conn.conn.versions[api_key], cap)
            for api_key, (low, top) in BROKER_ONLY_VERSIONS.items():
                theirs = conn.conn.broker_ranges.get(api_key)
                if theirs is not None and theirs[1] >= low:
                    conn.conn.versions[api_key] = min(theirs[1], top)
            self._conns[key] = (address, conn)
            return conn

    def drop(self, purpose: str, broker_id: int) -> None:
        held = self._conns.pop((purpose, broker_id), None)
        if held is not None:
            held[1].close()

    def drop_broker(self, broker_id: int) -> None:
        for key in [k for k in self._conns if k[1] == broker_id]:
            self.drop(*key)

    def close(self) -> None:
        for _, conn in self._conns.values():
            conn.close()
        self._conns.clear()
