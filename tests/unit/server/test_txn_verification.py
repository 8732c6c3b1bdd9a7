"""KIP-890's translations at the partition leader: which versions verify or add, and how a
coordinator's answer reaches a Produce or TxnOffsetCommit client (Kafka 4.0's rules)."""

from odradek.protocol.error_codes import ErrorCode
from odradek.records.builder import RecordBatchBuilder
from odradek.server.txn_verification import (
    Operation, offset_commit_error, produce_error, produce_operation, transactional_batch,
    txn_offset_commit_operation,
)


def test_operations_by_version():
    assert [produce_operation(v) for v in (3, 10, 11, 12, 13)] == [
        Operation.DEFAULT_ERROR, Operation.DEFAULT_ERROR, Operation.GENERIC_ERROR, Operation.ADD_PARTITION,
        Operation.ADD_PARTITION]
    assert [txn_offset_commit_operation(v) for v in (3, 4, 5)] == [
        Operation.DEFAULT_ERROR, Operation.GENERIC_ERROR, Operation.ADD_PARTITION]
    assert Operation.ADD_PARTITION.supports_epoch_bump and not Operation.GENERIC_ERROR.supports_epoch_bump


def test_produce_errors_as_kafka_translates_them():
    assert produce_error(ErrorCode.INVALID_TXN_STATE, Operation.DEFAULT_ERROR) == (
        ErrorCode.INVALID_TXN_STATE, "Partition was not added to the transaction")
    for code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                 ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NETWORK_EXCEPTION):
        assert produce_error(code, Operation.ADD_PARTITION) == (
            ErrorCode.NOT_ENOUGH_REPLICAS,
            f"Unable to verify the partition has been added to the transaction. Underlying error: {code.name}")
    assert produce_error(ErrorCode.CONCURRENT_TRANSACTIONS, Operation.GENERIC_ERROR)[0] == ErrorCode.NOT_ENOUGH_REPLICAS
    assert produce_error(ErrorCode.CONCURRENT_TRANSACTIONS, Operation.ADD_PARTITION) == (
        ErrorCode.CONCURRENT_TRANSACTIONS, None)
    assert produce_error(ErrorCode.TRANSACTION_ABORTABLE, Operation.GENERIC_ERROR) == (
        ErrorCode.TRANSACTION_ABORTABLE, None)
    assert offset_commit_error(ErrorCode.NETWORK_EXCEPTION) == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert offset_commit_error(ErrorCode.NOT_LEADER_OR_FOLLOWER) == ErrorCode.NOT_COORDINATOR
    assert offset_commit_error(ErrorCode.TRANSACTION_ABORTABLE) == ErrorCode.TRANSACTION_ABORTABLE


def test_only_transactional_v2_batches_are_verified():
    def batch(transactional: bool, pid: int = 7) -> bytes:
        b = RecordBatchBuilder(producer_id=pid, producer_epoch=3, base_sequence=5, is_transactional=transactional)
        b.append(None, b"v", timestamp=1)
        return b.build()
    got = transactional_batch(batch(True))
    assert got is not None and (got.producer_id, got.producer_epoch, got.base_sequence) == (7, 3, 5)
    assert transactional_batch(batch(False)) is None
    assert transactional_batch(b"\x00" * 10) is None and transactional_batch(None) is None
