"""Durability of the embedded metadata store: a snapshot plus an append-only journal of multis.

Two files in the first log dir:

    odradek-metadata.json      the snapshot, the state after multi number `seq`:
                               {"format": 1, "seq": N, "nodes": {"<path>": [<value>, <version>], ...}}
    odradek-metadata.journal   one line per multi after that, in order:
                               "<crc32 of the JSON, 8 hex digits> <JSON>\\n" with JSON
                               {"seq": n, "ops": [["c", path, value] | ["s", path, value] | ["d", path], ...]}

Append: the line is written and fsynced, once per multi; only then does the store change its memory.
A write or fsync that fails raises StoreError, and the partial line is cut off (ftruncate to the last
good length) before anything else is appended, so the journal never holds garbage between good lines.

Load: the snapshot (none: empty; the single-file format of earlier versions, {path: [value, version]},
is read as a snapshot), then every journal line with a seq above the snapshot's, applied in order
("c" creates a node at version 0, "s" replaces its value and adds one to its version, "d" removes it).
The first incomplete line or line with a bad checksum ends the replay. If nothing follows it, it is the
torn tail of a write a crash cut short (never acknowledged, since the fsync had not returned) and it is
truncated away; if good lines follow, the journal is corrupt and StoreError is raised: a broker must
not start from metadata it cannot trust.

Compaction: when the journal has outgrown max(compact_min_bytes, the snapshot), the state is written to
a temp file, fsynced, renamed over the snapshot, the directory fsynced, and the journal truncated. A
crash between rename and truncation leaves lines with a seq at or below the snapshot's, which load
skips. A failed compaction (a full disk) is logged and tried again after the journal has grown by
another compact_min_bytes; it never fails the write that triggered it.

Cost: a multi costs its own bytes and one fsync; a compaction costs the state's size and happens only
after at least that many journal bytes, so the amortised cost of an operation does not grow with the
number of nodes.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from typing import BinaryIO, Callable

from odradek.cluster.store import StoreError, parent_of

log = logging.getLogger("odradek.cluster.journal")

METADATA_NAME = "odradek-metadata"
COMPACT_MIN_BYTES = 1 << 20
SNAPSHOT_FORMAT = 1

Opener = Callable[[str, str], BinaryIO]


def _default_opener(path: str, mode: str) -> BinaryIO:
    return open(path, mode, buffering=0)  # type: ignore[return-value]


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(f: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = f.write(view)
        if n is None or n <= 0:
            raise OSError(f"short write ({n}) to {getattr(f, 'name', f)}")
        view = view[n:]


def encode_line(seq: int, ops: list[tuple]) -> bytes:
    body = json.dumps({"seq": seq, "ops": [[k, p] if k == "d" else [k, p, v] for k, p, v in ops]},
                      separators=(",", ":")).encode()
    return b"%08x " % zlib.crc32(body) + body + b"\n"


def decode_line(line: bytes) -> tuple[int, list] | None:
    """(seq, ops) of one journal line without its newline, or None if it is damaged."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        entry = json.loads(body)
        return int(entry["seq"]), entry["ops"]
    except (ValueError, KeyError, TypeError):
        return None


def replay(nodes: dict[str, tuple[dict, int]], ops: list) -> None:
    for op in ops:
        kind, path = op[0], op[1]
        if kind == "c" and path not in nodes:
            nodes[path] = (op[2], 0)
        elif kind == "s" and path in nodes:
            nodes[path] = (op[2], nodes[path][1] + 1)
        elif kind == "d" and path in nodes:
            del nodes[path]
        else:
            raise StoreError(f"metadata journal does not match its snapshot: {kind} {path}")


class FileJournal:
    """The snapshot and journal files of one store. Not thread-safe: the store calls it under its lock."""

    def __init__(self, directory: str, name: str = METADATA_NAME, *, opener: Opener | None = None,
                 compact_min_bytes: int = COMPACT_MIN_BYTES) -> None:
        self.directory = directory
        self.snapshot_path = os.path.join(directory, name + ".json")
        self.journal_path = os.path.join(directory, name + ".journal")
        self.compact_min_bytes = compact_min_bytes
        self._open = opener or _default_opener
        self._file: BinaryIO | None = None
        self._size = 0              # bytes of whole, good lines
        self._dirty = False         # a failed append may have left bytes past _size
        self._seq = 0
        self._snapshot_bytes = 0
        self._compact_at = compact_min_bytes
        self.compactions = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def seq(self) -> int:
        return self._seq

    # ------------------------------------------------------------------------------------------ load
    def load(self) -> dict[str, tuple[dict, int]]:
        nodes, self._seq = self._read_snapshot()
        good = 0
        if os.path.exists(self.journal_path):
            with open(self.journal_path, "rb") as f:
                data = f.read()
            good = self._replay_journal(data, nodes)
            if good < len(data):
                log.warning("metadata journal: dropping a torn last line (%d bytes at byte %d)",
                            len(data) - good, good)
                os.truncate(self.journal_path, good)
        try:
            self._file = self._open(self.journal_path, "ab")
            fsync_dir(self.directory)
        except OSError as e:
            raise StoreError(f"cannot open the metadata journal {self.journal_path}: {e}") from e
        self._size = good
        self._compact_at = max(self.compact_min_bytes, self._snapshot_bytes)
        return nodes

    def _read_snapshot(self) -> tuple[dict[str, tuple[dict, int]], int]:
        if not os.path.exists(self.snapshot_path):
            return {}, 0
        try:
            with open(self.snapshot_path, "rb") as f:
                raw = f.read()
            saved = json.loads(raw)
        except (OSError, ValueError) as e:
            raise StoreError(f"cannot read the metadata snapshot {self.snapshot_path}: {e}") from e
        self._snapshot_bytes = len(raw)
        if isinstance(saved, dict) and saved.get("format") == SNAPSHOT_FORMAT:
            return {p: (v, ver) for p, (v, ver) in saved["nodes"].items()}, int(saved["seq"])
        # The single file of earlier versions: nodes only, without the parents ZooKeeper requires.
        nodes = {p: (v, ver) for p, (v, ver) in saved.items()}
        for path in list(nodes):
            parent = parent_of(path)
            while parent != "/" and parent not in nodes:
                nodes[parent] = ({}, 0)
                parent = parent_of(parent)
        return nodes, 0

    def _replay_journal(self, data: bytes, nodes: dict) -> int:
        """Apply the good lines; return the length of the good prefix. Raise on damage before the end."""
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            entry = decode_line(data[pos:end]) if end >= 0 else None
            if entry is None:
                rest = data[pos:]
                newline = rest.find(b"\n")
                if newline != -1 and newline != len(rest) - 1:
                    raise StoreError(f"metadata journal {self.journal_path} is damaged at byte {pos}, "
                                     "with more entries after the damage")
                return pos
            seq, ops = entry
            if seq > self._seq:
                if seq != self._seq + 1:
                    raise StoreError(f"metadata journal {self.journal_path}: entry {seq} follows {self._seq}")
                replay(nodes, ops)
                self._seq = seq
            pos = end + 1
        return pos

    # ------------------------------------------------------------------------------------------ append
    def append(self, ops: list[tuple]) -> None:
        """Make one multi durable: (kind, path, value) per change. Raises StoreError, leaving nothing."""
        assert self._file is not None, "load() first"
        line = encode_line(self._seq + 1, ops)
        try:
            if self._dirty:
                self._file.truncate(self._size)
                self._dirty = False
            self._dirty = True
            _write_all(self._file, line)
            os.fsync(self._file.fileno())
            self._dirty = False
        except OSError as e:
            self._cut_back()
            raise StoreError(f"metadata store write failed: {e.strerror or e}") from e
        self._size += len(line)
        self._seq += 1

    def _cut_back(self) -> None:
        assert self._file is not None
        try:
            self._file.truncate(self._size)
            self._dirty = False
        except OSError:
            pass    # still dirty: the next append truncates first

    # ------------------------------------------------------------------------------------------ compaction
    def maybe_compact(self, nodes: Callable[[], dict[str, list]]) -> None:
        if self._size < self._compact_at:
            return
        try:
            self.compact(nodes())
        except (OSError, StoreError) as e:
            self._compact_at = self._size + self.compact_min_bytes
            log.warning("metadata journal compaction failed (will try again later): %s", e)

    def compact(self, nodes: dict[str, list]) -> None:
        data = json.dumps({"format": SNAPSHOT_FORMAT, "seq": self._seq, "nodes": nodes},
                          separators=(",", ":")).encode()
        tmp = self.snapshot_path + ".tmp"
        try:
            with self._open(tmp, "wb") as f:
                _write_all(f, data)
                os.fsync(f.fileno())
            os.replace(tmp, self.snapshot_path)
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        fsync_dir(self.directory)
        self._snapshot_bytes = len(data)
        self._compact_at = max(self.compact_min_bytes, self._snapshot_bytes)
        self.compactions += 1
        assert self._file is not None
        try:
            self._file.truncate(0)
            os.fsync(self._file.fileno())
            self._size = 0
            self._dirty = False
        except OSError as e:   # the old lines are all at or below the snapshot's seq: load skips them
            log.warning("metadata journal: truncation after compaction failed: %s", e)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
