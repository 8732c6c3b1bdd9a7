"""Producer state: what a partition knows of each idempotent or transactional producer, so that a
retried batch is appended once and a zombie producer is fenced (seed 003, "Message Delivery
Semantics"; KIP-98, KIP-360; Kafka's ProducerStateManager, whose behaviour and file format this
follows).

Per producer id: its epoch, the metadata of its last 5 data batches (a producer has at most 5
requests in flight, so a retry is always one of them), the max timestamp of its last batch, the
epoch of the last transaction coordinator that wrote a marker for it, and the first offset of its
open transaction.

Validation of a batch from a client (the leader's append), in Kafka's order:
- producer id but base_sequence < 0: INVALID_RECORD;
- same epoch and the exact sequence range of one of the cached batches: a duplicate; nothing is
  appended and the broker answers success with the original batch's offsets;
- epoch older than the producer's: INVALID_PRODUCER_EPOCH (Kafka answers this, not PRODUCER_FENCED,
  since 2.7, so a producer can abort and retry);
- newer epoch: the sequence must restart at 0 (OUT_OF_ORDER_SEQUENCE_NUMBER otherwise), unless the
  producer is unknown;
- same epoch: the first sequence must follow the last one, wrapping from INT32_MAX to 0
  (OUT_OF_ORDER_SEQUENCE_NUMBER otherwise);
- an unknown producer is accepted at any sequence: since KIP-360 (Kafka 2.5) the broker no longer
  answers UNKNOWN_PRODUCER_ID, as producers whose records were all deleted by retention must go on;
- a non-transactional batch while the producer's transaction is open: INVALID_TXN_STATE;
- while the producer's first transactional write is being verified with its transaction coordinator
  (KIP-890, `producer_verification.py`), a sequence above the lowest one seen meanwhile:
  OUT_OF_ORDER_SEQUENCE_NUMBER. Whether a transactional batch may start a transaction here at all
  (`is_verified`) is asked by the leader just before its append.
Batches copied by replication or read back from the log are applied without these checks.

A producer is expired, and forgotten, once it has no open transaction and its last batch's max
timestamp (the producer's clock for CreateTime, as in Kafka) is `producer.id.expiration.ms` (default
one day) in the past; checked at most every `producer.id.expiration.check.interval.ms` (ten minutes)
on append, and when a snapshot is loaded.

Snapshot files, `<offset>.snapshot` in the partition directory (offset zero-padded to 20 digits: the
state covers every batch below it), in Kafka's ProducerSnapshot format, version 1, big-endian:

    version                    int16   1
    crc                        uint32  CRC-32C of every byte after this field
    producer_entries           int32 count, then per producer:
      producer_id              int64
      epoch                    int16
      last_sequence            int32   -1 if the producer has no data batch cached
      last_offset              int64   last offset of its last data batch, -1 if none
      offset_delta             int32   last_offset minus that batch's first offset
      timestamp                int64   max timestamp of its last batch
      coordinator_epoch        int32   -1 if no marker was written for it
      current_txn_first_offset int64   -1 if no transaction is open

Open transactions: `ongoing` maps each producer with an open transaction to its first offset; the
smallest is the partition's first unstable offset, below which the last stable offset stays (the
high watermark caps it too). When a marker completes a transaction, `last_stable_offset(txn)` is
what the last stable offset becomes once it is written: the first offset of the earliest other open
transaction, or the offset after the marker (written into the transaction index, txn_index.py).

Only the last batch of each producer is kept in a snapshot, as in Kafka. A snapshot is written when
a segment rolls (at the new segment's base offset) and on clean shutdown (at the log end offset),
and is deleted with the segment that starts at its offset. On open the newest readable snapshot at
or below the log end offset is loaded (a corrupt one is deleted and the next older one tried) and
the batches after it are scanned, headers only, to rebuild the rest; after a clean shutdown with no
snapshot at all the log predates producer state and is not scanned (Kafka's upgrade shortcut).
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.records.batch import RecordBatch
from odradek.records.control import EndTransactionMarker
from odradek.records.crc import crc32c
from odradek.records.header import CONTROL_MASK, HEADER_SIZE, LOG_OVERHEAD, NO_PRODUCER_EPOCH, \
    NO_SEQUENCE, TRANSACTIONAL_MASK, BatchHeader
from odradek.storage.producer_verification import VerificationGuard, VerificationStates

log = logging.getLogger("odradek.storage.producer_state")

NUM_BATCHES_TO_RETAIN = 5
INT32_MAX = 2**31 - 1
NO_TIMESTAMP = -1
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_VERSION = 1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # producer.id.expiration.ms
# producer.id.expiration.check.interval.ms
DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS = 600_000
SCAN_WINDOW_BYTES = 64 * 1024

_SNAPSHOT_NAME = re.compile(r"^(\d{20})\.snapshot$")
_SNAPSHOT_HEAD = struct.Struct(">hI")
_COUNT = struct.Struct(">i")
_ENTRY = struct.Struct(">qhiqiqiq")
_HEADER = struct.Struct(">qiiBIhiqqqhii")


# ---- errors --------------------------------------------------------------------------------------

class ProducerStateError(Exception):
    """A batch the producer state refuses; `error_code` is the partition's answer."""

    error_code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR


class InvalidProducerEpochError(ProducerStateError):
    error_code = ErrorCode.INVALID_PRODUCER_EPOCH


class OutOfOrderSequenceError(ProducerStateError):
    error_code = ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidTxnStateError(ProducerStateError):
    error_code = ErrorCode.INVALID_TXN_STATE


class InvalidSequenceRecordError(ProducerStateError):
    error_code = ErrorCode.INVALID_RECORD


class TransactionCoordinatorFencedError(ProducerStateError):
    error_code = ErrorCode.TRANSACTION_COORDINATOR_FENCED


class CorruptSnapshotError(Exception):
    """A snapshot file that cannot be read: wrong version, bad CRC, truncated."""


# ---- sequences and entries -----------------------------------------------------------------------

def increment_sequence(sequence: int, increment: int) -> int:
    """`sequence + increment`, wrapping past INT32_MAX to 0 as producers do."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


class ProducerStateEntry:
    """One producer: its epoch and its last (at most 5) data batches, oldest first."""

    __slots__ = ("producer_id", "producer_epoch", "batches", "coordinator_epoch", "last_timestamp",
                 "current_txn_first_offset")

    def __init__(self, producer_id: int, producer_epoch: int = NO_PRODUCER_EPOCH,
                 coordinator_epoch: int = -1, last_timestamp: int = NO_TIMESTAMP,
                 current_txn_first_offset: int = -1, batches: Iterable[BatchMetadata] = ()) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.coordinator_epoch = coordinator_epoch
        self.last_timestamp = last_timestamp
        self.current_txn_first_offset = current_txn_first_offset
        self.batches: deque[BatchMetadata] = deque(batches, maxlen=NUM_BATCHES_TO_RETAIN)

    def copy(self) -> ProducerStateEntry:
        return ProducerStateEntry(self.producer_id, self.producer_epoch, self.coordinator_epoch,
                                  self.last_timestamp, self.current_txn_first_offset, self.batches)

    def __repr__(self) -> str:
        return (f"ProducerStateEntry(id={self.producer_id}, epoch={self.producer_epoch}, "
                f"batches={list(self.batches)}, txn_first_offset={self.current_txn_first_offset})")

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    @property
    def last_offset_delta(self) -> int:
        return self.batches[-1].offset_delta if self.batches else 0

    def maybe_update_epoch(self, epoch: int) -> None:
        if epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = epoch

    def add_batch(self, epoch: int, last_seq: int, last_offset: int, offset_delta: int,
                  timestamp: int) -> None:
        self.maybe_update_epoch(epoch)
        self.batches.append(BatchMetadata(last_seq, last_offset, offset_delta, timestamp))
        self.last_timestamp = timestamp

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.producer_epoch:
            return None
        for b in self.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return b
        return None


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass(slots=True)
class PreparedAppend:
    """The producer-state effect of an append, computed before anything is written: `duplicate` is
    the cached batch a retry repeats (then nothing is to be written), `updated` the new entries."""

    updated: dict[int, ProducerStateEntry] = field(default_factory=dict)
    completed_txns: list[CompletedTxn] = field(default_factory=list)
    duplicate: BatchMetadata | None = None
    transactional: set[int] = field(default_factory=set)   # producers with a transactional batch or marker


# ---- the manager ---------------------------------------------------------------------------------

class ProducerStateManager:
    """The producer state of one partition and its snapshot files. Not thread-safe."""

    def __init__(
            self, directory: Path, *,
            producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
            expiration_check_interval_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_CHECK_INTERVAL_MS,
    ) -> None:
        self.dir = directory
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.expiration_check_interval_ms = expiration_check_interval_ms
        self.producers: dict[int, ProducerStateEntry] = {}
        self.ongoing: dict[int, int] = {}   # producer id -> first offset of its open transaction
        self.map_end_offset = 0   # the state covers every batch below this offset
        self.last_snap_offset = 0
        self._snapshots = list_snapshot_offsets(directory)
        self._next_expiration_check_ms: int | None = None
        self.verification = VerificationStates()   # KIP-890: producers whose first write is being verified

    @property
    def snapshot_offsets(self) -> list[int]:
        return list(self._snapshots)

    @property
    def latest_snapshot_offset(self) -> int | None:
        return self._snapshots[-1] if self._snapshots else None

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    # ---- transaction verification (KIP-890, producer_verification.py) ----------------------------

    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        entry = self.producers.get(producer_id)
        return entry is not None and entry.current_txn_first_offset >= 0 and entry.producer_epoch == producer_epoch

    def maybe_start_verification(self, producer_id: int, sequence: int, producer_epoch: int, now_ms: int,
                                 supports_epoch_bump: bool = False) -> VerificationGuard | None:
        """The guard a first transactional write must carry; None when the producer's transaction is
        already open here at that epoch (nothing to verify)."""
        if self.has_ongoing_transaction(producer_id, producer_epoch):
            return None
        return self.verification.maybe_create(producer_id, sequence, producer_epoch, now_ms,
                                              supports_epoch_bump).guard

    def is_verified(self, producer_id: int, producer_epoch: int, guard: VerificationGuard | None) -> bool:
        """May a transactional batch of the producer be written with `guard` (Kafka's
        analyzeAndValidateProducerState check)?"""
        return self.has_ongoing_transaction(producer_id, producer_epoch) or self.verification.verify(producer_id, guard)

    # ---- appending -------------------------------------------------------------------------------

    def prepare(self, batches: Iterable, first_offset: int | None = None, *, validate: bool = True,
                log_append_time_ms: int | None = None, coordinator: bool = False) -> PreparedAppend:
        """Validate (`validate`: a client's batches at the leader) and compute the state after the
        batches. Leader appends pass `first_offset`, the offset the first batch will get (the
        batches are consecutive); otherwise each batch's own base offset counts. A coordinator's
        append (`coordinator`: transactional offset commits, Kafka's AppendOrigin.COORDINATOR) has
        its epochs checked but no sequence numbers. Changes nothing."""
        prepared = PreparedAppend()
        updated = prepared.updated
        known_epochs: dict[int, int] = {}
        next_offset = first_offset
        for h in batches:
            if next_offset is None:
                base = h.base_offset
            else:
                base, next_offset = next_offset, next_offset + h.last_offset_delta + 1
            pid = h.producer_id
            if pid < 0:
                continue
            last_offset = base + h.last_offset_delta
            is_control = bool(h.attributes & CONTROL_MASK)
            if h.attributes & TRANSACTIONAL_MASK:
                prepared.transactional.add(pid)
            if validate and not is_control and not coordinator:
                if h.base_sequence < 0:
                    raise InvalidSequenceRecordError(
                        f"invalid sequence number {h.base_sequence} in a batch of producer {pid}")
                verifying = self.verification.get(pid)
                if verifying is not None and h.base_sequence > verifying.lowest_sequence:
                    raise OutOfOrderSequenceError(
                        f"producer {pid}: sequence {h.base_sequence} while sequence {verifying.lowest_sequence} "
                        f"is being verified")
                current = self.producers.get(pid)
                if current is not None:
                    duplicate = current.find_duplicate(
                        h.producer_epoch, h.base_sequence,
                        increment_sequence(h.base_sequence, h.last_offset_delta))
                    if duplicate is not None:
                        return PreparedAppend(duplicate=duplicate)
            entry = updated.get(pid)
            if entry is None:
                current = self.producers.get(pid)
                known_epochs[pid] = NO_PRODUCER_EPOCH if current is None else current.producer_epoch
                entry = ProducerStateEntry(pid) if current is None else current.copy()
                updated[pid] = entry
            timestamp = h.max_timestamp if log_append_time_ms is None else log_append_time_ms
            if is_control:
                txn = _append_marker(entry, h, base, timestamp, validate)
                if txn is not None:
                    prepared.completed_txns.append(txn)
            else:
                _append_data(entry, h, base, last_offset, timestamp, known_epochs[pid], validate,
                             check_sequence=validate and not coordinator)
        return prepared

    def complete(self, prepared: PreparedAppend, end_offset: int,
                 now_ms: int | None = None) -> None:
        """Apply a prepared append once its batches are written; the state now covers offsets below
        `end_offset`. With `now_ms`, expired producers are removed when the check is due."""
        assert prepared.duplicate is None, "a duplicate is never written"
        self.producers.update(prepared.updated)
        for pid in prepared.transactional:
            self.verification.clear(pid)   # the transaction is open here now, or ended by a marker
        for pid, entry in prepared.updated.items():
            if entry.current_txn_first_offset >= 0:
                self.ongoing[pid] = entry.current_txn_first_offset
            else:
                self.ongoing.pop(pid, None)
        self.map_end_offset = max(self.map_end_offset, end_offset)
        if now_ms is not None:
            if self._next_expiration_check_ms is None:
                self._next_expiration_check_ms = now_ms + self.expiration_check_interval_ms
            elif now_ms >= self._next_expiration_check_ms:
                self.remove_expired_producers(now_ms)
                self._next_expiration_check_ms = now_ms + self.expiration_check_interval_ms

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest open transaction, None if none is open."""
        return min(self.ongoing.values()) if self.ongoing else None

    def last_stable_offset(self, txn: CompletedTxn) -> int:
        """The last stable offset once `txn`'s marker is written (Kafka's lastStableOffset)."""
        others = [first for pid, first in self.ongoing.items() if pid != txn.producer_id]
        return min(others) if others else txn.last_offset + 1

    def _rebuild_ongoing(self) -> None:
        self.ongoing = {pid: e.current_txn_first_offset for pid, e in self.producers.items()
                        if e.current_txn_first_offset >= 0}

    def is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        return entry.current_txn_first_offset < 0 \
            and now_ms - entry.last_timestamp >= self.producer_id_expiration_ms

    def remove_expired_producers(self, now_ms: int) -> int:
        expired = [pid for pid, e in self.producers.items() if self.is_expired(e, now_ms)]
        for pid in expired:
            del self.producers[pid]
        self.verification.remove_expired(now_ms, self.producer_id_expiration_ms)
        return len(expired)

    # ---- snapshots -------------------------------------------------------------------------------

    def update_map_end_offset(self, offset: int) -> None:
        self.map_end_offset = offset

    def take_snapshot(self, *, sync: bool = False) -> Path | None:
        """Write `<map_end_offset>.snapshot` unless the last one written is at or past it."""
        if self.map_end_offset <= self.last_snap_offset:
            return None
        path = snapshot_path(self.dir, self.map_end_offset)
        write_snapshot(path, self.producers.values(), sync=sync)
        if self.map_end_offset not in self._snapshots:
            self._snapshots.append(self.map_end_offset)
            self._snapshots.sort()
        self.last_snap_offset = self.map_end_offset
        return path

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int, now_ms: int) -> None:
        """Drop snapshots outside [log_start_offset, log_end_offset]; unless the state already ends
        at the log end, reload it from the newest readable snapshot (or start empty at the log
        start). The caller then replays the batches from `map_end_offset` on."""
        for offset in list(self._snapshots):
            if offset > log_end_offset or offset < log_start_offset:
                self._delete_snapshot(offset)
        if log_end_offset == self.map_end_offset:
            self.on_log_start_offset_incremented(log_start_offset)
            return
        self.producers.clear()
        while self._snapshots:
            offset = self._snapshots[-1]
            try:
                entries = read_snapshot(snapshot_path(self.dir, offset))
            except (CorruptSnapshotError, OSError) as e:
                log.warning("%s: dropping producer snapshot at %d: %s", self.dir.name, offset, e)
                self._delete_snapshot(offset)
                continue
            for entry in entries:
                if not self.is_expired(entry, now_ms):
                    self.producers[entry.producer_id] = entry
            self._rebuild_ongoing()
            self.map_end_offset = self.last_snap_offset = offset
            return
        self._rebuild_ongoing()
        self.map_end_offset = self.last_snap_offset = log_start_offset

    def truncate_fully_and_start_at(self, offset: int) -> None:
        self.producers.clear()
        self.ongoing.clear()
        for snapshot in list(self._snapshots):
            self._delete_snapshot(snapshot)
        self.last_snap_offset = 0
        self.map_end_offset = offset

    def on_log_start_offset_incremented(self, log_start_offset: int) -> None:
        if self.map_end_offset < log_start_offset:
            self.map_end_offset = log_start_offset
        self.last_snap_offset = self.latest_snapshot_offset or log_start_offset

    def delete_snapshots_before(self, offset: int) -> None:
        for snapshot in [s for s in self._snapshots if s < offset]:
            self._delete_snapshot(snapshot)

    def delete_snapshot(self, offset: int) -> None:
        """Remove the snapshot at `offset`, if any (its segment was merged away by the cleaner)."""
        if offset in self._snapshots:
            self._delete_snapshot(offset)

    def _delete_snapshot(self, offset: int) -> None:
        self._snapshots.remove(offset)
        snapshot_path(self.dir, offset).unlink(missing_ok=True)


def _append_data(entry: ProducerStateEntry, h, first_offset: int, last_offset: int, timestamp: int,
                 known_epoch: int, validate: bool, check_sequence: bool = True) -> None:
    pid, epoch, first_seq = entry.producer_id, h.producer_epoch, h.base_sequence
    if epoch < entry.producer_epoch:
        message = (f"epoch {epoch} of producer {pid} at offset {first_offset} is older than its "
                   f"last epoch {entry.producer_epoch}")
        if validate:
            raise InvalidProducerEpochError(message)
        log.warning("%s", message)
    if check_sequence:
        if epoch != entry.producer_epoch:
            if first_seq != 0 and entry.producer_epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"producer {pid}: new epoch {epoch} must start at sequence 0, not {first_seq}")
        elif known_epoch != NO_PRODUCER_EPOCH and not _in_sequence(entry.last_seq, first_seq):
            raise OutOfOrderSequenceError(
                f"producer {pid}: sequence {first_seq} at offset {first_offset} does not follow "
                f"{entry.last_seq}")
    last_seq = NO_SEQUENCE if first_seq < 0 else increment_sequence(first_seq, h.last_offset_delta)
    entry.add_batch(epoch, last_seq, last_offset, last_offset - first_offset, timestamp)
    transactional = bool(h.attributes & TRANSACTIONAL_MASK)
    if entry.current_txn_first_offset >= 0 and not transactional:
        if validate:
            raise InvalidTxnStateError(
                f"non-transactional batch from producer {pid} while its transaction is open")
    elif entry.current_txn_first_offset < 0 and transactional:
        entry.current_txn_first_offset = first_offset


def _append_marker(entry: ProducerStateEntry, h, offset: int, timestamp: int,
                   validate: bool) -> CompletedTxn | None:
    marker = _end_txn_marker(h, validate)
    if marker is None:
        return None  # an empty control batch: the cleaner removed the transaction
    pid, epoch = entry.producer_id, h.producer_epoch
    if epoch < entry.producer_epoch:
        message = (f"marker epoch {epoch} of producer {pid} at offset {offset} is older than its "
                   f"last epoch {entry.producer_epoch}")
        if validate:
            raise InvalidProducerEpochError(message)
        log.warning("%s", message)
    if entry.coordinator_epoch > marker.coordinator_epoch and validate:
        raise TransactionCoordinatorFencedError(
            f"coordinator epoch {marker.coordinator_epoch} of producer {pid} is older than "
            f"{entry.coordinator_epoch}")
    entry.maybe_update_epoch(epoch)
    entry.coordinator_epoch = marker.coordinator_epoch
    entry.last_timestamp = timestamp
    first = entry.current_txn_first_offset
    entry.current_txn_first_offset = -1
    if first < 0:
        return None
    return CompletedTxn(pid, first, offset, not marker.is_commit)


def _end_txn_marker(h, validate: bool) -> EndTransactionMarker | None:
    try:
        for record in RecordBatch(h.buf, h.pos).records(check_crc=False):
            return EndTransactionMarker.decode(record.key, record.value)
    except ProtocolError:
        if validate:
            raise
        log.warning("unreadable control batch at offset %d skipped", h.base_offset)
    return None


# ---- files ---------------------------------------------------------------------------------------

def snapshot_path(directory: Path, offset: int) -> Path:
    return directory / f"{offset:020d}{SNAPSHOT_SUFFIX}"


def list_snapshot_offsets(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_SNAPSHOT_NAME.match, names) if m)


def encode_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    body = bytearray(_COUNT.size)
    count = 0
    for e in entries:
        body += _ENTRY.pack(e.producer_id, e.producer_epoch, e.last_seq, e.last_data_offset,
                            e.last_offset_delta, e.last_timestamp, e.coordinator_epoch,
                            e.current_txn_first_offset)
        count += 1
    _COUNT.pack_into(body, 0, count)
    return _SNAPSHOT_HEAD.pack(SNAPSHOT_VERSION, crc32c(body)) + bytes(body)


def decode_snapshot(data: bytes) -> list[ProducerStateEntry]:
    if len(data) < _SNAPSHOT_HEAD.size + _COUNT.size:
        raise CorruptSnapshotError(f"{len(data)} bytes are too short for a snapshot")
    version, crc = _SNAPSHOT_HEAD.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"unknown snapshot version {version}")
    computed = crc32c(memoryview(data)[_SNAPSHOT_HEAD.size:])
    if computed != crc:
        raise CorruptSnapshotError(f"stored crc {crc:#010x}, computed {computed:#010x}")
    (count,) = _COUNT.unpack_from(data, _SNAPSHOT_HEAD.size)
    start = _SNAPSHOT_HEAD.size + _COUNT.size
    if count < 0 or len(data) != start + count * _ENTRY.size:
        raise CorruptSnapshotError(f"{count} entries do not fill {len(data) - start} bytes")
    entries = []
    for (pid, epoch, last_seq, last_offset, offset_delta, timestamp, coordinator_epoch,
         txn_first_offset) in _ENTRY.iter_unpack(memoryview(data)[start:]):
        batches = [BatchMetadata(last_seq, last_offset, offset_delta, timestamp)] \
            if last_offset >= 0 else []
        entries.append(ProducerStateEntry(pid, epoch, coordinator_epoch, timestamp,
                                          txn_first_offset if txn_first_offset >= 0 else -1,
                                          batches))
    return entries


def write_snapshot(path: Path, entries: Iterable[ProducerStateEntry], *,
                   sync: bool = False) -> None:
    """Write through a temporary file and rename, so a crash leaves the old file or the new one."""
    data = encode_snapshot(entries)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if sync:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_snapshot(path: Path) -> list[ProducerStateEntry]:
    return decode_snapshot(path.read_bytes())


# ---- rebuilding from the log ---------------------------------------------------------------------

class _ScannedHeader:
    """The header fields of a batch read from a segment file (no records)."""

    __slots__ = ("base_offset", "last_offset_delta", "max_timestamp", "attributes", "producer_id",
                 "producer_epoch", "base_sequence")

    def __init__(self, fields: tuple) -> None:
        (self.base_offset, _length, _epoch, _magic, _crc, self.attributes, self.last_offset_delta,
         _base_ts, self.max_timestamp, self.producer_id, self.producer_epoch, self.base_sequence,
         _count) = fields


def scan_producer_batches(fd: int, start: int, end: int, min_offset: int) -> Iterator:
    """Headers of the batches in file bytes [start, end) that carry a producer id and end at or
    after `min_offset`; control batches come whole (a BatchHeader over their bytes) for their
    marker."""
    window, window_pos, pos = b"", start, start
    while pos + HEADER_SIZE <= end:
        at = pos - window_pos
        if at + HEADER_SIZE > len(window):
            window, window_pos, at = os.pread(fd, min(SCAN_WINDOW_BYTES, end - pos), pos), pos, 0
            if len(window) < HEADER_SIZE:
                return
        fields = _HEADER.unpack_from(window, at)
        size = fields[1] + LOG_OVERHEAD
        if size < HEADER_SIZE or fields[3] != 2:
            return  # recovery has already cut the log at the first bad batch; stop at one anyway
        h = _ScannedHeader(fields)
        if h.producer_id >= 0 and h.base_offset + h.last_offset_delta >= min_offset:
            if h.attributes & CONTROL_MASK:
                yield BatchHeader(os.pread(fd, size, pos), 0)
            else:
                yield h
        pos += size


def load_producer_state(log, now_ms: int, *, clean_shutdown: bool = False) -> None:
    """Bring `log.producer_state` to the log end offset: load the newest snapshot at or below it,
    then replay the batches after the snapshot; write a snapshot at the log end offset."""
    state: ProducerStateManager = log.producer_state
    end = log.log_end_offset
    if clean_shutdown and state.latest_snapshot_offset is None:
        state.update_map_end_offset(end)  # the log predates producer state: nothing to replay
        state.take_snapshot()
        return
    state.truncate_and_reload(log.log_start_offset, end, now_ms)
    if end > state.map_end_offset:
        start = max(state.map_end_offset, log.log_start_offset)
        floor = min(state.ongoing.values(), default=end)
        prepared = state.prepare(_batches_after(log, start, end), validate=False)
        state.complete(prepared, end)
        # The exact last stable offset at each marker is not known here; a lower bound only makes a
        # read_committed search read further (txn_index.py), never miss an entry.
        floor = min([floor, *state.ongoing.values(), *(t.first_offset for t in prepared.completed_txns)])
        for txn in prepared.completed_txns:
            if txn.is_aborted:
                log.index_aborted_txn(txn, min(floor, txn.last_offset + 1))
    state.update_map_end_offset(end)
    state.take_snapshot()


def _batches_after(log, start: int, end: int) -> Iterator:
    segments = log.segments
    for i, segment in enumerate(segments):
        # By base offsets only: segments below the recovery point are never read here.
        if i + 1 < len(segments) and segments[i + 1].base_offset <= start:
            continue
        if segment.base_offset >= end:
            break
        first = segment.find_batch(start)
        if first is not None:
            yield from scan_producer_batches(segment.file.fileno(), first.position, segment.size,
                                             start)
