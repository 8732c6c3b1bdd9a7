"""The asyncio shell around `group.Membership`: one task, one coordinator connection, no group logic.

`GroupRuntime` is owned by the consumer (`start()` / `aclose()`). Its task sends what the membership
asks for and feeds back the answers: FindCoordinator to any broker (v4+ batched form when the broker
speaks it; each version's encoder writes the fields it has), everything else over a connection of its
own to the coordinator, because a broker handles one request per connection at a time and a JoinGroup
parked there until the join phase ends (up to max.poll.interval.ms) would hold up fetches. For the
leader it gathers partition counts and hands them to `Membership.assign`; for a pattern subscription
it lists the cluster's topics every metadata.max.age.ms. When the membership has an application step
(revoke, assign) or a fatal error it calls `notify()`, which wakes the consumer's poll.

Offsets: `commit` (OffsetCommit with the generation and member id, retried while the coordinator moves
or loads, up to default.api.timeout.ms), `commit_async` (queued, sent by the task, the callback gets
(offsets, error)) and `committed` (OffsetFetch, require_stable).
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import re

from odradek.client.cluster import METADATA_KEY, Cluster, now_ms
from odradek.client.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, UnsupportedVersionError
from odradek.client.fetcher import TopicPartition
from odradek.client.group import OFFSET_COMMIT, OFFSET_FETCH, AssignStep, Membership, PrepareStep, Send, State
from odradek.client.network import BrokerConnection
from odradek.protocol.codec import ZERO_UUID
from odradek.protocol.messages import metadata as md
from odradek.protocol.messages import offset_commit as oc
from odradek.protocol.messages import offset_fetch as of

log = logging.getLogger("odradek.client.group")

ASYNC_COMMITS_MAX = 1000
LEAVE_TIMEOUT_MS = 5000


class GroupRuntime:
    def __init__(self, cluster: Cluster, config: dict, membership: Membership, notify) -> None:
        self.cluster = cluster
        self.config = config
        self.m = membership
        self.notify = notify
        self.pattern: re.Pattern | None = None
        self._conn: BrokerConnection | None = None
        self._conn_for: tuple | None = None
        self._ready = asyncio.Event()          # a live connection to the coordinator
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._async_commits: collections.deque = collections.deque()
        self._deferred: collections.deque = collections.deque()   # awaitables from user callbacks
        self._pattern_at = 0.0
        self._metadata_version = -1

    # ------------------------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"odradek-group-{self.m.group_id}")

    async def aclose(self) -> None:
        """Stop the task, send LeaveGroup (dynamic members), close the coordinator connection."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as e:  # noqa: BLE001 - the task died; closing goes on
                log.warning("group %s: membership task failed: %s", self.m.group_id, e)
        while self._deferred:
            await self._run_deferred(self._deferred.popleft())
        send = self.m.leave(now_ms())
        if send is not None and self._conn is not None and not self._conn.closed:
            try:
                await asyncio.wait_for(self._conn.request(send.api_key, send.body), LEAVE_TIMEOUT_MS / 1000)
            except (KafkaError, TimeoutError) as e:
                log.info("group %s: LeaveGroup failed: %s", self.m.group_id, e)
        self._close_conn()
        for offsets, callback in self._async_commits:
            self._callback(callback, offsets, KafkaError("consumer closed before the commit was sent"))
        self._async_commits.clear()
        while self._deferred:
            await self._run_deferred(self._deferred.popleft())

    def wake(self) -> None:
        self._wake.set()

    def defer(self, awaitable) -> None:
        """Run a user callback's awaitable on the membership task (it owns it)."""
        self._deferred.append(awaitable)
        self.wake()

    def send_now(self, send: Send | None) -> None:
        """Send a request the membership handed out of turn (LeaveGroup on unsubscribe)."""
        if send is not None:
            self._deferred.append(self._dispatch(send))
            self.wake()

    def set_pattern(self, pattern: re.Pattern | None) -> None:
        self.pattern = pattern
        self._pattern_at = 0.0
        self.wake()

    # ------------------------------------------------------------------------------------ the task
    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception as e:  # noqa: BLE001 - a bug here must reach the application, not vanish
            log.exception("group %s: membership task failed", self.m.group_id)
            self.m.fail(KafkaError(f"group membership failed: {e!r}"))
            self.notify()

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            while self._deferred:
                await self._run_deferred(self._deferred.popleft())
            now = now_ms()
            await self._sync_connection()
            if self.pattern is not None and now >= self._pattern_at:
                await self._resolve_pattern()
            self._check_metadata()
            topics = self.m.partition_counts_needed()
            if topics is not None:
                await self._assign(topics)
            for send in self.m.actions(now_ms()):
                await self._dispatch(send)
            self._send_async_commits()
            self._after_event()
            if self._wake.is_set():
                continue
            waits = [self.m.timeout_ms(now_ms())]
            if self.pattern is not None:
                waits.append(max(0.0, self._pattern_at - now_ms()))
            waits = [w for w in waits if w is not None]
            try:
                async with asyncio.timeout(min(waits + [1000.0]) / 1000):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _after_event(self) -> None:
        if self.m.app_step() is not None or self.m.fatal is not None:
            self.notify()

    async def _sync_connection(self) -> None:
        """Keep `_conn` pointed at the membership's coordinator (connect, or close a stale one)."""
        want = self.m.coordinator
        conn = self._conn
        if conn is not None and (conn.closed or self._conn_for != want):
            if conn.closed and want is not None and self._conn_for == want:
                self.m.coordinator_lost(now_ms(), "the coordinator connection closed")
                want = None
            self._close_conn()
        if want is None or self._conn is not None:
            return
        node, host, port = want
        c = self.config
        try:
            self._conn = await BrokerConnection.connect(
                host, port, node_id=node, client_id=c["client.id"], request_timeout_ms=c["request.timeout.ms"],
                connect_timeout_ms=c["socket.connection.setup.timeout.ms"],
                max_frame_bytes=c["receive.message.max.bytes"], software_name=c["client.software.name"],
                software_version=c["client.software.version"])
        except KafkaConnectionError as e:
            self.m.coordinator_lost(now_ms(), f"cannot connect: {e}")
            return
        self._conn_for = want
        self._ready.set()

    def _close_conn(self) -> None:
        self._ready.clear()
        if self._conn is not None:
            self._conn.close()
        self._conn, self._conn_for = None, None

    async def _dispatch(self, send: Send) -> None:
        if send.kind == "find":
            try:
                response = await self.cluster.request_any(send.api_key, send.body, timeout_ms=send.timeout_ms)
            except UnsupportedVersionError as e:
                self.m.fail(e)
            except KafkaError as e:
                self.m.on_failure(send, e, now_ms())
            else:
                self.m.on_response(send, response, now_ms())
                self.wake()                 # connect to the coordinator at once
            return
        conn = self._conn
        if conn is None or conn.closed or self._conn_for != self.m.coordinator:
            self.m.on_failure(send, KafkaConnectionError("no connection to the coordinator"), now_ms())
            return
        try:
            fut = await conn.send(send.api_key, send.body, timeout_ms=send.timeout_ms)
        except UnsupportedVersionError as e:
            self.m.fail(e)
            return
        except KafkaError as e:
            self.m.on_failure(send, e, now_ms())
            return
        fut.add_done_callback(lambda f, s=send: self._on_done(s, f))

    def _on_done(self, send: Send, fut: asyncio.Future) -> None:
        if fut.cancelled():
            self.m.on_failure(send, KafkaConnectionError("cancelled"), now_ms())
        elif fut.exception() is not None:
            self.m.on_failure(send, fut.exception(), now_ms())
        else:
            self.m.on_response(send, fut.result(), now_ms())
        self._after_event()
        self.wake()

    async def _assign(self, topics: set[str]) -> None:
        counts = await self._partition_counts(topics)
        try:
            self.m.assign(counts, now_ms())
        except KafkaError as e:
            self.m.fail(e)
        except Exception as e:  # noqa: BLE001 - a custom assignor's bug is the application's error
            self.m.fail(KafkaError(f"the assignor failed: {e!r}"))

    async def _partition_counts(self, topics: set[str]) -> dict[str, int]:
        self.cluster.add_topics(topics)
        self.cluster.request_update()
        try:
            async with asyncio.timeout(self.config["request.timeout.ms"] / 1000):
                await self.cluster.refresh()
        except (KafkaError, TimeoutError) as e:
            log.info("group %s: metadata for the assignment failed: %s", self.m.group_id, e)
        meta = self.cluster.metadata
        out = {}
        for t in topics:
            info = meta.topic(t)
            if info is not None and info.partitions:
                out[t] = len(info.partitions)
        return out

    def _check_metadata(self) -> None:
        meta = self.cluster.metadata
        if meta.version == self._metadata_version or self.m.assignment_snapshot is None:
            return
        self._metadata_version = meta.version
        counts = {t: len(info.partitions) for t in self.m.assignment_snapshot
                  if (info := meta.topic(t)) is not None and info.partitions}
        self.m.metadata_changed(counts)

    async def _resolve_pattern(self) -> None:
        self._pattern_at = now_ms() + self.config["metadata.max.age.ms"]
        try:
            response = await self.cluster.request_any(METADATA_KEY, md.MetadataRequest(
                topics=None, allow_auto_topic_creation=False))
        except KafkaError as e:
            log.info("group %s: listing topics for the pattern failed: %s", self.m.group_id, e)
            self._pattern_at = now_ms() + self.config["retry.backoff.ms"]
            return
        names = {t.name for t in response.topics if t.name and not t.is_internal and t.error_code == 0
                 and self.pattern.fullmatch(t.name)}
        self.cluster.add_topics(names)
        if names != self.m.topics or not self.m.topics_known:
            log.info("group %s: pattern %s matches %s", self.m.group_id, self.pattern.pattern, sorted(names))
        self.m.subscribe(names, now_ms())
        self.m.topics_known = True

    async def _run_deferred(self, awaitable) -> None:
        try:
            await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a user callback's error is logged, not fatal
            log.warning("group %s: callback failed: %r", self.m.group_id, e)

    # ------------------------------------------------------------------------------------ offsets
    async def _coordinator(self, deadline_ms: float) -> BrokerConnection:
        self.m.coordinator_wanted = True
        while True:
            conn = self._conn
            if self._ready.is_set() and conn is not None and not conn.closed:
                return conn
            if self.m.fatal is not None:
                raise self.m.fatal
            self.wake()
            left = deadline_ms - now_ms()
            if left <= 0:
                raise KafkaTimeoutError(f"group {self.m.group_id!r}: no coordinator")
            try:
                async with asyncio.timeout(min(left, 100) / 1000):
                    await self._ready.wait()
            except TimeoutError:
                pass

    async def _topic_ids(self, topics) -> dict[str, object]:
        """Topic ids for OffsetCommit/OffsetFetch v10, from the metadata (refreshed if one is missing)."""
        meta = self.cluster.metadata
        if any(meta.topic(t) is None or meta.topic(t).topic_id in (None, ZERO_UUID) for t in topics):
            self.cluster.add_topics(topics)
            self.cluster.request_update()
            try:
                await self.cluster.refresh()
            except KafkaError as e:
                log.info("metadata refresh failed: %s", e)
            meta = self.cluster.metadata
        return {t: (meta.topic(t).topic_id if meta.topic(t) is not None and meta.topic(t).topic_id
                    is not None else ZERO_UUID) for t in topics}

    def _commit_request(self, offsets: dict, ids: dict, generation: int, member_id: str):
        by_topic: dict[str, list] = {}
        for tp, value in offsets.items():
            offset, metadata = value if isinstance(value, tuple) else (value, "")
            by_topic.setdefault(tp[0], []).append(oc.OffsetCommitRequestPartition(
                partition_index=tp[1], committed_offset=offset, committed_leader_epoch=-1,
                committed_metadata=metadata))
        return oc.OffsetCommitRequest(
            group_id=self.m.group_id, generation_id_or_member_epoch=generation, member_id=member_id,
            group_instance_id=self.m.instance_id if member_id else None,
            topics=[oc.OffsetCommitRequestTopic(name=t, topic_id=ids.get(t, ZERO_UUID), partitions=ps)
                    for t, ps in by_topic.items()])

    def _commit_result(self, response) -> tuple[KafkaError | None, bool]:
        """(error to raise, retry?) from an OffsetCommit response."""
        error, retry = None, False
        for t in response.topics:
            for p in t.partitions:
                if p.error_code:
                    e = self.m.commit_error(p.error_code, now_ms())
                    if e is None:
                        retry = True
                    elif error is None:
                        error = e
        self.wake()
        return error, retry

    async def commit(self, offsets: dict, timeout_ms: int | None = None) -> None:
        """Commit `{tp: offset or (offset, metadata)}` (the offset of the next record to read)."""
        if not offsets:
            return
        deadline = now_ms() + (timeout_ms if timeout_ms is not None else self.config["default.api.timeout.ms"])
        ids = await self._topic_ids({tp[0] for tp in offsets})
        while True:
            generation, member_id = self.m.commit_generation()
            conn = await self._coordinator(deadline)
            try:
                response = await conn.request(OFFSET_COMMIT, self._commit_request(offsets, ids, generation, member_id))
                error, retry = self._commit_result(response)
            except KafkaConnectionError as e:
                self.m.coordinator_lost(now_ms(), f"OffsetCommit: {e}")
                self.wake()
                error, retry = None, True
            if error is not None:
                raise error
            if not retry:
                return
            if now_ms() >= deadline:
                raise KafkaTimeoutError(f"group {self.m.group_id!r}: commit not done in time")
            await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)

    def commit_async(self, offsets: dict, callback=None) -> None:
        if len(self._async_commits) >= ASYNC_COMMITS_MAX:
            raise KafkaError(f"more than {ASYNC_COMMITS_MAX} asynchronous commits are waiting")
        self._async_commits.append((dict(offsets), callback))
        self.m.coordinator_wanted = True
        self.wake()

    def _send_async_commits(self) -> None:
        conn = self._conn
        while self._async_commits and self._ready.is_set() and conn is not None and conn.can_send():
            offsets, callback = self._async_commits.popleft()
            try:
                generation, member_id = self.m.commit_generation()
                ids = {t: (info.topic_id if (info := self.cluster.metadata.topic(t)) is not None
                           and info.topic_id is not None else ZERO_UUID) for t in {tp[0] for tp in offsets}}
                fut = conn.send_nowait(OFFSET_COMMIT, self._commit_request(offsets, ids, generation, member_id))
            except KafkaError as e:
                self._callback(callback, offsets, e)
                continue
            fut.add_done_callback(lambda f, o=offsets, cb=callback: self._on_async_commit(f, o, cb))

    def _on_async_commit(self, fut: asyncio.Future, offsets: dict, callback) -> None:
        if fut.cancelled() or fut.exception() is not None:
            error = KafkaConnectionError("commit not answered") if fut.cancelled() else fut.exception()
            if isinstance(error, KafkaConnectionError):
                self.m.coordinator_lost(now_ms(), f"OffsetCommit: {error}")
        else:
            error, retry = self._commit_result(fut.result())
            if error is None and retry:
                error = KafkaError("commit failed with a retriable error; commit again")
                error.retriable = True
        self._callback(callback, offsets, error)
        self._after_event()
        self.wake()

    def _callback(self, callback, offsets, error) -> None:
        if error is not None:
            log.log(logging.INFO if error.retriable else logging.WARNING, "group %s: commit of %s failed: %s",
                    self.m.group_id, offsets, error)
        if callback is None:
            return
        try:
            result = callback(offsets, error)
        except Exception as e:  # noqa: BLE001 - the application's callback
            log.warning("group %s: commit callback failed: %r", self.m.group_id, e)
            return
        if inspect.isawaitable(result):
            self.defer(result)

    async def committed(self, partitions, timeout_ms: int | None = None) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed)."""
        partitions = [TopicPartition(*tp) for tp in partitions]
        out: dict[TopicPartition, int | None] = {tp: None for tp in partitions}
        if not partitions:
            return out
        deadline = now_ms() + (timeout_ms if timeout_ms is not None else self.config["default.api.timeout.ms"])
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        ids = await self._topic_ids(by_topic)
        names = {v: k for k, v in ids.items()}
        request = of.OffsetFetchRequest(
            group_id=self.m.group_id, require_stable=True,
            topics=[of.OffsetFetchRequestTopic(name=t, partition_indexes=ps) for t, ps in by_topic.items()],
            groups=[of.OffsetFetchRequestGroup(group_id=self.m.group_id, topics=[
                of.OffsetFetchRequestTopics(name=t, topic_id=ids[t], partition_indexes=ps)
                for t, ps in by_topic.items()])])
        while True:
            conn = await self._coordinator(deadline)
            retry = False
            try:
                response = await conn.request(OFFSET_FETCH, request)
            except KafkaConnectionError as e:
                self.m.coordinator_lost(now_ms(), f"OffsetFetch: {e}")
                self.wake()
                retry = True
            else:
                retry = self._fetch_result(response, names, out)
            if not retry:
                return out
            if now_ms() >= deadline:
                raise KafkaTimeoutError(f"group {self.m.group_id!r}: committed offsets not fetched in time")
            await asyncio.sleep(self.config["retry.backoff.ms"] / 1000)

    def _fetch_result(self, response, names: dict, out: dict) -> bool:
        if getattr(response, "groups", None):
            code, topics = response.groups[0].error_code, response.groups[0].topics
        else:
            code, topics = response.error_code, response.topics
        codes = [code] if code else []
        for t in topics:
            name = t.name or names.get(getattr(t, "topic_id", None), "")
            for p in t.partitions:
                if p.error_code:
                    if p.error_code != 3:      # UNKNOWN_TOPIC_OR_PARTITION: nothing committed
                        codes.append(p.error_code)
                elif p.committed_offset >= 0:
                    out[TopicPartition(name, p.partition_index)] = p.committed_offset
        retry = False
        for c in codes:
            e = self.m.fetch_error(c, now_ms())
            if e is not None:
                raise e
            retry = True
        if retry:
            self.wake()
        return retry
