"""The admin client's transaction calls (KIP-664; what kafka-transactions.sh uses):

- `describe_transactions`: DescribeTransactions, sent to each transactional id's coordinator
  (FindCoordinator, key type 1);
- `list_transactions`: ListTransactions, sent to every broker (each lists the ids it coordinates);
- `describe_producers`: DescribeProducers, sent to each partition's leader;
- `abort_transaction`: WriteTxnMarkers ABORT for one producer on one partition, sent to its leader
  (the hanging-transaction remedy: the coordinator is not involved);
- `end_transaction`, which commits or aborts a transaction a producer prepared (`prepare_transaction`)
  by its id, producer id and epoch.

COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE are retried (after looking
the coordinator up again); TRANSACTIONAL_ID_NOT_FOUND and other refusals are an `AdminError` in that
id's place of the result.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from odradek.client.admin_partitions import _ROUTING_ERRORS, _tp
from odradek.client.admin_types import AdminError, Retry, raise_first
from odradek.client.fetcher import TopicPartition
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.messages import describe_producers as dpr
from odradek.protocol.messages import describe_transactions as dtx
from odradek.protocol.messages import find_coordinator as fc
from odradek.protocol.messages import list_transactions as ltx
from odradek.protocol.messages import write_txn_markers as wtm

if TYPE_CHECKING:
    from odradek.client.transactions import PreparedTransaction

TXN_KEY_TYPE = 1
DESCRIBE_TRANSACTIONS_KEY = 65
LIST_TRANSACTIONS_KEY = 66
DESCRIBE_PRODUCERS_KEY = 61
WRITE_TXN_MARKERS_KEY = 27
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


@dataclass(frozen=True)
class TransactionListing:
    """One transactional id a broker coordinates (ListTransactions)."""
    transactional_id: str
    producer_id: int
    state: str
    coordinator: int


@dataclass(frozen=True)
class ProducerState:
    """A producer's state at a partition (DescribeProducers); `current_txn_start_offset` is the first
    offset of its open transaction there, -1 if none; `coordinator_epoch` -1 if no marker was written."""
    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    coordinator_epoch: int
    current_txn_start_offset: int


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
        from odradek.client.transactions import end_prepared_transaction   # the producer's; not for every admin

        async with asyncio.timeout(self.config["default.api.timeout.ms"] / 1000):
            await end_prepared_transaction(self.cluster, self.config, prepared, commit)

    async def list_transactions(self, *, states=(), producer_ids=(), duration_ms: int = -1,
                                transactional_id_pattern: str | None = None) -> list[TransactionListing]:
        """Every transactional id of the cluster (ListTransactions to each broker), filtered by state
        names, producer ids, open duration (v1) and an id pattern (v2); a broker too old for a filter
        given is UnsupportedVersionError."""
        from odradek.client.errors import UnsupportedVersionError

        async def attempt():
            await self._metadata([])
            out: list[TransactionListing] = []
            for node in sorted(self.cluster.metadata.brokers):
                def build_request(v):
                    if duration_ms >= 0 and v < 1 or transactional_id_pattern is not None and v < 2:
                        raise UnsupportedVersionError(f"broker {node} speaks ListTransactions v{v}, too old for "
                                                      "the filters given")
                    return ltx.ListTransactionsRequest(state_filters=list(states),
                                                       producer_id_filters=list(producer_ids),
                                                       duration_filter=duration_ms,
                                                       transactional_id_pattern=transactional_id_pattern)
                response, _ = await self._request(node, LIST_TRANSACTIONS_KEY, build_request)
                if response.error_code in _RETRY:
                    raise Retry(f"ListTransactions at broker {node}: {ErrorCode(response.error_code).name}",
                                refresh=False)
                if response.error_code:
                    raise AdminError(response.error_code, None, f"ListTransactions at broker {node}")
                out += [TransactionListing(s.transactional_id, s.producer_id, s.transaction_state, node)
                        for s in response.transaction_states]
            return out
        return await self._retrying("ListTransactions", attempt)

    async def describe_producers(self, partitions) -> dict[TopicPartition, list[ProducerState]]:
        """The active producers of each partition, from its leader."""
        wanted = list(dict.fromkeys(_tp(tp) for tp in partitions))

        async def attempt():
            results: dict = {}
            for node, tps in (await self._leaders(wanted)).items():
                by_topic: dict[str, list[int]] = {}
                for tp in tps:
                    by_topic.setdefault(tp.topic, []).append(tp.partition)
                response, _ = await self._request(node, DESCRIBE_PRODUCERS_KEY, lambda v: dpr.DescribeProducersRequest(
                    topics=[dpr.TopicRequest(name=t, partition_indexes=ps) for t, ps in by_topic.items()]))
                for t in response.topics:
                    for p in t.partitions:
                        tp = TopicPartition(t.name, p.partition_index)
                        if p.error_code in _ROUTING_ERRORS:
                            raise Retry(f"DescribeProducers {tp}: {ErrorCode(p.error_code).name}")
                        if p.error_code:
                            results[tp] = AdminError(p.error_code, p.error_message,
                                                     f"partition {tp.topic}-{tp.partition}")
                        else:
                            results[tp] = [ProducerState(s.producer_id, s.producer_epoch, s.last_sequence,
                                                         s.last_timestamp, s.coordinator_epoch,
                                                         s.current_txn_start_offset) for s in p.active_producers]
            return {tp: results.get(tp) for tp in wanted}
        return raise_first(await self._retrying("DescribeProducers", attempt))

    async def abort_transaction(self, partition, producer_id: int, producer_epoch: int,
                                coordinator_epoch: int) -> None:
        """Write an ABORT marker for the producer's open transaction on `partition` (WriteTxnMarkers to
        its leader), as kafka-transactions.sh abort does for a hanging transaction."""
        tp = _tp(partition)

        async def attempt():
            node = next(iter(await self._leaders([tp])))
            response, _ = await self._request(node, WRITE_TXN_MARKERS_KEY, lambda v: wtm.WriteTxnMarkersRequest(
                markers=[wtm.WritableTxnMarker(
                    producer_id=producer_id, producer_epoch=producer_epoch, transaction_result=False,
                    topics=[wtm.WritableTxnMarkerTopic(name=tp.topic, partition_indexes=[tp.partition])],
                    coordinator_epoch=coordinator_epoch)]))
            for m in response.markers:
                for t in m.topics:
                    for p in t.partitions:
                        if p.error_code in _ROUTING_ERRORS:
                            raise Retry(f"WriteTxnMarkers {tp}: {ErrorCode(p.error_code).name}")
                        if p.error_code:
                            raise AdminError(p.error_code, None, f"abort of producer {producer_id} on "
                                                                 f"{tp.topic}-{tp.partition}")
        await self._retrying("WriteTxnMarkers", attempt)
