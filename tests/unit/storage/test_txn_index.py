"""Transactions in the log: the last stable offset, the transaction index (.txnindex, Kafka's 34-byte
entries) and the aborted transactions a read_committed fetch is told about, across a restart, a kill
(unclean open) and a replica truncation."""

from __future__ import annotations

import struct
from pathlib import Path

from odradek.records.builder import RecordBatchBuilder
from odradek.records.control import ABORT, COMMIT, EndTransactionMarker, build_end_txn_marker_batch
from odradek.storage.txn_index import ENTRY_SIZE, AbortedTxn, TransactionIndex
from odradek.storage.config import LogConfig
from odradek.storage.log import Log
from tests.unit.storage.logutil import SMALL, open_log

SEQ: dict[int, int] = {}


def txn_batch(pid: int, count: int = 2, epoch: int = 0) -> bytearray:
    seq = SEQ.get(pid, 0)
    SEQ[pid] = seq + count
    b = RecordBatchBuilder(producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    for i in range(count):
        b.append(b"k", b"v%d" % i, timestamp=1_000)
    return bytearray(b.build())


def marker(pid: int, commit: bool, epoch: int = 0, coordinator_epoch: int = 0) -> bytearray:
    return bytearray(build_end_txn_marker_batch(EndTransactionMarker(COMMIT if commit else ABORT, coordinator_epoch),
                                                producer_id=pid, producer_epoch=epoch, timestamp=1_000))


def setup_function() -> None:
    SEQ.clear()


def test_index_file_format_and_bounds(tmp_path: Path) -> None:
    idx = TransactionIndex(tmp_path / "00000000000000000000.txnindex")
    assert idx.empty and idx.entries() == []
    assert idx.append(AbortedTxn(7, 0, 5, 6))
    assert idx.append(AbortedTxn(8, 3, 9, 10))
    assert not idx.append(AbortedTxn(7, 0, 5, 6)), "a replayed entry is not written twice"
    raw = idx.path.read_bytes()
    assert len(raw) == 2 * ENTRY_SIZE == 68
    assert struct.unpack(">hqqqq", raw[:34]) == (0, 7, 0, 5, 6)
    found, complete = idx.collect(6, 100)
    assert [e.producer_id for e in found] == [8] and not complete
    found, complete = idx.collect(0, 4)
    assert [e.producer_id for e in found] == [7] and complete, "stable past the bound: search done"
    found, complete = idx.collect(0, 20)
    assert [e.producer_id for e in found] == [7, 8] and not complete
    idx.truncate_to(9)
    assert [e.last_offset for e in idx.entries()] == [5]
    with open(idx.path, "ab") as f:            # a torn entry is cut on open
        f.write(b"\x00" * 10)
    again = TransactionIndex(idx.path)
    assert again.last_offset == 5 and len(again.path.read_bytes()) == ENTRY_SIZE


def test_last_stable_offset_and_aborted_transactions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.append(bytearray(txn_batch(1)), 0, 0)                 # 0-1 producer 1
    assert log.first_unstable_offset == 0
    log.append(bytearray(txn_batch(2)), 0, 0)                 # 2-3 producer 2
    log.append(marker(1, commit=False), 0, 0)                 # 4 abort 1
    assert log.first_unstable_offset == 2
    log.append(marker(2, commit=True), 0, 0)                  # 5 commit 2
    assert log.first_unstable_offset is None
    aborted = log.collect_aborted_transactions(0, log.log_end_offset)
    assert aborted == [AbortedTxn(1, 0, 4, 2)]                # LSO then: producer 2 still open at 2
    assert log.collect_aborted_transactions(5, 6) == []
    seg = log.segments[0]
    assert seg.txn_index.path.name == "00000000000000000000.txnindex"
    log.close()
    reopened = open_log(tmp_path)
    assert reopened.collect_aborted_transactions(0, 6) == aborted
    reopened.append(bytearray(txn_batch(3)), 0, 0)            # 6-7, left open across a restart
    reopened.close()
    third = open_log(tmp_path)
    assert third.first_unstable_offset == 6
    third.close()


def test_unclean_open_rebuilds_the_index_and_truncation_cuts_it(tmp_path: Path) -> None:
    log = open_log(tmp_path, segment_bytes=400)
    for round_ in range(6):
        pid = 10 + round_
        log.append(txn_batch(pid), 0, 0)
        log.append(marker(pid, commit=round_ % 2 == 1), 0, 0)
    expected = log.collect_aborted_transactions(0, log.log_end_offset)
    assert [a.producer_id for a in expected] == [10, 12, 14]
    assert len(log.segments) > 1, "markers spread over several segments"
    for seg in log.segments:                                    # a kill: the .txnindex files are lost
        seg.txn_index.delete()
    for snap in tmp_path.glob("topic-0/*.snapshot"):
        snap.unlink()
    for seg in log.segments:
        seg.file.close()
    rebuilt = Log.open(tmp_path / "topic-0", LogConfig(**{**SMALL, "segment_bytes": 400}), now_ms=0,
                       needs_recovery=True)
    assert [a.producer_id for a in rebuilt.collect_aborted_transactions(0, rebuilt.log_end_offset)] == [10, 12, 14]
    last_abort = expected[-1].last_offset
    rebuilt.truncate_to(last_abort, 0)                          # a follower cuts the last abort marker
    assert [a.producer_id for a in rebuilt.collect_aborted_transactions(0, rebuilt.log_end_offset)] == [10, 12]
    assert rebuilt.first_unstable_offset == expected[-1].first_offset   # its transaction is open again
    rebuilt.close()
