"""The transaction coordinator: the pure state machine (InitProducerId epochs and fencing, KIP-360
resume, AddPartitions, EndTxn in every state, timeouts, expiry, records replayed into an equal
state), Kafka's record formats for __transaction_state, and the runtime over an in-memory log with a
fake marker writer (markers then Complete*, a prepared transaction completed after a load, a marker
retried until its partition accepts it). No sockets, no broker."""

from __future__ import annotations

import asyncio
import dataclasses

from odradek.coordinator.records import OffsetAndMetadata, OffsetRecord, TxnMarkerRecord, TxnOffsetRecord
from odradek.coordinator.records import build_batch as group_batch
from odradek.coordinator.records import iter_batches as group_batches
from odradek.coordinator.shard import GroupConfig, GroupShard
from odradek.coordinator.transactions import (
    NEED_PRODUCER_ID, InitResult, MarkerJob, TxnConfig, TxnShard, TxnState, abort_timed_out, add_partitions,
    complete_txn, end_txn, expire_ids, init_producer_id,
)
from odradek.coordinator.transactions_records import TxnRecord, TxnValue, decode, encode, iter_batches
from odradek.coordinator.transactions_records import build_batch as txn_batch
from odradek.coordinator.transactions_runtime import TransactionCoordinator
from odradek.protocol.error_codes import ErrorCode
from odradek.records.control import COMMIT, EndTransactionMarker, build_end_txn_marker_batch
from tests.unit.coordinator.test_runtime import MemoryLog

TP = ("t", 0)


def apply(shard: TxnShard, out):
    for r in out.records:
        shard.replay(r)
    return out


def init(shard: TxnShard, txn: str = "tx", timeout: int = 60_000, pid: int = -1, epoch: int = -1,
         now: int = 0) -> InitResult:
    out = init_producer_id(shard, txn, timeout, pid, epoch, None, now)
    if out.response is NEED_PRODUCER_ID:
        out = init_producer_id(shard, txn, timeout, pid, epoch, 1000, now)
    apply(shard, out)
    assert isinstance(out.response, InitResult)
    return out.response


def test_records_in_kafkas_format_round_trip():
    value = TxnValue(7, 3, 60_000, int(TxnState.ONGOING), frozenset({("a", 1), ("a", 0), ("b", 2)}), 10, 5)
    key, raw = encode(TxnRecord("tx", value))
    assert key == b"\x00\x00\x00\x02tx"                       # version 0, string "tx"
    assert raw[:2] == b"\x00\x00" and raw[2:10] == (7).to_bytes(8, "big")
    assert decode(key, raw) == TxnRecord("tx", value)
    assert decode(key, None) == TxnRecord("tx", None)


def test_init_bumps_the_epoch_and_fences_an_open_transaction():
    shard = TxnShard(0, TxnConfig(transaction_version=0))   # a cluster without transaction.version 2
    first = init(shard)
    assert first == InitResult(ErrorCode.NONE, 1000, 0)
    assert init(shard) == InitResult(ErrorCode.NONE, 1000, 1)
    apply(shard, add_partitions(shard, "tx", 1000, 1, [TP], 5))
    assert shard.get("tx").state == TxnState.ONGOING
    # A second producer with the same id: the open transaction is aborted at epoch 2 first.
    out = apply(shard, init_producer_id(shard, "tx", 60_000, -1, -1, None, 6))
    assert out.response == InitResult(ErrorCode.CONCURRENT_TRANSACTIONS)
    assert [(j.commit, j.producer_epoch, j.partitions) for j in out.markers] == [(False, 2, frozenset({TP}))]
    assert shard.get("tx").state == TxnState.PREPARE_ABORT
    assert end_txn(shard, "tx", 1000, 1, True, 7).response == ErrorCode.PRODUCER_FENCED
    apply(shard, complete_txn(shard, out.markers[0], 8))
    assert shard.get("tx").state == TxnState.COMPLETE_ABORT and not shard.get("tx").partitions
    assert init(shard) == InitResult(ErrorCode.NONE, 1000, 3)
    assert add_partitions(shard, "tx", 1000, 2, [TP], 9).response == ErrorCode.PRODUCER_FENCED
    assert add_partitions(shard, "tx", 999, 3, [TP], 9).response == ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_kip360_resume_and_timeout_checks():
    shard = TxnShard(0, TxnConfig(max_timeout_ms=1000))
    assert init(shard, timeout=1001).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    assert init(shard, timeout=0).error == ErrorCode.INVALID_TRANSACTION_TIMEOUT
    init(shard, timeout=1000)
    assert init(shard, timeout=1000, pid=1000, epoch=0) == InitResult(ErrorCode.NONE, 1000, 1)
    assert init(shard, timeout=1000, pid=1000, epoch=0) == InitResult(ErrorCode.NONE, 1000, 1), "a retry"
    assert init(shard, timeout=1000, pid=1000, epoch=5).error == ErrorCode.PRODUCER_FENCED
    assert init(shard, timeout=1000, pid=77, epoch=1).error == ErrorCode.PRODUCER_FENCED


def test_end_txn_in_every_state():
    shard = TxnShard(0, TxnConfig())
    init(shard)
    assert end_txn(shard, "tx", 1000, 0, True, 1).response == ErrorCode.INVALID_TXN_STATE   # Empty
    apply(shard, add_partitions(shard, "tx", 1000, 0, [TP, ("u", 3)], 2))
    out = apply(shard, end_txn(shard, "tx", 1000, 0, True, 3))
    assert out.response == ErrorCode.NONE and out.wait_complete == "tx"
    assert out.markers == [MarkerJob("tx", 1000, 0, True, frozenset({TP, ("u", 3)}))]
    assert end_txn(shard, "tx", 1000, 0, True, 4).response == ErrorCode.CONCURRENT_TRANSACTIONS
    assert end_txn(shard, "tx", 1000, 0, False, 4).response == ErrorCode.INVALID_TXN_STATE
    assert add_partitions(shard, "tx", 1000, 0, [TP], 4).response == ErrorCode.CONCURRENT_TRANSACTIONS
    apply(shard, complete_txn(shard, out.markers[0], 5))
    assert shard.get("tx").state == TxnState.COMPLETE_COMMIT
    assert end_txn(shard, "tx", 1000, 0, True, 6).response == ErrorCode.NONE               # a retry
    assert end_txn(shard, "tx", 1000, 0, False, 6).response == ErrorCode.INVALID_TXN_STATE


def test_timeout_abort_and_expiry_and_replay():
    shard = TxnShard(0, TxnConfig(id_expiration_ms=100, transaction_version=0))
    init(shard, timeout=50, now=0)
    apply(shard, add_partitions(shard, "tx", 1000, 0, [TP], 10))
    assert not abort_timed_out(shard, 59).records
    out = apply(shard, abort_timed_out(shard, 60))
    assert [(j.commit, j.producer_epoch) for j in out.markers] == [(False, 1)]
    assert shard.get("tx").producer_epoch == 1 and shard.get("tx").state == TxnState.PREPARE_ABORT
    records = [r for o in [out] for r in o.records]
    apply(shard, complete_txn(shard, out.markers[0], 70))
    assert not expire_ids(shard, 169).records
    gone = apply(shard, expire_ids(shard, 170))
    assert gone.records == [TxnRecord("tx", None)] and shard.get("tx") is None
    # Replaying every record written rebuilds the same state (here: the id is gone).
    rebuilt = TxnShard(0, TxnConfig())
    _, batch = next(iter_batches(txn_batch(records + gone.records, 0)))
    for r in batch:
        rebuilt.replay(r)
    assert rebuilt.txns == shard.txns


def test_transactional_offsets_pending_until_the_marker():
    shard = GroupShard(0, GroupConfig())
    value = OffsetAndMetadata(42, -1, "", 0, None)
    shard.replay(TxnOffsetRecord(9, 0, OffsetRecord("g", "t", 0, value)), 0)
    assert shard.has_pending_txn_offsets("g", "t", 0) and "g" in shard.groups
    assert not shard.groups["g"].offsets
    shard.replay(TxnMarkerRecord(9, commit=True), 0)
    assert shard.groups["g"].offsets[("t", 0)].offset == 42
    shard.replay(TxnOffsetRecord(9, 1, OffsetRecord("g", "t", 0, OffsetAndMetadata(50, -1, "", 0, None))), 0)
    shard.replay(TxnMarkerRecord(9, commit=False), 0)
    assert shard.groups["g"].offsets[("t", 0)].offset == 42 and not shard.has_pending_txn_offsets("g", "t", 0)
    # From the log: a transactional batch, then the COMMIT control batch.
    raw = bytearray(group_batch([TxnOffsetRecord(5, 2, OffsetRecord("h", "t", 1, value))], 0))
    raw += build_end_txn_marker_batch(EndTransactionMarker(COMMIT, 0), producer_id=5, producer_epoch=2,
                                      timestamp=0, base_offset=1)
    loaded = GroupShard(0, GroupConfig())
    for _, recs in group_batches(bytes(raw)):
        for r in recs:
            loaded.replay(r, 0)
    assert loaded.groups["h"].offsets[("t", 1)].offset == 42


class FakeMarkers:
    def __init__(self, refuse_first: int = 0) -> None:
        self.calls: list[tuple[MarkerJob, list]] = []
        self.refuse = refuse_first

    async def write_markers(self, job, partitions, coordinator_epoch):
        self.calls.append((job, list(partitions)))
        if self.refuse:
            self.refuse -= 1
            return {tp: ErrorCode.NOT_LEADER_OR_FOLLOWER for tp in partitions}
        return {tp: ErrorCode.NONE for tp in partitions}


async def _loaded(coord: TransactionCoordinator, partition: int, log: MemoryLog) -> None:
    coord.elect(partition, log, 1, 3)
    while coord.loading:
        await asyncio.sleep(0)


def test_runtime_writes_markers_then_completes_and_reloads_prepared():
    async def scenario() -> None:
        log, markers = MemoryLog(), FakeMarkers(refuse_first=1)
        coord = TransactionCoordinator(TxnConfig(), lambda: 0, markers)
        await coord.start()
        await _loaded(coord, 0, log)
        r = await coord.execute("tx", init_producer_id, "tx", 60_000, -1, -1, 1000)
        assert r == InitResult(ErrorCode.NONE, 1000, 0)
        assert await coord.execute("tx", add_partitions, "tx", 1000, 0, [TP]) == ErrorCode.NONE
        assert await coord.execute("tx", end_txn, "tx", 1000, 0, True) == ErrorCode.NONE
        assert len(markers.calls) == 2, "the refused marker is retried"
        assert coord.shard_for("tx").get("tx").state == TxnState.COMPLETE_COMMIT
        await coord.aclose()
        # A log that ends at PrepareCommit (the coordinator died before the markers): a new
        # coordinator loading it writes them and completes the transaction.
        cut = MemoryLog()
        for b in log.batches:
            records = next(iter_batches(bytes(b)))[1]
            if any(r.value is not None and r.value.state == TxnState.COMPLETE_COMMIT for r in records):
                break
            cut.append(b, 0)
        fresh = FakeMarkers()
        again = TransactionCoordinator(TxnConfig(), lambda: 0, fresh)
        await again.start()
        await _loaded(again, 0, cut)
        assert again.shard_for("tx").get("tx").state in (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
        for _ in range(100):
            if again.shard_for("tx").get("tx").state == TxnState.COMPLETE_COMMIT:
                break
            await asyncio.sleep(0)
        assert again.shard_for("tx").get("tx").state == TxnState.COMPLETE_COMMIT
        assert [(j.commit, parts) for j, parts in fresh.calls] == [(True, [TP])]
        await again.aclose()

    asyncio.run(scenario())


# ------------------------------------------------------------------------------ KIP-890
def test_verify_partitions_answers_per_partition():
    from odradek.coordinator.transactions import verify_partitions
    shard = TxnShard(0, TxnConfig())
    init(shard)
    assert verify_partitions(shard, "tx", 1000, 0, [TP]) == {TP: ErrorCode.TRANSACTION_ABORTABLE}
    apply(shard, add_partitions(shard, "tx", 1000, 0, [TP], 5))
    assert verify_partitions(shard, "tx", 1000, 0, [TP, ("t", 1)]) == {TP: ErrorCode.NONE,
                                                                      ("t", 1): ErrorCode.TRANSACTION_ABORTABLE}
    assert verify_partitions(shard, "tx", 1000, 1, [TP]) == {TP: ErrorCode.PRODUCER_FENCED}
    assert verify_partitions(shard, "tx", 999, 0, [TP]) == {TP: ErrorCode.INVALID_PRODUCER_ID_MAPPING}
    apply(shard, end_txn(shard, "tx", 1000, 0, True, 6))
    assert verify_partitions(shard, "tx", 1000, 0, [TP]) == {TP: ErrorCode.CONCURRENT_TRANSACTIONS}


def test_end_txn_v2_bumps_the_epoch_and_recognises_retries():
    from odradek.coordinator.transactions import TV_2, EndResult, end_txn_v2
    shard = TxnShard(0, TxnConfig())
    init(shard)
    out = apply(shard, add_partitions(shard, "tx", 1000, 0, [TP], 5, TV_2))
    assert shard.get("tx").client_transaction_version == TV_2
    out = apply(shard, end_txn_v2(shard, "tx", 1000, 0, True, None, 6))
    assert out.response == EndResult(ErrorCode.NONE, 1000, 1)
    assert [(j.commit, j.producer_epoch) for j in out.markers] == [(True, 1)]   # markers at the new epoch
    m = shard.get("tx")
    assert (m.state, m.producer_epoch, m.last_producer_epoch) == (TxnState.PREPARE_COMMIT, 1, 0)
    assert end_txn_v2(shard, "tx", 1000, 0, True, None, 7).response == EndResult(ErrorCode.CONCURRENT_TRANSACTIONS)
    assert end_txn_v2(shard, "tx", 1000, 0, False, None, 7).response == EndResult(ErrorCode.INVALID_TXN_STATE)
    apply(shard, complete_txn(shard, out.markers[0], 8))
    # Kafka's table for the completed states: a retry (old epoch) of the same end is NONE, the
    # other end at the old epoch INVALID_TXN_STATE; at the current epoch an abort bumps again.
    assert end_txn_v2(shard, "tx", 1000, 0, True, None, 9).response == EndResult(ErrorCode.NONE, 1000, 1)
    assert end_txn_v2(shard, "tx", 1000, 0, False, None, 9).response == EndResult(ErrorCode.INVALID_TXN_STATE)
    assert end_txn_v2(shard, "tx", 1000, 1, True, None, 9).response == EndResult(ErrorCode.INVALID_TXN_STATE)
    out = apply(shard, end_txn_v2(shard, "tx", 1000, 1, False, None, 10))
    assert out.response == EndResult(ErrorCode.NONE, 1000, 2) and out.markers[0].partitions == frozenset()
    apply(shard, complete_txn(shard, out.markers[0], 11))
    assert shard.get("tx").state == TxnState.COMPLETE_ABORT
    assert end_txn_v2(shard, "tx", 1000, 1, False, None, 12).response == EndResult(ErrorCode.NONE, 1000, 2)
    assert end_txn_v2(shard, "tx", 1000, 0, False, None, 12).response == EndResult(ErrorCode.PRODUCER_FENCED)
    assert end_txn_v2(shard, "tx", 999, 2, False, None, 12).response == EndResult(
        ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    # Empty: an abort bumps, a commit is INVALID_TXN_STATE, an old epoch PRODUCER_FENCED.
    fresh = TxnShard(0, TxnConfig())
    init(fresh)
    assert end_txn_v2(fresh, "tx", 1000, 0, True, None, 1).response == EndResult(ErrorCode.INVALID_TXN_STATE)
    assert end_txn_v2(fresh, "tx", 1000, 0, False, None, 1).response == EndResult(ErrorCode.NONE, 1000, 1)


def test_end_txn_v2_switches_to_a_new_producer_id_when_the_epochs_run_out():
    from odradek.coordinator.transactions import MAX_EPOCH, NEED_PRODUCER_ID, TV_2, EndResult, end_txn_v2
    from odradek.coordinator.transactions_records import decode, encode
    shard = TxnShard(0, TxnConfig())
    init(shard)
    m = shard.get("tx")
    m.producer_epoch = MAX_EPOCH - 2          # 32765: the next end exhausts nothing yet
    apply(shard, add_partitions(shard, "tx", 1000, MAX_EPOCH - 2, [TP], 5, TV_2))
    out = apply(shard, end_txn_v2(shard, "tx", 1000, MAX_EPOCH - 2, True, None, 6))
    assert out.response == EndResult(ErrorCode.NONE, 1000, MAX_EPOCH - 1)
    apply(shard, complete_txn(shard, out.markers[0], 7))
    apply(shard, add_partitions(shard, "tx", 1000, MAX_EPOCH - 1, [TP], 8, TV_2))
    assert end_txn_v2(shard, "tx", 1000, MAX_EPOCH - 1, True, None, 9).response is NEED_PRODUCER_ID
    out = apply(shard, end_txn_v2(shard, "tx", 1000, MAX_EPOCH - 1, True, 2000, 9))
    assert out.response == EndResult(ErrorCode.NONE, 2000, 0)
    assert out.markers[0].producer_id == 1000 and out.markers[0].producer_epoch == MAX_EPOCH
    assert shard.get("tx").next_producer_id == 2000
    record = out.records[0]
    # Value version 1 keeps the next producer id and the client's version (not the last epoch, in
    # memory only as in Kafka).
    assert encode(record)[1][:2] == b"\x00\x01"
    assert decode(*encode(record)).value == dataclasses.replace(record.value, last_producer_epoch=-1)
    apply(shard, complete_txn(shard, out.markers[0], 10))
    m = shard.get("tx")
    assert (m.producer_id, m.producer_epoch, m.previous_producer_id, m.next_producer_id) == (2000, 0, 1000, -1)
    # A retry of that end from the old producer id is recognised.
    assert end_txn_v2(shard, "tx", 1000, MAX_EPOCH - 1, True, None, 11).response == EndResult(ErrorCode.NONE, 2000, 0)


def test_fencing_with_transaction_version_2_ends_at_epoch_plus_two():
    from odradek.coordinator.transactions import TV_2, EndResult, end_txn_v2
    shard = TxnShard(0, TxnConfig())
    init(shard, timeout=50, now=0)
    apply(shard, add_partitions(shard, "tx", 1000, 0, [TP], 10, TV_2))
    out = apply(shard, abort_timed_out(shard, 60))
    assert [(j.commit, j.producer_epoch) for j in out.markers] == [(False, 2)]
    apply(shard, complete_txn(shard, out.markers[0], 70))
    # The producer's own abort at its epoch is not a retry of that end: fenced.
    assert end_txn_v2(shard, "tx", 1000, 0, False, None, 80).response == EndResult(ErrorCode.PRODUCER_FENCED)
