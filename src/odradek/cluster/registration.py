"""Broker registration and controller election through the store port (seed 003, "Replication": one
broker is the controller; Kafka's KafkaZkClient registerBroker, registerControllerAndIncrementControllerEpoch).

Nodes, as Kafka kept them on ZooKeeper:

    /brokers/ids/<id>     ephemeral, version 5: {"version", "host", "port", "endpoints": ["PLAINTEXT://h:p"],
                          "listener_security_protocol_map", "rack", "jmx_port", "timestamp", "features"}
    /controller           ephemeral: {"version": 1, "brokerid": <id>, "timestamp": "<ms>"}
    /controller_epoch     persistent: the epoch, a bare number

A broker becomes controller by creating `/controller` and bumping `/controller_epoch` in one multi, the
epoch's write conditional on the version it read; so two brokers never both win, and every controller
has a larger epoch than the ones before it. A controller's writes carry a check of the epoch node's
version (`fenced`), so a stale controller (a paused process whose session has expired and whose place
was taken) has every write refused with BadVersionError instead of overwriting its successor's.
Ephemeral nodes vanish with their ZooKeeper session: a dead broker leaves `/brokers/ids`, a dead
controller leaves `/controller` free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from odradek.cluster.store import (
    BadVersionError, CheckVersion, Create, MetadataStore, NodeExistsError, NoNodeError, Op, SetData,
)

BROKER_IDS_PATH = "/brokers/ids"
CONTROLLER_PATH = "/controller"
CONTROLLER_EPOCH_PATH = "/controller_epoch"


@dataclass(frozen=True)
class Endpoint:
    listener: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


def broker_node(endpoints: Sequence[Endpoint], rack: str | None, timestamp_ms: int) -> dict:
    """Kafka's version 5 broker registration."""
    first = endpoints[0]
    return {"version": 5, "host": first.host, "port": first.port, "jmx_port": -1,
            "endpoints": [f"{e.listener}://{e.host}:{e.port}" for e in endpoints],
            "listener_security_protocol_map": {e.listener: e.security_protocol for e in endpoints},
            "rack": rack, "timestamp": str(timestamp_ms), "features": {}}


def parse_endpoints(node: dict) -> list[Endpoint]:
    protocols = node.get("listener_security_protocol_map") or {}
    out = []
    for text in node.get("endpoints") or ():
        listener, _, address = text.partition("://")
        host, _, port = address.rpartition(":")
        out.append(Endpoint(listener, host.strip("[]"), int(port), protocols.get(listener, "PLAINTEXT")))
    return out


def register_broker(store: MetadataStore, broker_id: int, node: dict) -> None:
    """Create this broker's ephemeral registration. NodeExistsError if a live broker holds the id
    (Kafka refuses to start then; a node left by our own expired session disappears with it)."""
    store.create(f"{BROKER_IDS_PATH}/{broker_id}", node, ephemeral=True)


def live_brokers(store: MetadataStore) -> dict[int, dict]:
    out = {}
    for child in store.children(BROKER_IDS_PATH):
        try:
            out[int(child)] = store.get(f"{BROKER_IDS_PATH}/{child}")[0]
        except (NoNodeError, ValueError):
            continue            # went away between the listing and the read, or not ours
    return out


@dataclass(frozen=True)
class ControllerLease:
    """What a broker holds while it is the controller."""
    broker_id: int
    epoch: int
    epoch_zk_version: int       # the version of /controller_epoch this controller wrote

    def fenced(self, ops: Sequence[Op]) -> list[Op]:
        """`ops` made conditional on this controller still being the latest one."""
        return [CheckVersion(CONTROLLER_EPOCH_PATH, self.epoch_zk_version), *ops]


def current_controller(store: MetadataStore) -> int | None:
    try:
        return int(store.get(CONTROLLER_PATH)[0]["brokerid"])
    except (NoNodeError, KeyError, ValueError, TypeError):
        return None


def controller_epoch(store: MetadataStore) -> tuple[int, int]:
    """(epoch, version of its node); (0, -1) before any controller existed."""
    try:
        value, version = store.get(CONTROLLER_EPOCH_PATH)
    except NoNodeError:
        return 0, -1
    return int(value.get("value", value.get("epoch", 0))), version


def try_become_controller(store: MetadataStore, broker_id: int, now_ms: int) -> ControllerLease | None:
    """One attempt: the lease if this broker is now the controller, None if another one is."""
    if current_controller(store) is not None:
        return None
    epoch, version = controller_epoch(store)
    claim = Create(CONTROLLER_PATH, {"version": 1, "brokerid": broker_id, "timestamp": str(now_ms)},
                   ephemeral=True)
    bump = (Create(CONTROLLER_EPOCH_PATH, {"value": epoch + 1}) if version == -1
            else SetData(CONTROLLER_EPOCH_PATH, {"value": epoch + 1}, version))
    try:
        results = store.multi([claim, bump])
    except (NodeExistsError, BadVersionError):
        return None             # another broker won the race
    new_version = results[1]
    assert new_version is not None
    return ControllerLease(broker_id, epoch + 1, new_version)
