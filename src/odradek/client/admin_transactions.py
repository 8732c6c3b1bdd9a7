"""The admin client's transaction calls: DescribeTransactions (KIP-664; what kafka-transactions.sh
describe shows), sent to each transactional id's coordinator (FindCoordinator, key type 1), and
`end_transaction`, which commits or aborts a transaction a producer prepared (`prepare_transaction`)
by its id, producer id and epoch.

COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE are retried (after looking
the coordinator up again); TRANSACTIONAL_ID_NOT_FOUND and other refusals are an `AdminError` in that
id's place of the result.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from odradek.client.admin_types import AdminError, Retry, raise_first
from odradek.client.fetcher import TopicPartition
from odradek.client.transactions import PreparedTransaction, end_prepared_transaction
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import describe_transactions as dtx
from odradek.protocol.messages import find_coordinator as fc

TXN_KEY_TYPE = 1
DESCRIBE_TRANSACTIONS_KEY = 65
_RETRY = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.NOT_COORDINATOR,
                    ErrorCode.COORDINATOR_NOT_AVAILABLE})


@dataclass(frozen=True)
class TransactionDescription:
    """A transactional id's state at its coordinator (Kafka's state names: Empty, Ongoing,
    PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort, Dead, PrepareEpochFence)."""
    transactional_id: str
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    start_time_ms: int
    partitions: tuple[TopicPartition, ...]


class TransactionAdminMixin:
    """Mixed into `Admin`; uses its `_request`, `_retrying` and `_any_node`."""

    async def _txn_coordinator(self, transactional_id: str) -> int:
        cached = self._txn_coordinators.get(transactional_id)
        if cached is not None and cached in self.cluster.metadata.brokers:
            return cached

        def build_request(v):
            if v >= 4:
                return fc.FindCoordinatorRequest(key_type=TXN_KEY_TYPE, coordinator_keys=[transactional_id])
            return fc.FindCoordinatorRequest(key=transactional_id, key_type=TXN_KEY_TYPE)
        response, v = await self._request(self._any_node(), 10, build_request)
        c = response.coordinators[0] if v >= 4 else response
        if c.error_code in _RETRY:
            raise Retry(f"FindCoordinator {transactional_id!r}: {ErrorCode(c.error_code).name}", refresh=False)
        if c.error_code:
            raise AdminError(c.error_code, c.error_message, f"transactional id {transactional_id!r}")
        brokers = self.cluster.metadata.brokers
        if c.node_id not in brokers or brokers[c.node_id][:2] != (c.host, c.port):
            brokers[c.node_id] = (c.host, c.port, None)
        self._txn_coordinators[transactional_id] = c.node_id
        return c.node_id

    async def describe_transactions(self, transactional_ids) -> dict[str, TransactionDescription]:
        """The state of each transactional id, from its coordinator."""
        ids = list(dict.fromkeys(transactional_ids))
        results: dict = {}

        async def attempt():
            todo = [t for t in ids if t not in results]
            by_node: dict[int, list[str]] = {}
            for t in todo:
                by_node.setdefault(await self._txn_coordinator(t), []).append(t)
            retry = None
            for node, group in by_node.items():
                response, _ = await self._request(node, DESCRIBE_TRANSACTIONS_KEY,
                                                  lambda v, g=group: dtx.DescribeTransactionsRequest(transactional_ids=g))
                for s in response.transaction_states:
                    if s.error_code in _RETRY:
                        self._txn_coordinators.pop(s.transactional_id, None)
                        retry = Retry(f"DescribeTransactions {s.transactional_id!r}: "
                                      f"{ErrorCode(s.error_code).name}", refresh=False)
                    elif s.error_code:
                        results[s.transactional_id] = AdminError(s.error_code, None,
                                                                 f"transactional id {s.transactional_id!r}")
                    else:
                        results[s.transactional_id] = TransactionDescription(
                            s.transactional_id, s.transaction_state, s.producer_id, s.producer_epoch,
                            s.transaction_timeout_ms, s.transaction_start_time_ms,
                            tuple(TopicPartition(t.topic, p) for t in s.topics for p in t.partitions))
            if retry is not None:
                raise retry
            return {t: results[t] for t in ids}
        return raise_first(await self._retrying("DescribeTransactions", attempt))

    async def end_transaction(self, prepared: PreparedTransaction, commit: bool) -> None:
        """Commit or abort a prepared transaction (EndTxn by id, producer id and epoch; a repeat of an
        EndTxn that succeeded succeeds). ProducerFencedError: the coordinator no longer has it at that
        epoch (its timeout aborted it, or a newer producer of the id fenced it)."""
        async with asyncio.timeout(self.config["default.api.timeout.ms"] / 1000):
            await end_prepared_transaction(self.cluster, self.config, prepared, commit)
