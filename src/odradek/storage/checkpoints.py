"""Small text files in Kafka's formats: offset checkpoints, meta.properties, the clean-shutdown marker.

Offset checkpoint (log-dir root: recovery-point-offset-checkpoint, replication-offset-checkpoint,
log-start-offset-checkpoint, cleaner-offset-checkpoint), UTF-8 lines:

    0                     version
    2                     number of entries
    my-topic 0 1234       topic, partition, offset (space separated; topic names have no spaces)
    other 3 17

The leader-epoch-checkpoint in each partition directory has the same shape with "epoch start_offset"
entries (see epoch_cache.py). Every checkpoint is written to `<name>.tmp`, fsynced, renamed over the
old file, and the directory fsynced, so a reader sees the old or the new file, never a mix.

meta.properties (log-dir root), Java properties as Kafka writes them in ZooKeeper mode:

    version=0
    broker.id=1
    cluster.id=<22-char base64 uuid>

`.kafka_cleanshutdown` (log-dir root, empty): present only between a clean close and the next start.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from odradek.storage.errors import StorageError

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
REPLICATION_CHECKPOINT = "replication-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"  # per partition: the first dirty offset
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
META_PROPERTIES = "meta.properties"
CHECKPOINT_VERSION = 0
MAX_CHECKPOINT_BYTES = 64 * 1024 * 1024

TopicPartition = tuple[str, int]


def write_atomically(path: Path, text: str, *, sync: bool = True) -> None:
    """Write `text` to `path.tmp` and rename it over `path`; with `sync`, the file and the directory are
    fsynced (without, a later fsync of `path` and its directory makes it durable: `sync_file`)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data):]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if sync:
        fsync_dir(path.parent)


def sync_file(path: Path) -> bool:
    """fsync the file at `path` if there is one (False if not)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint_lines(path: Path, entries: Iterable[str], *, sync: bool = True) -> None:
    lines = list(entries)
    write_atomically(path, "".join(f"{line}\n" for line in [str(CHECKPOINT_VERSION),
                                                            str(len(lines)), *lines]), sync=sync)


def read_checkpoint_lines(path: Path, fields: int) -> list[list[str]] | None:
    """The entries of a checkpoint split into `fields` fields; None if the file does not exist."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CHECKPOINT_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(data) > MAX_CHECKPOINT_BYTES:
        raise StorageError(f"{path}: larger than {MAX_CHECKPOINT_BYTES} bytes")
    lines = data.decode().splitlines()
    try:
        version, count = int(lines[0]), int(lines[1])
    except (IndexError, ValueError):
        raise StorageError(f"{path}: malformed header") from None
    if version != CHECKPOINT_VERSION:
        raise StorageError(f"{path}: unknown checkpoint version {version}")
    entries = [line.split() for line in lines[2:] if line.strip()]
    if count != len(entries) or any(len(e) != fields for e in entries):
        raise StorageError(f"{path}: expected {count} entries of {fields} fields")
    return entries


class OffsetCheckpointFile:
    """One of the log-dir root's "topic partition offset" checkpoints."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        write_checkpoint_lines(self.path, (f"{topic} {partition} {offset}"
                                           for (topic, partition), offset in sorted(offsets.items())))

    def read(self) -> dict[TopicPartition, int]:
        entries = read_checkpoint_lines(self.path, 3)
        try:
            return {(t, int(p)): int(o) for t, p, o in entries or ()}
        except ValueError:
            raise StorageError(f"{self.path}: malformed entry") from None


@dataclass(frozen=True, slots=True)
class MetaProperties:
    broker_id: int
    cluster_id: str | None = None
    version: int = 0


def write_meta_properties(log_dir: Path, meta: MetaProperties) -> None:
    lines = ["#", f"version={meta.version}", f"broker.id={meta.broker_id}"]
    if meta.cluster_id is not None:
        lines.append(f"cluster.id={meta.cluster_id}")
    write_atomically(log_dir / META_PROPERTIES, "".join(f"{line}\n" for line in lines))


def read_meta_properties(log_dir: Path) -> MetaProperties | None:
    try:
        text = (log_dir / META_PROPERTIES).read_text()
    except FileNotFoundError:
        return None
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    try:
        return MetaProperties(broker_id=int(props["broker.id"]),
                              cluster_id=props.get("cluster.id"),
                              version=int(props.get("version", "0")))
    except (KeyError, ValueError):
        raise StorageError(f"{log_dir / META_PROPERTIES}: missing or bad broker.id") from None


def has_clean_shutdown_marker(log_dir: Path) -> bool:
    return (log_dir / CLEAN_SHUTDOWN_FILE).exists()


def write_clean_shutdown_marker(log_dir: Path) -> None:
    write_atomically(log_dir / CLEAN_SHUTDOWN_FILE, "")


def remove_clean_shutdown_marker(log_dir: Path) -> None:
    (log_dir / CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
    fsync_dir(log_dir)
