"""The transactional producer's state machine without a broker (odradek.client.transactions): the
transitions Kafka's TransactionManager allows, how coordinator and partition error codes are
classified (KIP-588: fenced is fatal, a leader's INVALID_PRODUCER_EPOCH abortable), which errors need
an epoch bump, and the error each call raises in each state."""

import pytest

from odradek.client.errors import (
    IllegalStateError, InvalidProducerEpochError, ProducerFencedError, TransactionAbortableError, TransactionError,
)
from odradek.client.transactions import TransactionManager, TxnState, classify, offsets_arg
from odradek.protocol.error_codes import ErrorCode


class _NoCluster:
    pass


def manager(state: TxnState = TxnState.UNINITIALIZED) -> TransactionManager:
    m = TransactionManager(_NoCluster(), {"transactional.id": "t", "transaction.timeout.ms": 60000,
                                          "retry.backoff.ms": 100})
    m.state = state
    return m


@pytest.mark.parametrize("code, kind", [
    (ErrorCode.PRODUCER_FENCED, ProducerFencedError),
    (ErrorCode.INVALID_PRODUCER_EPOCH, ProducerFencedError),          # from a coordinator (KIP-588)
    (ErrorCode.TRANSACTION_ABORTABLE, TransactionAbortableError),
    (ErrorCode.UNKNOWN_PRODUCER_ID, TransactionAbortableError),
    (ErrorCode.ILLEGAL_GENERATION, TransactionAbortableError),        # TxnOffsetCommit: CommitFailed
    (ErrorCode.GROUP_AUTHORIZATION_FAILED, TransactionAbortableError),
])
def test_classification(code, kind):
    err = classify(code, "EndTxn")
    assert type(err) is kind
    assert err.code == (ErrorCode.PRODUCER_FENCED if kind is ProducerFencedError else code)
    assert err.fatal is (kind is ProducerFencedError)
    assert err.abortable is (kind is not ProducerFencedError)


def test_unexpected_and_authorization_codes_are_fatal():
    for code in (ErrorCode.INVALID_TXN_STATE, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                 ErrorCode.UNKNOWN_SERVER_ERROR):
        err = classify(code, "AddPartitionsToTxn")
        assert isinstance(err, TransactionError) and err.fatal and not err.abortable


def test_leader_epoch_error_is_abortable():
    err = classify(ErrorCode.INVALID_PRODUCER_EPOCH, "Produce", from_coordinator=False)
    assert isinstance(err, InvalidProducerEpochError) and err.abortable and not err.fatal


def test_transitions():
    m = manager()
    with pytest.raises(IllegalStateError):
        m.transition(TxnState.IN_TRANSACTION)           # begin before init
    for s in (TxnState.INITIALIZING, TxnState.READY, TxnState.IN_TRANSACTION, TxnState.PREPARED,
              TxnState.COMMITTING, TxnState.READY, TxnState.IN_TRANSACTION, TxnState.ABORTING, TxnState.READY):
        m.transition(s)
    with pytest.raises(IllegalStateError):
        m.transition(TxnState.COMMITTING)                # commit outside a transaction


def test_abortable_error_then_abort_with_epoch_bump():
    m = manager(TxnState.IN_TRANSACTION)
    m.fail(classify(ErrorCode.UNKNOWN_PRODUCER_ID, "AddPartitionsToTxn"))
    assert m.state is TxnState.ABORTABLE_ERROR and m.bump_needed
    with pytest.raises(TransactionAbortableError):
        m.check_send("topic", 0)
    err = m.error_for_state("commit")
    assert isinstance(err, TransactionAbortableError) and err.code == ErrorCode.UNKNOWN_PRODUCER_ID
    with pytest.raises(IllegalStateError):
        m.transition(TxnState.COMMITTING)
    m.transition(TxnState.ABORTING)
    m.transition(TxnState.INITIALIZING)                  # the bump after the abort
    m.transition(TxnState.READY)


def test_fatal_error_is_final():
    m = manager(TxnState.IN_TRANSACTION)
    fenced = classify(ErrorCode.PRODUCER_FENCED, "EndTxn")
    m.fail(fenced)
    assert m.state is TxnState.FATAL_ERROR
    for call in (lambda: m.check_send("t", 0), lambda: m.transition(TxnState.ABORTING)):
        with pytest.raises(ProducerFencedError) as raised:
            call()
        assert raised.value is fenced
    m.fail(classify(ErrorCode.TRANSACTION_ABORTABLE, "x"))   # nothing after fatal
    assert m.state is TxnState.FATAL_ERROR


def test_partitions_join_the_transaction_once():
    m = manager(TxnState.IN_TRANSACTION)
    m.check_send("a", 0)
    m.check_send("a", 0)
    m.check_send("b", 3)
    assert m.pending == {("a", 0), ("b", 3)}
    m.added.add(("a", 0))
    m.pending.discard(("a", 0))
    m.check_send("a", 0)
    assert m.pending == {("b", 3)}
    pending = m.pending
    m.reset_transaction()
    assert pending is m.pending and not pending       # the accumulator holds the same set


def test_send_outside_a_transaction():
    with pytest.raises(IllegalStateError, match="begin_transaction"):
        manager(TxnState.READY).check_send("t", 0)


def test_offsets_argument_forms():
    class OAM:
        offset, metadata, leader_epoch = 7, "m", 3
    assert offsets_arg({("t", 0): 5, ("t", 1): (6, "six"), ("u", 0): OAM()}) == {
        ("t", 0): (5, None, -1), ("t", 1): (6, "six", -1), ("u", 0): (7, "m", 3)}
