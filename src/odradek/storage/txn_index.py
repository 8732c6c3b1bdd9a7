"""TransactionIndex: the aborted transactions whose ABORT marker is in one segment, so that a
read_committed fetch can tell the consumer which batches to drop (seed 003, "Message Delivery
Semantics"; KIP-98; Kafka's TransactionIndex, whose file format this is).

File `<base offset>.txnindex` next to the segment's `.log`, created with the first entry. Entries
are appended in the order of their markers, so `last_offset` increases from entry to entry. Each
entry is 34 bytes, big-endian:

    version              int16   0
    producer_id          int64
    first_offset         int64   the transaction's first data offset in this partition
    last_offset          int64   the offset of its ABORT marker
    last_stable_offset   int64   the last stable offset once the marker was written

A fetch from offset F whose data ends before offset U needs every aborted transaction with
last_offset >= F and first_offset < U. Segments are searched from the one holding F onward; the
search can stop at an entry whose last_stable_offset >= U, because every transaction that could
still overlap [F, U) was complete by then (Kafka's TxnIndexSearchResult.isComplete).

Invariants: last_offset increases; an append at or below the last entry's last_offset is a replay of
an entry already written (after recovery) and is ignored. A truncated tail (a torn write) is cut
to whole entries when the file is opened.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

TXN_INDEX_SUFFIX = ".txnindex"
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size   # 34
VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return ENTRY.pack(VERSION, self.producer_id, self.first_offset, self.last_offset,
                          self.last_stable_offset)


class TransactionIndex:
    """The entries of one segment's `.txnindex`; reads go to the file (it is small and rarely read
    for topics without aborted transactions: a missing file is an empty index)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last_offset: int | None = None   # None: not read yet
        self._size: int | None = None

    def _load_tail(self) -> None:
        if self._size is not None:
            return
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            self._size, self._last_offset = 0, -1
            return
        whole = size - size % ENTRY_SIZE
        if whole != size:
            os.truncate(self.path, whole)
        self._size = whole
        self._last_offset = -1
        if whole:
            with open(self.path, "rb") as f:
                f.seek(whole - ENTRY_SIZE)
                self._last_offset = ENTRY.unpack(f.read(ENTRY_SIZE))[3]

    @property
    def empty(self) -> bool:
        self._load_tail()
        return not self._size

    @property
    def last_offset(self) -> int:
        """The last entry's marker offset, -1 if there is none."""
        self._load_tail()
        assert self._last_offset is not None
        return self._last_offset

    def append(self, txn: AbortedTxn) -> bool:
        """Add an entry; False (and nothing written) if its marker is not after the last entry's."""
        if txn.last_offset <= self.last_offset:
            return False
        with open(self.path, "ab") as f:
            f.write(txn.encode())
        assert self._size is not None
        self._size += ENTRY_SIZE
        self._last_offset = txn.last_offset
        return True

    def entries(self) -> list[AbortedTxn]:
        self._load_tail()
        if not self._size:
            return []
        with open(self.path, "rb") as f:
            data = f.read(self._size)
        out = []
        for version, pid, first, last, lso in ENTRY.iter_unpack(data[:len(data) - len(data) % ENTRY_SIZE]):
            if version < 0:
                break
            out.append(AbortedTxn(pid, first, last, lso))
        return out

    def collect(self, fetch_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """(entries overlapping [fetch_offset, upper_bound_offset), whether the search is complete)."""
        found = []
        for e in self.entries():
            if e.last_offset >= fetch_offset and e.first_offset < upper_bound_offset:
                found.append(e)
            if e.last_stable_offset >= upper_bound_offset:
                return found, True
        return found, False

    def truncate_to(self, offset: int) -> None:
        """Remove the entries whose marker is at or after `offset`."""
        if self.last_offset < offset:
            return
        keep = [e for e in self.entries() if e.last_offset < offset]
        os.truncate(self.path, len(keep) * ENTRY_SIZE)
        self._size = len(keep) * ENTRY_SIZE
        self._last_offset = keep[-1].last_offset if keep else -1

    def reset(self) -> None:
        """Forget every entry (the segment is being rebuilt by recovery)."""
        self.path.unlink(missing_ok=True)
        self._size, self._last_offset = 0, -1

    def rename(self, path: Path) -> None:
        if self.path.exists():
            os.replace(self.path, path)
        self.path = path

    def delete(self) -> None:
        self.path.unlink(missing_ok=True)
        self.forget()

    def forget(self) -> None:
        """Drop what is held in memory (the file is being removed)."""
        self._size, self._last_offset = 0, -1
