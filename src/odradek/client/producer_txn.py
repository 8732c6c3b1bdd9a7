"""The transactional producer's public calls (seed 003, "Message Delivery Semantics"; the state
machine and its requests are in `transactions`):

    async with Producer({"bootstrap.servers": "localhost:9092", "transactional.id": "copier-1"}) as p:
        await p.init_transactions()                   # fences older producers of the id
        p.begin_transaction()
        await p.send("out", b"v")
        await p.send_offsets_to_transaction({("in", 0): 42}, consumer.group_metadata())
        await p.commit_transaction()                  # or abort_transaction()

Each call takes an optional `timeout` (seconds; default max.block.ms). A fatal error
(`ProducerFencedError`, or a `TransactionError` with `fatal`) leaves the producer good only for
closing; after an abortable one (`TransactionAbortableError`, `InvalidProducerEpochError`) call
`abort_transaction()` and go on.

Committing flushes every record of the transaction first; if one of them failed, the commit raises
the abortable error instead. Aborting drops records not sent yet (their futures fail with
`TransactionAbortedError`), waits for those in flight, then ends the transaction.
"""

from __future__ import annotations

import asyncio

from odradek.client.errors import (
    BrokerResponseError, IllegalStateError, InvalidProducerEpochError, KafkaError, TransactionAbortableError,
    TransactionAbortedError, TransactionError,
)
from odradek.client.transactions import (
    ConsumerGroupMetadata, PreparedTransaction, TransactionManager, TxnState, offsets_arg,
)
from odradek.protocol.error_codes import ErrorCode


class TransactionalProducer:
    """Transaction calls of `Producer` (a mixin; the producer sets `_txn` when transactional.id is set)."""

    _txn: TransactionManager | None

    def _txn_manager(self) -> TransactionManager:
        self._check_open()
        if self._txn is None:
            raise IllegalStateError("transactional.id is not set: this producer has no transactions")
        return self._txn

    def _timeout(self, timeout: float | None) -> float:
        return self.max_block_ms / 1000 if timeout is None else timeout

    @property
    def transaction_state(self) -> TxnState | None:
        return self._txn.state if self._txn is not None else None

    async def init_transactions(self, timeout: float | None = None) -> None:
        """Get the producer id and epoch of transactional.id, fencing every older producer of the id
        (their open transaction is aborted first)."""
        txn = self._txn_manager()

        async def init() -> None:
            if txn.state is TxnState.UNINITIALIZED:
                txn.transition(TxnState.INITIALIZING)
            elif txn.state is not TxnState.INITIALIZING:
                raise IllegalStateError(f"init_transactions in state {txn.state.value}")
            try:
                await txn.init_producer_id()
            except TransactionError as e:
                txn.transition(TxnState.FATAL_ERROR, e)
                raise
            txn.transition(TxnState.READY)
        await txn.run("init_transactions", init, self._timeout(timeout))

    def begin_transaction(self) -> None:
        txn = self._txn_manager()
        if txn.state is not TxnState.READY:
            raise txn.error_for_state("begin a transaction")
        txn.reset_transaction()
        txn.transition(TxnState.IN_TRANSACTION)

    async def send_offsets_to_transaction(self, offsets: dict, group_metadata: ConsumerGroupMetadata | str,
                                          timeout: float | None = None) -> None:
        """Commit a consumer group's offsets ({(topic, partition): offset | (offset, metadata)}) as part
        of the transaction: they take effect only if it commits (KIP-447: pass the consumer's
        `group_metadata()`, so the group coordinator refuses a member that left the generation)."""
        txn = self._txn_manager()
        group = group_metadata if isinstance(group_metadata, ConsumerGroupMetadata) \
            else ConsumerGroupMetadata(str(group_metadata))
        wanted = offsets_arg(offsets)

        async def send() -> None:
            if txn.state is not TxnState.IN_TRANSACTION:
                raise txn.error_for_state("send offsets")
            if not wanted:
                return
            try:
                await txn.send_offsets(wanted, group)
            except TransactionError as e:
                txn.fail(e)
                raise
        await txn.run("send_offsets_to_transaction", send, self._timeout(timeout))

    async def prepare_transaction(self, timeout: float | None = None) -> PreparedTransaction:
        """Flush the transaction and leave it open (KIP-939's first phase): its records are on the
        brokers, invisible to read_committed readers, until this producer or any client given the
        returned `PreparedTransaction` commits or aborts it, or transaction.timeout.ms aborts it."""
        txn = self._txn_manager()

        async def prepare() -> PreparedTransaction:
            if txn.state is not TxnState.IN_TRANSACTION:
                raise txn.error_for_state("prepare the transaction")
            await self._flush_transaction(txn)
            txn.transition(TxnState.PREPARED)
            return PreparedTransaction(txn.transactional_id, txn.producer_id, txn.producer_epoch)
        return await txn.run("prepare_transaction", prepare, self._timeout(timeout))

    async def commit_transaction(self, timeout: float | None = None) -> None:
        txn = self._txn_manager()

        async def commit() -> None:
            if txn.state not in (TxnState.IN_TRANSACTION, TxnState.PREPARED, TxnState.COMMITTING):
                raise txn.error_for_state("commit")
            if txn.state is not TxnState.COMMITTING:
                txn.transition(TxnState.COMMITTING)
            await self._flush_transaction(txn)
            if txn.started:
                try:
                    await txn.end_txn(commit=True)
                except TransactionError as e:
                    txn.fail(e)
                    raise txn.error_for_state("commit") from e
            txn.reset_transaction()
            txn.transition(TxnState.READY)
        await txn.run("commit_transaction", commit, self._timeout(timeout))

    async def abort_transaction(self, timeout: float | None = None) -> None:
        txn = self._txn_manager()

        async def abort() -> None:
            if txn.state is TxnState.FATAL_ERROR:
                raise txn.error_for_state("abort")
            if txn.state not in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.PREPARED,
                                 TxnState.ABORTING):
                raise txn.error_for_state("abort")
            if txn.state is not TxnState.ABORTING:
                txn.transition(TxnState.ABORTING)
            self._abort_undrained(TransactionAbortedError("the transaction was aborted before the record "
                                                          "was sent"))
            in_flight = [b.future for b in self.acc.incomplete]
            if in_flight:
                await asyncio.wait(in_flight)
            try:
                if txn.started:
                    before = (txn.producer_id, txn.producer_epoch)
                    await txn.end_txn(commit=False)
                    if (txn.producer_id, txn.producer_epoch) != before:
                        # EndTxn v5 (transaction protocol v2) bumped the epoch already; the sequences
                        # start over with it, so no KIP-360 bump is needed (Java's
                        # needToTriggerEpochBumpFromClient is false with transaction V2).
                        txn.bump_needed = False
                if txn.bump_needed:
                    txn.transition(TxnState.INITIALIZING)
                    await txn.init_producer_id(bump=True)
            except TransactionError as e:
                txn.transition(TxnState.FATAL_ERROR, e)
                raise
            txn.reset_transaction()
            txn.transition(TxnState.READY)
        await txn.run("abort_transaction", abort, self._timeout(timeout))

    # ------------------------------------------------------------------------------------ plumbing
    async def _flush_transaction(self, txn: TransactionManager) -> None:
        """Send every record of the transaction and wait for the answers; an abortable error if one failed."""
        pending = [b.future for b in self.acc.incomplete]
        if pending:
            self.acc.flushing += 1
            self._wakeup.set()
            try:
                await asyncio.wait(pending)
            finally:
                self.acc.flushing -= 1
        if txn.pending and txn.sending_allowed:
            try:      # partitions written to whose records never reached a batch: still in the transaction
                await txn.add_pending_partitions()
            except KafkaError as e:
                txn.fail(e)
        if txn.state in (TxnState.ABORTABLE_ERROR, TxnState.FATAL_ERROR):
            raise txn.error_for_state("commit")

    def _abort_undrained(self, error: BaseException) -> None:
        """Fail the batches not sent yet (the transaction is being aborted or cannot commit)."""
        self._keyless.clear()
        for b in self.acc.abort_all():
            if not b.closed:
                self.acc.close_batch(b)
            self._finish(b, -1, -1, error)

    def _txn_batch_failed(self, sequenced: bool, exc: BaseException) -> BaseException:
        """A batch of the transaction failed for good: the transaction can only be aborted now. The
        error its records fail with (INVALID_PRODUCER_EPOCH as `InvalidProducerEpochError`)."""
        txn = self._txn
        assert txn is not None
        if sequenced:
            txn.bump_needed = True     # the broker may or may not have that sequence
        if isinstance(exc, BrokerResponseError) and exc.code == ErrorCode.INVALID_PRODUCER_EPOCH:
            err: KafkaError = InvalidProducerEpochError(str(exc))
        elif isinstance(exc, TransactionError):
            err = exc
        else:
            err = TransactionAbortableError(f"a record of the transaction was not delivered: {exc}",
                                            getattr(exc, "code", None))
            err.__cause__ = exc
        txn.fail(err)
        return err if isinstance(err, InvalidProducerEpochError) else exc


__all__ = ["TransactionalProducer", "ConsumerGroupMetadata", "PreparedTransaction"]
