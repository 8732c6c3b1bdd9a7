"""Fetch (key 1): read from partition logs, waiting for data when asked (seed 003, "The Consumer",
"Fetch API"; seed 004, "Fetch API"; KIP-227 fetch sessions in `fetch_session.py`).

- The partitions of a request are a set, as in Kafka (its FetchRequest.fetchData is an insertion-ordered
  map keyed by topic, or topic id from v13, and partition): a partition named again keeps its first
  place, takes the later entry's fetch position, and is answered once. Consecutive partitions of one
  topic share a topic entry in the response, in request order.
- Long poll: when fewer than `min_bytes` are available the request waits up to `max_wait_ms` and is
  answered as soon as an append to any of its partitions brings enough data. The wait is capped by
  `fetch.purgatory.max.wait.ms` (odradek's; Kafka waits as long as the client asks, up to 24 days), and
  a waiting request is parked: it does not count in `queued.max.requests` (`server/purgatory.py`).
- Limits: the response is bounded by min(`max_bytes` (v3+), `fetch.max.bytes`) and each partition by
  `partition_max_bytes`. From v3 (KIP-74) the first partition with data returns at least one whole
  batch even beyond them, so a consumer is never stuck behind a batch larger than its limits. Before
  v3 the limits are hard, as in Kafka: a first batch larger than `partition_max_bytes` is answered
  with a partial message (an overflow entry), which those readers report as a message too large for
  their fetch size, and a partition the response limit cuts is left for the next fetch.
- Consumers read below the high watermark (read_uncommitted) or the last stable offset
  (read_committed, with the aborted transactions of the range from the transaction indexes, so the
  consumer drops their batches); followers (replica id >= 0) read to the log end.
- Versions 0-3 predate record batch v2: their records are down-converted to magic 0 (v0-1) or 1
  (v2-3) lazily, a bounded chunk at a time on the worker pool while the response is sent (KIP-283,
  `record_slices.LegacyRecords`); a topic with `message.downconversion.enable=false` answers
  UNSUPPORTED_VERSION to them instead, and a zstd batch UNSUPPORTED_COMPRESSION_TYPE (Kafka's
  RecordsUtil.downConvert refuses it). A range of control batches only converts to nothing: it is
  answered empty (Kafka sends an overflow entry that readers report as an error) and counts for
  nothing against `min_bytes`, so such a reader waits for data like any other.
"""

from __future__ import annotations

import logging
import struct

from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages import fetch as m
from odradek.server.context import RequestContext
from odradek.server.fetch_session import FetchSession, Wanted
from odradek.server.metadata_cache import MetadataImage
from odradek.server.partition import READ_COMMITTED
from odradek.server.record_slices import LegacyRecords, RecordSlices, UnsupportedCompressionForLegacy
from odradek.storage.errors import StorageError

log = logging.getLogger("odradek.fetch")

INT32_MAX = 2**31 - 1
MAX_WAIT_CAP_KEY = "fetch.purgatory.max.wait.ms"
# A partial legacy entry: offset -1 and a message size past the end (Kafka's overflow batch).
OVERSIZED_FIRST_BATCH = struct.pack(">qi", -1, 61)


def _replica_id(request: m.FetchRequest, version: int) -> int:
    return request.replica_state.replica_id if version >= 15 else request.replica_id


def _records_size(records: RecordSlices | LegacyRecords | bytes) -> int:
    return records.size if hasattr(records, "size") else len(records)


def read_partitions(ctx: RequestContext, wanted: Wanted, *, version: int, max_bytes: int, isolation: int,
                    replica_id: int, session: FetchSession | None = None,
                    ) -> tuple[list[m.FetchableTopicResponse], int, bool]:
    """(responses by topic, bytes read, any error) for [(topic, topic_id, [FetchPartition])].

    A follower's incremental session names every partition it copies from here, most of them idle (the
    50 of `__consumer_offsets`, say) and read at every fetch. A partition the follower has all of,
    whose high watermark, last stable offset and log start are those the session's last answer carried,
    only has its follower fetch state noted: the incremental answer would leave it out anyway."""
    remaining = max_bytes
    total = 0
    any_error = False
    out = []
    now_ms = ctx.clock() if replica_id >= 0 else 0    # only a follower's fetch state keeps time
    idle_check = session is not None and replica_id >= 0
    rm = ctx.replica_manager
    for topic, topic_id, partitions in wanted:
        datas = []
        ident = topic_id if version >= 13 else topic
        for fp in partitions:
            if idle_check and topic is not None:
                answered = session.answered(ident, fp.partition)    # type: ignore[union-attr]
                if answered is not None and rm.follower_idle(topic, fp.partition, fp.fetch_offset,
                                                             fp.current_leader_epoch, replica_id, answered, now_ms):
                    continue
            pd, size = _read_partition(ctx, topic, fp, now_ms, version=version, remaining=remaining,
                                       first=total == 0, isolation=isolation, replica_id=replica_id)
            any_error = any_error or pd.error_code != ErrorCode.NONE
            total += size
            remaining -= size
            datas.append(pd)
        if datas:
            out.append(m.FetchableTopicResponse(topic=topic or "", topic_id=topic_id, partitions=datas))
    return out, total, any_error


def _read_partition(ctx: RequestContext, topic: str | None, fp: m.FetchPartition, now_ms: int, *, version: int,
                    remaining: int, first: bool, isolation: int, replica_id: int) -> tuple[m.PartitionData, int]:
    if topic is None:
        return m.PartitionData(partition_index=fp.partition, error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                               high_watermark=-1, records=b""), 0
    budget = min(fp.partition_max_bytes, remaining)
    # Before v3 a whole first batch is asked for only to tell "too large" from "nothing".
    r = ctx.replica_manager.read(topic, fp.partition, fetch_offset=fp.fetch_offset,
                                 current_leader_epoch=fp.current_leader_epoch, replica_id=replica_id,
                                 isolation=isolation, max_bytes=max(budget, 0), min_one_batch=first or version < 3,
                                 now_ms=now_ms)
    if r.error in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.NOT_LEADER_OR_FOLLOWER):
        return m.PartitionData(partition_index=fp.partition, error_code=r.error, high_watermark=-1, records=b""), 0
    pd = m.PartitionData(partition_index=fp.partition, error_code=r.error, high_watermark=r.high_watermark,
                         last_stable_offset=r.last_stable_offset, log_start_offset=r.log_start_offset,
                         aborted_transactions=[] if isolation == READ_COMMITTED else None, records=b"")
    if r.error:
        return pd, 0
    if version < 4 and replica_id < 0 and \
            not ctx.metadata.topic_config(topic).get_value("message.downconversion.enable"):
        pd.error_code = ErrorCode.UNSUPPORTED_VERSION
        return pd, 0
    if not r.slices:
        return pd, 0
    if version < 3 and r.size > budget:
        if budget < fp.partition_max_bytes:
            return pd, 0      # the response is full; the next fetch gets it
        pd.records = OVERSIZED_FIRST_BATCH
        return pd, len(OVERSIZED_FIRST_BATCH)
    pd.records = RecordSlices(r.slices)
    if r.aborted_transactions:
        pd.aborted_transactions = [m.AbortedTransaction(producer_id=a.producer_id, first_offset=a.first_offset)
                                   for a in r.aborted_transactions]
    return pd, r.size


async def down_convert(ctx: RequestContext, wanted: Wanted, responses: list[m.FetchableTopicResponse],
                       magic: int) -> tuple[int, bool]:
    """Replace the stored batches of every partition by their lazy conversion to `magic` messages
    (the first batch converted now, on the worker pool, to size them); (bytes answered, any error)."""
    total = 0
    any_error = False
    for (_, _, asked), topic_resp in zip(wanted, responses):
        for fp, pd in zip(asked, topic_resp.partitions):
            if isinstance(pd.records, RecordSlices):
                try:
                    converted = await LegacyRecords.convert_first(pd.records.slices, magic, fp.fetch_offset,
                                                                  ctx.workers)
                except UnsupportedCompressionForLegacy:
                    pd.error_code = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE     # zstd, as Kafka answers
                    converted = None
                    any_error = True
                except (ProtocolError, StorageError, OSError) as e:
                    log.error("down-converting %s-%d failed: %s", topic_resp.topic, pd.partition_index, e)
                    pd.error_code = (ErrorCode.CORRUPT_MESSAGE if isinstance(e, ProtocolError)
                                     else ErrorCode.KAFKA_STORAGE_ERROR)
                    converted = None
                    any_error = True
                pd.records = converted if converted is not None else b""
            total += _records_size(pd.records)
    return total, any_error


async def handle_fetch(ctx: RequestContext, request: m.FetchRequest) -> m.FetchResponse:
    v = ctx.api_version
    replica_id = _replica_id(request, v)
    isolation = request.isolation_level if v >= 4 else 0
    max_bytes = min(request.max_bytes if v >= 3 else INT32_MAX, ctx.config.get("fetch.max.bytes"))
    min_bytes = min(max(request.min_bytes, 1), max_bytes)
    image = ctx.metadata.image
    session, error = ctx.fetch_sessions.update(request, v, image)
    if error:
        return m.FetchResponse(throttle_time_ms=0, error_code=error, session_id=0, responses=[])
    wanted = session.wanted(request, v, image) if session is not None else _wanted(request, v, image)
    loop_time = ctx.clock
    started = loop_time()
    deadline: int | None = None      # known once the request has to wait

    async def read() -> tuple[list[m.FetchableTopicResponse], int, bool]:
        responses, total, any_error = read_partitions(
            ctx, wanted, version=v, max_bytes=max_bytes, isolation=isolation, replica_id=replica_id,
            session=session)
        if v < 4:
            total, convert_error = await down_convert(ctx, wanted, responses, 0 if v < 2 else 1)
            any_error = any_error or convert_error
        return responses, total, any_error

    while True:
        responses, total, any_error = await read()
        if total >= min_bytes or any_error or not wanted:
            break
        if deadline is None:
            deadline = started + min(max(request.max_wait_ms, 0), ctx.config.get(MAX_WAIT_CAP_KEY))
        wait_ms = deadline - loop_time()
        keys = [(t, fp.partition) for t, _, parts in wanted if t is not None for fp in parts]
        if wait_ms <= 0 or not await ctx.replica_manager.wait_for_data(keys, wait_ms, replica_id=replica_id):
            responses, total, any_error = await read()
            break
    if session is not None:
        responses = session.filter_response(responses, v)
    return m.FetchResponse(throttle_time_ms=0, error_code=ErrorCode.NONE,
                           session_id=session.id if session is not None else 0, responses=responses)


def _wanted(request: m.FetchRequest, version: int, image: MetadataImage) -> Wanted:
    """[(topic name or None, topic id, [FetchPartition])]: each partition once, Kafka's way."""
    chosen: dict[tuple, tuple] = {}
    for t in request.topics:
        if version >= 13:
            info = image.topic_by_id(t.topic_id)
            name, ident = (info.name if info else None), t.topic_id
        else:
            name, ident = t.topic, t.topic
        for fp in t.partitions:
            chosen[(ident, fp.partition)] = (name, t.topic_id, fp)   # an existing key keeps its place
    out: Wanted = []
    for name, topic_id, fp in chosen.values():
        if out and out[-1][0] == name and out[-1][1] == topic_id:
            out[-1][2].append(fp)
        else:
            out.append((name, topic_id, [fp]))
    return out
