"""Transaction markers in a cluster (seed 003, "WriteTxnMarkers API"; KIP-98; Kafka's
TransactionMarkerChannelManager and TransactionMarkerRequestCompletionHandler).

`ClusterMarkerWriter` is the transaction coordinator's `MarkerWriter` port when the broker runs in a
cluster. For each partition of a transaction it looks up the leader in the metadata image:
- led here: appended locally (`LocalMarkerWriter`);
- led by another live broker: queued for that broker; one sender per broker drains its queue into one
  WriteTxnMarkers request (API key 27, at most `MAX_MARKERS_PER_REQUEST` markers) on the inter-broker
  channel "txn-markers", so the markers of many transactions bound for one broker share a request;
- topic or partition gone: UNKNOWN_TOPIC_OR_PARTITION (the coordinator drops it, as Kafka does);
- no leader, or a leader not live: NOT_LEADER_OR_FOLLOWER.

A partition answered NOT_LEADER_OR_FOLLOWER (or any error but NONE, or a broker that cannot be
reached) is retried by the coordinator; before answering, the writer waits for the next metadata
change (at most `METADATA_WAIT_MS`), so the retry goes to the new leader. As for local appends, a
producer state past the marker's producer or coordinator epoch (INVALID_PRODUCER_EPOCH,
TRANSACTION_COORDINATOR_FENCED) means a newer marker is already there: nothing to do.

Bounds: one queue per broker of the image, each holding at most one entry per marker task (one per
prepared transaction coordinated here); each request carries at most `MAX_MARKERS_PER_REQUEST`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

from odradek.coordinator.transactions import MarkerJob
from odradek.protocol.error_codes import ErrorCode, for_code
from odradek.protocol.messages import write_txn_markers as wtm
from odradek.server.inter_broker import BrokerChannels
from odradek.server.metadata_cache import MetadataCache, MetadataImage
from odradek.server.txn_markers import LocalMarkerWriter, TopicPartition

log = logging.getLogger("odradek.transactions")

WRITE_TXN_MARKERS_KEY = 27
PURPOSE = "txn-markers"
MAX_MARKERS_PER_REQUEST = 500
METADATA_WAIT_MS = 1_000
REQUEST_TIMEOUT_MS = 40_000      # the leader waits up to 30 s for acks=all
SUPERSEDED = (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED)


@dataclass
class _Pending:
    job: MarkerJob
    coordinator_epoch: int
    partitions: Sequence[TopicPartition]
    done: asyncio.Future[dict[TopicPartition, ErrorCode]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class ClusterMarkerWriter:
    """The transaction coordinator's marker port in a cluster (see the module docstring)."""

    def __init__(self, broker_id: int, metadata: MetadataCache, channels: BrokerChannels,
                 local: LocalMarkerWriter) -> None:
        self.broker_id = broker_id
        self.metadata = metadata
        self.channels = channels
        self.local = local
        self._queues: dict[int, list[_Pending]] = {}
        self._senders: dict[int, asyncio.Task[None]] = {}
        self._changed = asyncio.Event()
        self._closed = False
        metadata.add_listener(self._image_changed)

    def _image_changed(self, old: MetadataImage, new: MetadataImage) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def write_markers(self, job: MarkerJob, partitions: list[TopicPartition],
                            coordinator_epoch: int) -> dict[TopicPartition, ErrorCode]:
        changed = self._changed            # a change from now on is one the retry should see
        errors: dict[TopicPartition, ErrorCode] = {}
        by_leader: dict[int, list[TopicPartition]] = {}
        image = self.metadata.image
        live = image.live_broker_ids()
        for tp in partitions:
            info = image.topic(tp[0])
            state = info.partitions.get(tp[1]) if info is not None else None
            if state is None:
                errors[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif state.leader < 0 or (state.leader != self.broker_id and state.leader not in live):
                errors[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER
            else:
                by_leader.setdefault(state.leader, []).append(tp)
        waits: list[asyncio.Future[dict[TopicPartition, ErrorCode]]] = []
        local = by_leader.pop(self.broker_id, None)
        for leader, tps in by_leader.items():
            waits.append(self._enqueue(leader, _Pending(job, coordinator_epoch, tps)))
        if local:
            errors.update(await self.local.write_markers(job, local, coordinator_epoch))
        for fut in waits:
            errors.update(await fut)
        # Gone means gone from the image: a leader that does not know the partition yet is retried.
        now = self.metadata.image
        for tp, code in errors.items():
            if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and _exists(now, tp):
                errors[tp] = ErrorCode.NOT_LEADER_OR_FOLLOWER
        if any(code not in (ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) for code in errors.values()):
            try:
                await asyncio.wait_for(changed.wait(), METADATA_WAIT_MS / 1000)
            except asyncio.TimeoutError:
                pass
        return errors

    # ------------------------------------------------------------------------------ per broker
    def _enqueue(self, broker_id: int, pending: _Pending) -> asyncio.Future[dict[TopicPartition, ErrorCode]]:
        self._queues.setdefault(broker_id, []).append(pending)
        sender = self._senders.get(broker_id)
        if sender is None or sender.done():
            self._senders[broker_id] = asyncio.get_running_loop().create_task(self._send(broker_id))
        return pending.done

    async def _send(self, broker_id: int) -> None:
        queue = self._queues[broker_id]
        while queue and not self._closed:
            batch = queue[:MAX_MARKERS_PER_REQUEST]
            del queue[:len(batch)]
            try:
                results = await self._request(broker_id, batch)
            except Exception as e:     # unreachable (BrokerUnreachable), or an answer that does not fit: retried
                log.info("WriteTxnMarkers to broker %d: %s", broker_id, e)
                results = [{tp: ErrorCode.NOT_LEADER_OR_FOLLOWER for tp in p.partitions} for p in batch]
            for p, result in zip(batch, results):
                if not p.done.done():
                    p.done.set_result(result)
        if not queue:
            self._queues.pop(broker_id, None)

    async def _request(self, broker_id: int, batch: list[_Pending]) -> list[dict[TopicPartition, ErrorCode]]:
        request = wtm.WriteTxnMarkersRequest(markers=[
            wtm.WritableTxnMarker(
                producer_id=p.job.producer_id, producer_epoch=p.job.producer_epoch,
                transaction_result=p.job.commit, coordinator_epoch=p.coordinator_epoch,
                topics=[wtm.WritableTxnMarkerTopic(name=name, partition_indexes=[i for t, i in p.partitions if t == name])
                        for name in dict.fromkeys(t for t, _ in p.partitions)])
            for p in batch])
        response = await self.channels.request(PURPOSE, broker_id, WRITE_TXN_MARKERS_KEY, request,
                                               timeout_ms=REQUEST_TIMEOUT_MS)
        if len(response.markers) != len(batch):
            raise ValueError(f"{len(response.markers)} marker result(s) for {len(batch)} marker(s)")
        out: list[dict[TopicPartition, ErrorCode]] = []
        for p, result in zip(batch, response.markers):
            if result.producer_id != p.job.producer_id:
                raise ValueError(f"marker result for producer {result.producer_id}, not {p.job.producer_id}")
            errors = {tp: ErrorCode.NOT_LEADER_OR_FOLLOWER for tp in p.partitions}
            for t in result.topics:
                for r in t.partitions:
                    tp = (t.name, r.partition_index)
                    if tp in errors:
                        code = for_code(r.error_code)
                        errors[tp] = ErrorCode.NONE if code in SUPERSEDED else code
            out.append(errors)
        return out

    async def aclose(self) -> None:
        self._closed = True
        for task in self._senders.values():
            task.cancel()
        for task in self._senders.values():
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        for queue in self._queues.values():
            for p in queue:
                if not p.done.done():
                    p.done.cancel()
        self._senders.clear()
        self._queues.clear()


def _exists(image: MetadataImage, tp: TopicPartition) -> bool:
    info = image.topic(tp[0])
    return info is not None and tp[1] in info.partitions
