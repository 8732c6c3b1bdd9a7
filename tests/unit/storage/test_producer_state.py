"""Producer state: deduplication, sequence and epoch checks, snapshots, rebuild from the log."""

import struct

import pytest
from crc32c import crc32c

from odradek.records.control import COMMIT, EndTransactionMarker, build_end_txn_marker_batch
from odradek.records.header import TRANSACTIONAL_MASK, BatchHeader
from odradek.storage.log import Log
from odradek.storage.producer_state import (
    INT32_MAX, CorruptSnapshotError, InvalidProducerEpochError, InvalidSequenceRecordError,
    InvalidTxnStateError, OutOfOrderSequenceError, ProducerStateEntry, ProducerStateManager,
    decode_snapshot, decrement_sequence, encode_snapshot, increment_sequence, list_snapshot_offsets,
    read_snapshot, snapshot_path,
)
from odradek.storage.retention import apply_retention
from tests.unit.storage.batches import batch
from tests.unit.storage.logutil import open_log, read_all

PID = 1000


def pbatch(seq: int, records: int = 1, *, pid: int = PID, epoch: int = 0, ts: int = 1_000,
           transactional: bool = False, size: int = 20) -> bytearray:
    return bytearray(batch([b"x" * size] * records, base_offset=555, base_timestamp=ts,
                           producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                           attributes=TRANSACTIONAL_MASK if transactional else 0))


def header(raw, base_offset: int | None = None) -> BatchHeader:
    raw = bytearray(raw)
    if base_offset is not None:
        struct.pack_into(">q", raw, 0, base_offset)
    return BatchHeader(raw, 0)


class Driver:
    """Leader appends against a bare manager: offsets assigned from a running end offset."""

    def __init__(self, tmp_path) -> None:
        self.state = ProducerStateManager(tmp_path)
        self.end = 0

    def append(self, raw, now_ms: int | None = None):
        h = header(raw)
        prepared = self.state.prepare([h], self.end)
        if prepared.duplicate is not None:
            return prepared.duplicate
        first = self.end
        self.end += h.last_offset_delta + 1
        self.state.complete(prepared, self.end, now_ms)
        return first


# ---- sequences -----------------------------------------------------------------------------------

def test_sequences_wrap_at_int32_max():
    assert increment_sequence(5, 3) == 8
    assert increment_sequence(INT32_MAX, 1) == 0
    assert increment_sequence(INT32_MAX - 1, 3) == 1
    assert decrement_sequence(1, 3) == INT32_MAX - 1
    assert decrement_sequence(8, 3) == 5


# ---- the state machine ---------------------------------------------------------------------------

def test_in_order_batches_are_accepted_and_recorded(tmp_path):
    d = Driver(tmp_path)
    assert d.append(pbatch(0, 3)) == 0
    assert d.append(pbatch(3, 2)) == 3
    entry = d.state.last_entry(PID)
    assert entry.producer_epoch == 0 and entry.last_seq == 4 and entry.last_data_offset == 4
    assert [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in entry.batches] \
        == [(0, 2, 0, 2), (3, 4, 3, 4)]
    assert d.state.map_end_offset == 5


def test_unknown_producer_is_accepted_at_any_sequence(tmp_path):
    # KIP-360: no UNKNOWN_PRODUCER_ID; the producer's records may have been removed by retention.
    d = Driver(tmp_path)
    assert d.append(pbatch(42)) == 0
    assert d.state.last_entry(PID).last_seq == 42
    assert d.append(pbatch(43)) == 1


def test_gap_in_sequence_is_out_of_order_and_changes_nothing(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(0, 2))
    with pytest.raises(OutOfOrderSequenceError) as e:
        d.append(pbatch(3))
    assert e.value.error_code == 45
    assert d.state.last_entry(PID).last_seq == 1 and d.end == 2


def test_retry_of_any_of_the_last_five_batches_is_a_duplicate(tmp_path):
    d = Driver(tmp_path)
    firsts = [d.append(pbatch(2 * i, 2)) for i in range(6)]
    for i in range(1, 6):
        dup = d.append(pbatch(2 * i, 2))
        assert (dup.first_offset, dup.last_offset) == (firsts[i], firsts[i] + 1)
    # the sixth-newest batch has left the cache: an old sequence is out of order
    with pytest.raises(OutOfOrderSequenceError):
        d.append(pbatch(0, 2))
    # a batch overlapping a cached one without the exact range is not a duplicate
    with pytest.raises(OutOfOrderSequenceError):
        d.append(pbatch(10, 1))
    assert d.end == 12


def test_duplicate_needs_the_same_epoch(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(0, epoch=3))
    with pytest.raises(InvalidProducerEpochError):
        d.append(pbatch(0, epoch=2))


def test_older_epoch_is_refused(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(0, epoch=5))
    with pytest.raises(InvalidProducerEpochError) as e:
        d.append(pbatch(1, epoch=4))
    assert e.value.error_code == 47


def test_epoch_bump_restarts_sequence_at_zero(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(0, 3, epoch=0))
    with pytest.raises(OutOfOrderSequenceError):
        d.append(pbatch(3, epoch=1))
    assert d.append(pbatch(0, epoch=1)) == 3
    entry = d.state.last_entry(PID)
    assert entry.producer_epoch == 1 and len(entry.batches) == 1
    with pytest.raises(InvalidProducerEpochError):
        d.append(pbatch(3, epoch=0))


def test_sequence_wraps_from_int32_max_to_zero(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(INT32_MAX - 1, 2))
    assert d.state.last_entry(PID).last_seq == INT32_MAX
    assert d.append(pbatch(0, 2)) == 2
    # a batch that itself wraps
    d2 = Driver(tmp_path / "b")
    d2.append(pbatch(INT32_MAX - 1, 4))
    entry = d2.state.last_entry(PID)
    assert entry.last_seq == 1 and entry.batches[-1].first_seq == INT32_MAX - 1
    assert d2.append(pbatch(INT32_MAX - 1, 4)).first_offset == 0  # its retry is still found
    assert d2.append(pbatch(2)) == 4


def test_batch_with_producer_id_but_no_sequence_is_invalid(tmp_path):
    d = Driver(tmp_path)
    with pytest.raises(InvalidSequenceRecordError) as e:
        d.append(pbatch(-1))
    assert e.value.error_code == 87


def test_batches_without_producer_id_are_ignored(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(-1, pid=-1, epoch=-1))
    assert d.state.producers == {} and d.state.map_end_offset == 1


def test_batches_of_one_request_are_checked_against_each_other(tmp_path):
    state = ProducerStateManager(tmp_path)
    ok = state.prepare([header(pbatch(0, 2)), header(pbatch(2, 1))], 0)
    assert ok.updated[PID].last_seq == 2
    assert state.producers == {}  # prepare changes nothing
    state.complete(ok, 3)
    with pytest.raises(OutOfOrderSequenceError):
        state.prepare([header(pbatch(3, 1)), header(pbatch(5, 1))], 3)
    assert state.last_entry(PID).last_seq == 2


def test_replicated_batches_are_not_validated(tmp_path):
    state = ProducerStateManager(tmp_path)
    state.complete(state.prepare([header(pbatch(0, epoch=3), 0)], validate=False), 1)
    prepared = state.prepare([header(pbatch(7, epoch=2), 1)], validate=False)
    state.complete(prepared, 2)
    assert state.last_entry(PID).producer_epoch == 2 and state.last_entry(PID).last_seq == 7


def test_transaction_open_and_end(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(0, transactional=True))
    d.append(pbatch(1, transactional=True))
    assert d.state.last_entry(PID).current_txn_first_offset == 0
    with pytest.raises(InvalidTxnStateError):
        d.append(pbatch(2))
    marker = build_end_txn_marker_batch(EndTransactionMarker(COMMIT, 7), producer_id=PID,
                                        producer_epoch=0, timestamp=2_000, base_offset=2)
    prepared = d.state.prepare([header(marker)], None, validate=False)
    d.state.complete(prepared, 3)
    assert [(t.first_offset, t.last_offset, t.is_aborted) for t in prepared.completed_txns] \
        == [(0, 2, False)]
    entry = d.state.last_entry(PID)
    assert entry.current_txn_first_offset == -1 and entry.coordinator_epoch == 7
    d.end = 3
    assert d.append(pbatch(2)) == 3


def test_idle_producers_expire(tmp_path):
    state = ProducerStateManager(tmp_path, producer_id_expiration_ms=1_000,
                                 expiration_check_interval_ms=100)
    state.complete(state.prepare([header(pbatch(0, pid=1, ts=10_000))], 0), 1, now_ms=10_000)
    state.complete(state.prepare([header(pbatch(0, pid=2, ts=10_500))], 1), 2, now_ms=10_500)
    assert set(state.producers) == {1, 2}
    state.complete(state.prepare([header(pbatch(1, pid=2, ts=11_050))], 2), 3, now_ms=11_050)
    assert set(state.producers) == {2}
    assert state.remove_expired_producers(12_050) == 1 and state.producers == {}


def test_producer_with_open_transaction_does_not_expire(tmp_path):
    state = ProducerStateManager(tmp_path, producer_id_expiration_ms=1_000)
    state.complete(state.prepare([header(pbatch(0, transactional=True))], 0), 1)
    assert state.remove_expired_producers(10**9) == 0


# ---- snapshot files ------------------------------------------------------------------------------

def test_snapshot_layout_is_kafkas():
    entry = ProducerStateEntry(PID, 3, coordinator_epoch=9, last_timestamp=1234,
                               current_txn_first_offset=-1)
    entry.add_batch(3, 14, 104, 4, 1234)
    data = encode_snapshot([entry, ProducerStateEntry(7, 1, last_timestamp=5)])
    body = struct.pack(">i", 2) \
        + struct.pack(">qhiqiqiq", PID, 3, 14, 104, 4, 1234, 9, -1) \
        + struct.pack(">qhiqiqiq", 7, 1, -1, -1, 0, 5, -1, -1)
    assert data == struct.pack(">hI", 1, crc32c(body)) + body
    entries = decode_snapshot(data)
    assert entries[0].producer_id == PID and entries[0].producer_epoch == 3
    assert list(entries[0].batches)[0].first_seq == 10 and entries[0].last_data_offset == 104
    assert entries[0].coordinator_epoch == 9 and entries[0].last_timestamp == 1234
    assert entries[1].batches == type(entries[1].batches)() and entries[1].last_seq == -1


@pytest.mark.parametrize("damage", ["crc", "version", "truncated", "short"])
def test_damaged_snapshot_is_refused(damage):
    entry = ProducerStateEntry(PID, 0)
    entry.add_batch(0, 0, 0, 0, 1)
    data = bytearray(encode_snapshot([entry]))
    if damage == "crc":
        data[-1] ^= 1
    elif damage == "version":
        data[1] = 2
    elif damage == "truncated":
        del data[-3:]
    else:
        data = data[:5]
    with pytest.raises(CorruptSnapshotError):
        decode_snapshot(bytes(data))


def test_take_snapshot_names_the_file_by_offset_and_skips_repeats(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(0, 3))
    path = d.state.take_snapshot()
    assert path == tmp_path / "00000000000000000003.snapshot"
    assert d.state.take_snapshot() is None
    assert [e.last_seq for e in read_snapshot(path)] == [2]
    assert list_snapshot_offsets(tmp_path) == [3]


def test_reload_uses_newest_readable_snapshot(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(0))
    d.state.take_snapshot()
    d.append(pbatch(1))
    d.state.take_snapshot()
    snapshot_path(tmp_path, 2).write_bytes(b"garbage!")
    state = ProducerStateManager(tmp_path)
    state.truncate_and_reload(0, 2, now_ms=0)
    assert state.map_end_offset == 1 and state.last_entry(PID).last_seq == 0
    assert list_snapshot_offsets(tmp_path) == [1]


def test_reload_drops_snapshots_past_the_log_end(tmp_path):
    d = Driver(tmp_path)
    for seq in range(3):
        d.append(pbatch(seq))
        d.state.take_snapshot()
    state = ProducerStateManager(tmp_path)
    state.truncate_and_reload(0, 2, now_ms=0)
    assert list_snapshot_offsets(tmp_path) == [1, 2]
    assert state.last_entry(PID).last_seq == 1


def test_expired_producers_are_not_loaded(tmp_path):
    d = Driver(tmp_path)
    d.append(pbatch(0, ts=1_000))
    d.append(pbatch(0, pid=2, ts=90_000_000))
    d.state.take_snapshot()
    state = ProducerStateManager(tmp_path)
    state.truncate_and_reload(0, 2, now_ms=86_401_000)
    assert set(state.producers) == {2}


# ---- in the log ----------------------------------------------------------------------------------

def append(log: Log, raw, now_ms: int = 0):
    return log.append(raw, 0, now_ms)


def test_log_answers_a_retry_with_the_original_offsets_and_appends_nothing(tmp_path):
    log = open_log(tmp_path)
    append(log, pbatch(-1, 2, pid=-1, epoch=-1))
    first = append(log, pbatch(0, 3))
    assert (first.first_offset, first.last_offset, first.duplicate) == (2, 4, False)
    again = append(log, pbatch(0, 3))
    assert (again.first_offset, again.last_offset, again.duplicate) == (2, 4, True)
    assert log.log_end_offset == 5 and len(read_all(log)) == 2


def test_log_refuses_out_of_order_without_writing(tmp_path):
    log = open_log(tmp_path)
    append(log, pbatch(0))
    size = log.size_bytes
    with pytest.raises(OutOfOrderSequenceError):
        append(log, pbatch(5))
    assert log.log_end_offset == 1 and log.size_bytes == size


def fill(log: Log, count: int, *, pid: int = PID, seq0: int = 0) -> None:
    for i in range(count):
        append(log, pbatch(seq0 + i, size=200))


def test_snapshots_are_written_on_roll_and_close_and_loaded_on_open(tmp_path):
    log = open_log(tmp_path)
    fill(log, 20)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) > 2
    assert list_snapshot_offsets(log.dir) == bases[1:]
    log.close()
    assert list_snapshot_offsets(log.dir) == bases[1:] + [20]
    log = open_log(tmp_path)
    assert log.producer_state.map_end_offset == 20
    assert log.producer_state.last_entry(PID).last_seq == 19
    assert append(log, pbatch(19, size=200)).duplicate  # the snapshot keeps the last batch
    assert append(log, pbatch(20, size=200)).first_offset == 20


def test_unclean_shutdown_rebuilds_state_by_scanning_after_the_snapshot(tmp_path):
    log = open_log(tmp_path)
    fill(log, 20)
    log.release()  # crash: no close, no snapshot at the log end
    log = Log.open(log.dir, log.config, now_ms=0, needs_recovery=True)
    entry = log.producer_state.last_entry(PID)
    assert entry.last_seq == 19 and log.producer_state.map_end_offset == 20
    # the batches after the last roll were replayed, so every cached retry is still recognised
    for seq in range(20 - len(entry.batches), 20):
        assert append(log, pbatch(seq, size=200)).first_offset == seq
    assert list_snapshot_offsets(log.dir)[-1] == 20


def test_rebuild_without_any_snapshot_scans_the_whole_log(tmp_path):
    log = open_log(tmp_path)
    fill(log, 12)
    log.release()
    for offset in list_snapshot_offsets(log.dir):
        snapshot_path(log.dir, offset).unlink()
    log = Log.open(log.dir, log.config, now_ms=0, needs_recovery=True)
    entry = log.producer_state.last_entry(PID)
    assert entry.last_seq == 11 and len(entry.batches) == 5


def test_corrupt_snapshot_falls_back_to_an_older_one(tmp_path):
    log = open_log(tmp_path)
    fill(log, 20)
    log.close()
    snapshot_path(log.dir, 20).write_bytes(b"\x00\x01garbage")
    log = open_log(tmp_path)
    assert log.producer_state.last_entry(PID).last_seq == 19
    assert append(log, pbatch(20, size=200)).first_offset == 20


def test_truncation_reloads_the_state_below_the_new_end(tmp_path):
    log = open_log(tmp_path)
    fill(log, 20)
    log.truncate_to(13, now_ms=0)
    assert log.producer_state.last_entry(PID).last_seq == 12
    assert all(offset <= 13 for offset in list_snapshot_offsets(log.dir))
    assert append(log, pbatch(13, size=200)).first_offset == 13
    log.truncate_fully_and_start_at(100, now_ms=0)
    assert log.producer_state.producers == {} and list_snapshot_offsets(log.dir) == []


def test_follower_appends_update_state_without_checks(tmp_path):
    log = open_log(tmp_path)
    log.append_as_follower(header(pbatch(7), base_offset=0).buf, now_ms=0)
    log.append_as_follower(header(pbatch(3), base_offset=1).buf, now_ms=0)
    assert log.producer_state.last_entry(PID).last_seq == 3


def test_retention_deletes_the_snapshots_of_deleted_segments(tmp_path):
    log = open_log(tmp_path, retention_ms=-1, retention_bytes=1_000)
    fill(log, 20)
    log.update_high_watermark(log.log_end_offset)
    assert apply_retention(log, 0) > 0
    first = log.segments[0].base_offset
    assert min(list_snapshot_offsets(log.dir)) >= first
    assert log.producer_state.last_entry(PID).last_seq == 19  # producers outlive their records


# ---- transaction verification (KIP-890) ----------------------------------------------------------

def test_a_first_transactional_write_needs_the_current_guard(tmp_path):
    from odradek.storage.producer_verification import VerificationGuard
    d = Driver(tmp_path)
    state = d.state
    guard = state.maybe_start_verification(PID, 0, 0, now_ms=1)
    assert guard is not None and state.maybe_start_verification(PID, 0, 0, now_ms=2) is guard
    assert not state.is_verified(PID, 0, None) and not state.is_verified(PID, 0, VerificationGuard())
    assert state.is_verified(PID, 0, guard)
    # While verifying, a later sequence may not overtake the lowest one seen.
    with pytest.raises(OutOfOrderSequenceError):
        state.prepare([header(pbatch(1, transactional=True))], d.end)
    d.append(pbatch(0, transactional=True))
    # The write opened the transaction and cleared the entry: no guard needed, none handed out.
    assert state.verification.get(PID) is None
    assert state.is_verified(PID, 0, None) and state.maybe_start_verification(PID, 1, 0, now_ms=3) is None
    # Another epoch has no open transaction here: it is verified again.
    assert not state.is_verified(PID, 1, None)


def test_a_marker_ends_a_verification_so_a_stale_answer_cannot_pass(tmp_path):
    d = Driver(tmp_path)
    guard = d.state.maybe_start_verification(PID, 0, 0, now_ms=1)
    marker = build_end_txn_marker_batch(EndTransactionMarker(COMMIT, 0), producer_id=PID, producer_epoch=0,
                                        timestamp=2)
    d.append(bytearray(marker))
    assert not d.state.is_verified(PID, 0, guard)
    newer = d.state.maybe_start_verification(PID, 0, 0, now_ms=3)
    assert newer is not guard and d.state.is_verified(PID, 0, newer)


def test_unused_verifications_expire_with_producers(tmp_path):
    state = ProducerStateManager(tmp_path, producer_id_expiration_ms=100)
    state.maybe_start_verification(PID, 0, 0, now_ms=0)
    state.maybe_start_verification(PID + 1, 4, 0, now_ms=50)
    state.maybe_start_verification(PID + 1, 2, 0, now_ms=60)     # a lower sequence becomes the lowest
    assert state.verification.get(PID + 1).lowest_sequence == 2
    state.maybe_start_verification(PID + 1, 7, 1, now_ms=70)     # a newer epoch starts over
    assert (state.verification.get(PID + 1).lowest_sequence, state.verification.get(PID + 1).epoch) == (7, 1)
    state.remove_expired_producers(100)
    assert state.verification.get(PID) is None and state.verification.get(PID + 1) is not None
