"""The asyncio consumer (seed 003, "The Consumer": pull, long poll, the position is one offset).

    async with Consumer({"bootstrap.servers": "localhost:9092", "auto.offset.reset": "earliest"}) as c:
        c.assign([TopicPartition("events", 0), TopicPartition("events", 1)])
        async for record in c:                       # per record
            ...
        records = await c.getmany(timeout_ms=500)    # {tp: [ConsumerRecord]}, max.poll.records at most
        columns = await c.getmany_columns()          # {tp: RecordColumns}: lists, no object per record
        async for batch in c.batches():              # whole v2 batches, raw bytes, for bulk readers
            ...

Partitions are assigned by the application (`assign`) or by the group (`subscribe`, with `group.id`:
see `group` and `group_runtime`; rebalance callbacks, committing on revoke and applying a new assignment
run inside getmany/poll, as Java's consumer runs them inside poll). `commit`, `commit_async` and
`committed` use the group's coordinator; with enable.auto.commit the positions handed out are committed
every auto.commit.interval.ms, on revoke and on close. One fetcher task, owned by
the consumer (`start()` / `aclose()`), keeps at most one Fetch in flight per broker, for the partitions
that broker leads and that have fewer than two responses buffered (see `fetcher`); it long-polls with
`fetch.min.bytes` and `fetch.max.wait.ms` and bounds responses with `fetch.max.bytes` and
`max.partition.fetch.bytes`. Positions are reset by ListOffsets: at assignment when unknown and on
OFFSET_OUT_OF_RANGE, by `auto.offset.reset` (earliest, latest, or none: `OffsetOutOfRangeError`), and on
`seek_to_beginning` / `seek_to_end` (`consumer_offsets`). Errors that say the metadata is stale refresh
it and back off.

Reading: each fetched batch is decoded once, in bulk (`odradek.records.columns`), a chunk of batches at
a time, and every poll hands out the next slice of it, so a record costs the same whatever
max.poll.records is. A poll that finds data buffered returns without suspending; so that the fetcher
task and the socket keep going meanwhile, a poll yields to the loop once when the fetcher was woken or
after every YIELD_EVERY_RECORDS records handed out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Iterable

from odradek.client.cluster import STALE_METADATA_ERRORS, Cluster, now_ms
from odradek.client.errors import (
    CorruptRecordError, IllegalStateError, KafkaConnectionError, KafkaError, NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)
from odradek.client.fetcher import (
    CompletedFetch, ConsumerRecord, FetchedBatch, OffsetAndTimestamp, PartitionState, TopicPartition,
    to_fetched_batch,
)
from odradek.client.consumer_group import GroupConsumer
from odradek.client.consumer_offsets import OffsetLookups
from odradek.client.group import consumer_group_config
from odradek.protocol.error_codes import ErrorCode
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages import fetch as fm
from odradek.records.columns import RecordColumns, load_bulk_decoder

log = logging.getLogger("odradek.client.consumer")

FETCH_KEY = 1
YIELD_EVERY_RECORDS = 2048

__all__ = ["Consumer", "ConsumerRecord", "FetchedBatch", "OffsetAndTimestamp", "RecordColumns", "TopicPartition"]


def _tp(x) -> TopicPartition:
    return x if isinstance(x, TopicPartition) else TopicPartition(*x)


class Consumer(GroupConsumer, OffsetLookups):
    def __init__(self, config: dict | None = None, **kwargs) -> None:
        self.config = c = consumer_group_config(config, **kwargs)
        self.isolation_level = 1 if c["isolation.level"] == "read_committed" else 0
        self.cluster: Cluster | None = None
        self._states: dict[TopicPartition, PartitionState] = {}
        self._completed: list[CompletedFetch] = []
        self._current: CompletedFetch | None = None
        self._node_in_flight: set[int] = set()
        self._task: asyncio.Task | None = None
        self._wake: asyncio.Event | None = None
        self._data: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._handed = 0      # records handed out since the last poll that yielded to the loop
        self._init_group()

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> "Consumer":
        if self._task is not None:
            return self
        load_bulk_decoder()    # numpy's import (~0.1 s) here, not in the first poll
        self.cluster = Cluster(self.config)
        self._wake = asyncio.Event()
        self._data = asyncio.Event()
        self.cluster.add_topics({tp.topic for tp in self._states})
        try:
            await self.cluster.start()
        except BaseException:
            await self.cluster.aclose()
            raise
        await self._start_group()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="odradek-consumer-fetcher")
        return self

    async def __aenter__(self) -> "Consumer":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._closed:
            return
        if self._group is not None:
            await self._close_group()
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self.cluster is not None:
            await self.cluster.aclose()
        if self._data is not None:
            self._data.set()

    # ------------------------------------------------------------------------------------ assignment
    def assign(self, partitions: Iterable) -> None:
        """Replace the assignment. New partitions start at `auto.offset.reset` unless seeked."""
        if self._subscribed is not None:
            raise IllegalStateError("subscribe() and assign() are mutually exclusive; unsubscribe() first")
        wanted = [_tp(p) for p in partitions]
        self._manual = bool(wanted)
        self._set_assignment(wanted)

    def _set_assignment(self, wanted: list[TopicPartition], initializing: bool = False) -> None:
        """Keep the states of partitions still wanted; new ones wait for their committed offsets when
        `initializing`, else start at auto.offset.reset."""
        for tp in list(self._states):
            if tp not in wanted:
                del self._states[tp]
        for tp in wanted:
            if tp not in self._states:
                st = self._states[tp] = PartitionState(tp)
                if initializing:
                    self._awaiting_committed.add(tp)
                else:
                    st.reset = self.config["auto.offset.reset"]
        self._awaiting_committed &= set(self._states)
        self._completed = [f for f in self._completed if f.tp in self._states]
        if self._current is not None and self._current.tp not in self._states:
            self._current = None
        if self.cluster is not None:
            self.cluster.add_topics({tp.topic for tp in wanted})
        self._kick()

    def assignment(self) -> set[TopicPartition]:
        return set(self._states)

    def _state(self, tp) -> PartitionState:
        st = self._states.get(_tp(tp))
        if st is None:
            raise IllegalStateError(f"{tp} is not assigned")
        return st

    # ------------------------------------------------------------------------------------ positions
    def seek(self, tp, offset: int) -> None:
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self._state(tp).seek(offset)
        self._drop_buffered(_tp(tp))
        self._kick()

    def seek_to_beginning(self, *partitions) -> None:
        for tp in partitions or list(self._states):
            self._state(tp).request_reset("earliest")
            self._drop_buffered(_tp(tp))
        self._kick()

    def seek_to_end(self, *partitions) -> None:
        for tp in partitions or list(self._states):
            self._state(tp).request_reset("latest")
            self._drop_buffered(_tp(tp))
        self._kick()

    async def position(self, tp, timeout_ms: int | None = None) -> int:
        """The offset of the next record to be handed out, resolving a pending reset first."""
        st = self._state(tp)
        self._check_open()
        if st.position is None and st.tp in self._awaiting_committed:
            await self._init_committed()
        if st.position is None:
            await self._reset_positions([st])
            if st.position is None:
                raise NoOffsetForPartitionError(f"no position for {tp}")
        return st.position

    def highwater(self, tp) -> int:
        return self._state(tp).high_watermark

    def pause(self, *partitions) -> None:
        for tp in partitions:
            st = self._state(tp)
            if not st.paused:
                st.paused = True

    def resume(self, *partitions) -> None:
        for tp in partitions:
            self._state(tp).paused = False
        self._kick()

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self._states.items() if st.paused}

    # ------------------------------------------------------------------------------------ reading
    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None
                      ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition, waiting up to timeout_ms for the first; at most max.poll.records.

        Each fetched batch is decoded once (`CompletedFetch.take_records`); a poll takes the next slice
        of the decoded records, so the cost per record does not depend on max_records."""
        return await self._take(timeout_ms, max_records, False)

    async def getmany_columns(self, timeout_ms: int = 0, max_records: int | None = None
                              ) -> dict[TopicPartition, RecordColumns]:
        """`getmany` in bulk: per partition, the records as columns (offsets, timestamps,
        timestamp_types, keys, values, headers: parallel lists), without a record object each.
        Positions, commits and max.poll.records work as with getmany."""
        return await self._take(timeout_ms, max_records, True)

    async def _take(self, timeout_ms: int, max_records: int | None, columns: bool) -> dict:
        limit = max_records or self.config["max.poll.records"]
        if self._wake is not None and (self._wake.is_set() or self._handed >= YIELD_EVERY_RECORDS):
            # Buffered data lets a poll return without suspending; the fetcher task and the socket
            # reads only run when the loop does: yield once, so the next Fetch goes out and responses
            # are read while the application works through the buffer.
            self._handed = 0
            await asyncio.sleep(0)
        out: dict = {}
        n = 0
        deadline = now_ms() + timeout_ms
        self._poll_started()
        try:
            while n < limit:
                if not n:
                    await self._group_poll()
                cf = self._next_fetch()
                if cf is None:
                    if n or not await self._wait_data(deadline):
                        break
                    continue
                st = cf.state
                try:
                    if columns:
                        got = cf.take_columns(st.position, limit - n)
                        count = len(got) if got is not None else 0
                    else:
                        got = cf.take_records(st.position, limit - n)
                        count = len(got)
                except ProtocolError as e:
                    if n:         # what came before it first; the next poll raises
                        break
                    raise CorruptRecordError(f"{cf.tp} after offset {st.position}: {e}") from e
                if not count:     # this fetch is read: past any control batches at its end
                    if cf.next_offset > st.position:
                        st.position = cf.next_offset
                    self._release(cf)
                    self._current = None
                    continue
                st.position = (got.last_offset if columns else got[-1].offset) + 1
                before = out.get(cf.tp)
                if before is None:
                    out[cf.tp] = got
                elif columns:
                    before.extend(got)
                else:
                    before += got
                n += count
        finally:
            self._poll_ended()
        self._handed += n
        return out

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[ConsumerRecord]:
        by_tp = await self.getmany(timeout_ms, max_records)
        if len(by_tp) == 1:
            for records in by_tp.values():
                return records
        out: list[ConsumerRecord] = []
        for records in by_tp.values():
            out += records
        return out

    def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        return self._iter_records()

    async def _iter_records(self):
        while not self._closed:
            for records in (await self.getmany(timeout_ms=1000)).values():
                for r in records:
                    yield r

    async def fetch_batches(self, timeout_ms: int = 0, max_batches: int = 1000) -> list[FetchedBatch]:
        """Whole record batches (raw v2 bytes), waiting up to timeout_ms for the first."""
        out: list[FetchedBatch] = []
        deadline = now_ms() + timeout_ms
        self._poll_started()
        try:
            while len(out) < max_batches:
                if not out:
                    await self._group_poll()
                cf = self._next_fetch()
                if cf is None:
                    if out or not await self._wait_data(deadline):
                        break
                    continue
                st = cf.state
                try:
                    entry = cf.take_batch(st.position)
                except ProtocolError as e:
                    if out:
                        break
                    raise CorruptRecordError(f"{cf.tp} after offset {st.position}: {e}") from e
                if entry is None:
                    if cf.next_offset > st.position:
                        st.position = cf.next_offset
                    self._release(cf)
                    self._current = None
                    continue
                fb = to_fetched_batch(cf.tp, entry, st.position, cf.high_watermark)
                st.position = fb.next_offset
                out.append(fb)
        finally:
            self._poll_ended()
        return out

    async def batches(self, timeout_ms: int | None = None) -> AsyncIterator[FetchedBatch]:
        """`async for batch in consumer.batches()`: every batch as it arrives; with timeout_ms, stop
        after that long without data."""
        while not self._closed:
            got = await self.fetch_batches(timeout_ms=1000 if timeout_ms is None else timeout_ms)
            if not got and timeout_ms is not None:
                return
            for b in got:
                yield b

    def _next_fetch(self) -> CompletedFetch | None:
        """The buffered fetch to read next (still current: not seeked, reset, unassigned or paused
        since it was fetched), or None."""
        self._raise_error()
        while True:
            cf = self._current
            if cf is None:
                cf = self._pop_completed()
                if cf is None:
                    return None
                self._current = cf
            st = cf.state
            if self._states.get(cf.tp) is not st or st.epoch != cf.epoch:
                self._release(cf)
                self._current = None
                continue
            if st.paused:   # keep a paused partition's data for resume()
                self._completed.insert(0, cf)
                self._current = None
                continue
            return cf

    def _pop_completed(self) -> CompletedFetch | None:
        """The oldest buffered fetch that is not paused (stale ones are dropped on the way)."""
        for i, cf in enumerate(self._completed):
            st = cf.state
            if self._states.get(cf.tp) is not st or st.epoch != cf.epoch:
                continue
            if not st.paused:
                return self._completed.pop(i)
        stale = [cf for cf in self._completed if self._states.get(cf.tp) is not cf.state
                 or cf.state.epoch != cf.epoch]
        if stale:
            self._completed = [cf for cf in self._completed if cf not in stale]
        return None

    def _release(self, cf: CompletedFetch) -> None:
        st = cf.state
        if st.epoch == cf.epoch and st.buffered:
            st.buffered -= 1
        self._kick()

    def _drop_buffered(self, tp: TopicPartition) -> None:
        self._completed = [cf for cf in self._completed if cf.tp != tp]
        if self._current is not None and self._current.tp == tp:
            self._current = None

    async def _wait_data(self, deadline: float) -> bool:
        left = deadline - now_ms()
        if left <= 0:
            return False
        self._check_open()
        self._data.clear()
        if self._group_step_ready():
            return True
        try:
            async with asyncio.timeout(left / 1000):
                await self._data.wait()
        except TimeoutError:
            return False
        return not self._closed

    def _raise_error(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def _check_open(self) -> None:
        if self._task is None:
            raise IllegalStateError("consumer not started: await start() or use `async with`")
        if self._closed:
            raise IllegalStateError("consumer is closed")

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------------------------ fetcher task
    async def _run(self) -> None:
        backoff = self.config["retry.backoff.ms"]
        while True:
            self._wake.clear()
            await self.cluster.maybe_refresh()
            resets = [st for st in self._states.values() if st.reset is not None and now_ms() >= st.retry_at_ms]
            if resets:
                try:
                    await self._reset_positions(resets)
                except KafkaError as e:
                    log.info("offset reset failed: %s", e)
                    for st in resets:
                        st.retry_at_ms = now_ms() + backoff
            await self._send_fetches()
            if self._wake.is_set():
                continue
            try:
                async with asyncio.timeout(min(backoff if self.cluster.stale() else 1000, 1000) / 1000):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _send_fetches(self) -> None:
        now = now_ms()
        meta = self.cluster.metadata
        by_node: dict[int, list[PartitionState]] = {}
        for st in self._states.values():
            if not st.fetchable(now):
                continue
            leader = meta.leader_for(st.tp.topic, st.tp.partition)
            if leader < 0:
                self.cluster.request_update()
                continue
            if leader not in self._node_in_flight:
                by_node.setdefault(leader, []).append(st)
        c = self.config
        for node, states in by_node.items():
            conn = self.cluster.connection_nowait(node)
            if conn is None:
                if self.cluster.connection_failed_recently(node):
                    continue
                try:
                    conn = await self.cluster.connection(node)
                except KafkaConnectionError as e:
                    log.info("cannot connect to broker %d: %s", node, e)
                    continue
            if not conn.can_send():
                continue
            topics: dict[str, list] = {}
            sent = []
            for st in states:
                if not st.fetchable(now_ms()):
                    continue
                topics.setdefault(st.tp.topic, []).append(fm.FetchPartition(
                    partition=st.tp.partition, fetch_offset=st.fetch_offset,
                    current_leader_epoch=meta.leader_epoch(st.tp.topic, st.tp.partition),
                    partition_max_bytes=c["max.partition.fetch.bytes"]))
                sent.append((st, st.epoch, st.fetch_offset))
            if not sent:
                continue
            request = fm.FetchRequest(
                replica_id=-1, max_wait_ms=c["fetch.max.wait.ms"], min_bytes=c["fetch.min.bytes"],
                max_bytes=c["fetch.max.bytes"], isolation_level=self.isolation_level, session_id=0,
                session_epoch=-1, rack_id=c["client.rack"],
                topics=[fm.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()])
            try:
                fut = conn.send_nowait(FETCH_KEY, request,
                                       timeout_ms=c["request.timeout.ms"] + c["fetch.max.wait.ms"])
            except KafkaError as e:
                log.info("fetch to broker %d failed: %s", node, e)
                continue
            for st, _, _ in sent:
                st.in_flight = True
            self._node_in_flight.add(node)
            fut.add_done_callback(lambda f, n=node, s=sent: self._on_fetch(f, n, s))

    def _on_fetch(self, fut: asyncio.Future, node: int, sent: list) -> None:
        self._node_in_flight.discard(node)
        for st, _, _ in sent:
            st.in_flight = False
        self._kick()
        if fut.cancelled() or fut.exception() is not None:
            if not fut.cancelled():
                log.info("fetch from broker %d failed: %s", node, fut.exception())
            self.cluster.request_update()
            return
        response = fut.result()
        if response.error_code:
            log.info("fetch from broker %d: error %s", node, ErrorCode(response.error_code).name)
            return
        by_tp = {(st.tp.topic, st.tp.partition): (st, epoch, offset) for st, epoch, offset in sent}
        backoff = self.config["retry.backoff.ms"]
        got = False
        for t in response.responses:
            for p in t.partitions:
                item = by_tp.get((t.topic, p.partition_index))
                if item is None:
                    continue
                st, epoch, offset = item
                if self._states.get(st.tp) is not st or st.epoch != epoch or st.fetch_offset != offset:
                    continue   # seeked, reset or unassigned meanwhile
                err = p.error_code
                if err == 0:
                    st.high_watermark = p.high_watermark
                    st.last_stable_offset = p.last_stable_offset
                    st.log_start_offset = p.log_start_offset
                    if p.records is not None and len(p.records):
                        try:
                            cf = CompletedFetch(st, p.records, offset, p.high_watermark, p.aborted_transactions,
                                                self.isolation_level == 1, self.config["check.crcs"])
                        except ProtocolError as e:   # records that do not frame: tell the application, retry
                            self._error = KafkaError(f"{st.tp}: fetch at offset {offset} returned corrupt records: {e}")
                            st.retry_at_ms = now_ms() + backoff
                            got = True
                            continue
                        end = cf.scan_end()
                        if end > offset:
                            st.fetch_offset = end
                            st.buffered += 1
                            self._completed.append(cf)
                            got = True
                        else:
                            log.warning("%s: fetch at %d returned no whole batch", st.tp, offset)
                            st.retry_at_ms = now_ms() + backoff
                elif err == ErrorCode.OFFSET_OUT_OF_RANGE:
                    policy = self.config["auto.offset.reset"]
                    if policy == "none":
                        self._error = OffsetOutOfRangeError({st.tp: offset})
                        st.retry_at_ms = now_ms() + backoff
                        got = True
                    else:
                        log.info("%s: offset %d out of range, resetting to %s", st.tp, offset, policy)
                        st.request_reset(policy)
                else:
                    if err in STALE_METADATA_ERRORS:
                        self.cluster.request_update()
                    else:
                        log.warning("%s: fetch error %s", st.tp, ErrorCode(err).name)
                    st.retry_at_ms = now_ms() + backoff
        if got:
            self._data.set()
