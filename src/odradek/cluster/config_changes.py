"""Config change notifications: how a config written through one broker reaches every broker of a
cluster on ZooKeeper (seed 003, "AlterConfigs API"; Kafka's ZooKeeper-era AdminZkClient.changeConfigs,
ZkNodeChangeNotificationListener and ConfigChangeNotification v2).

Nodes, as Kafka writes them:

    /config/topics/<t>                        {"version": 1, "config": {name: value}}
    /config/brokers/<id>, /config/brokers/<default>
                                              the same shape: a dynamic broker layer
    /config/changes/config_change_<seq>       {"version": 2, "entity_path": "topics/<t>"}
                                              (persistent sequential; entity paths "topics/<t>",
                                              "brokers/<id>", "brokers/<default>")

A change writes the entity's config node and a notification in one multi (Kafka writes them one after
the other). Every broker watches /config/changes; on each change it reads the notifications numbered
above the last one it processed, in order, reads the named entities' configs and applies them (its
metadata image, its partitions' logs, its dynamic broker layers). Entities of other kinds (users,
clients, ips: quotas) are skipped, as are notifications that do not parse. A broker processes every
notification present when it starts, as Kafka's listener does (the configs were read at start too, so
this only repeats them).

Notifications older than `CHANGE_EXPIRATION_MS` (Kafka's changeExpirationMs, 15 minutes) by their
creation time are deleted by the controller.

Every function here blocks on the store: run them on the store's thread, never on the event loop.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from odradek.cluster.store import Create, MetadataStore, NodeExistsError, NoNodeError, Op, SetData

log = logging.getLogger("odradek.cluster")

CONFIG_CHANGES_PATH = "/config/changes"
CHANGE_PREFIX = "config_change_"
CHANGE_EXPIRATION_MS = 15 * 60 * 1000
TOPICS = "topics"
BROKERS = "brokers"
DEFAULT_BROKER = "<default>"
SEQUENCE_DIGITS = 10


def topic_entity(name: str) -> str:
    return f"{TOPICS}/{name}"


def broker_entity(broker_id: int | None) -> str:
    """`brokers/<id>`, or the cluster-wide default layer `brokers/<default>` for None."""
    return f"{BROKERS}/{DEFAULT_BROKER if broker_id is None else broker_id}"


def entity_config_path(entity_path: str) -> str:
    return f"/config/{entity_path}"


def notification(entity_path: str) -> Create:
    return Create(f"{CONFIG_CHANGES_PATH}/{CHANGE_PREFIX}", {"version": 2, "entity_path": entity_path},
                  sequential=True)


def change_number(name: str) -> int | None:
    """The sequence number of a notification's node name; None for any other name."""
    digits = name[len(CHANGE_PREFIX):]
    if not name.startswith(CHANGE_PREFIX) or len(digits) != SEQUENCE_DIGITS or not digits.isdigit():
        return None
    return int(digits)


def config_write_ops(store: MetadataStore, changes: Mapping[str, Mapping[str, str]]) -> list[Op]:
    """Per entity path: its config node (created or replaced) and a notification naming it."""
    ops: list[Op] = []
    for entity_path, configs in changes.items():
        path = entity_config_path(entity_path)
        value = {"version": 1, "config": dict(configs)}
        ops.append(SetData(path, value) if store.exists(path) else Create(path, value))
    ops.extend(notification(e) for e in changes)
    return ops


def write_configs(store: MetadataStore, changes: Mapping[str, Mapping[str, str]]) -> None:
    """Record the configs of these entities and notify every broker, in one multi. A config node
    created by another writer between the existence check and the write makes it go again."""
    for attempt in range(3):
        try:
            store.multi(config_write_ops(store, changes))
            return
        except (NodeExistsError, NoNodeError):
            if attempt == 2:
                raise


def _entity(node: dict) -> str | None:
    entity = node.get("entity_path")
    if node.get("version") != 2 or not isinstance(entity, str) or "/" not in entity:
        return None
    kind, _, name = entity.partition("/")
    return entity if kind in (TOPICS, BROKERS) and name else None


def read_changes(store: MetadataStore, after: int) -> tuple[list[str], int]:
    """The entity paths named by the notifications numbered above `after`, in order (each once), and
    the last number seen (`after` if there is none)."""
    numbered = sorted((n, c) for c in store.children(CONFIG_CHANGES_PATH)
                      if (n := change_number(c)) is not None and n > after)
    entities: list[str] = []
    last = after
    for number, child in numbered:
        last = number
        try:
            node, _ = store.get(f"{CONFIG_CHANGES_PATH}/{child}")
        except NoNodeError:       # purged meanwhile: older than anything a broker still needs
            continue
        entity = _entity(node)
        if entity is None:
            log.info("ignoring config change notification %s: %s", child, node)
        elif entity not in entities:
            entities.append(entity)
    return entities, last


def read_configs(store: MetadataStore, entity_paths: Iterable[str]) -> dict[str, dict[str, str]]:
    """The config of each entity ({} for one without a node)."""
    out = {}
    for entity in entity_paths:
        try:
            out[entity] = {str(k): str(v) for k, v in store.get(entity_config_path(entity))[0].get("config", {}).items()}
        except NoNodeError:
            out[entity] = {}
    return out


def purge_expired_changes(store: MetadataStore, now_ms: int, expiration_ms: int = CHANGE_EXPIRATION_MS) -> list[str]:
    """Delete the notifications created more than `expiration_ms` before `now_ms`; their names."""
    purged = []
    for child in store.children(CONFIG_CHANGES_PATH):
        if change_number(child) is None:
            continue
        path = f"{CONFIG_CHANGES_PATH}/{child}"
        try:
            if now_ms - store.created_ms(path) > expiration_ms:
                store.delete(path)
                purged.append(child)
        except NoNodeError:       # another purger was first
            continue
    return purged
