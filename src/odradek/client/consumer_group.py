"""The consumer's side of group membership: subscribe, commit, and the application steps that run
inside getmany/poll (a mixin of `consumer.Consumer`; the membership itself is `group.Membership`,
driven by `group_runtime.GroupRuntime`).

Like Java's consumer, rebalance work that touches the application happens inside poll, between
batches, when everything handed out before has been processed:
- before a JoinGroup (`PrepareStep`): with enable.auto.commit, commit the positions of what is given up;
  call `on_partitions_revoked` (eager: everything, always; cooperative: only partitions of topics no
  longer subscribed, if any) or `on_partitions_lost` (the generation was lost: no commit, the partitions
  may already be someone else's; without that method, `on_partitions_revoked`);
- after SyncGroup (`AssignStep`): cooperative revocations as above, then the new assignment, then
  `on_partitions_assigned` (eager: everything; cooperative: what was added), then the committed offsets
  of new partitions that the listener did not seek (OffsetFetch; auto.offset.reset where none).
Listener methods may be plain functions or coroutine functions; an exception from one is raised from
the poll after the step completes.
"""

from __future__ import annotations

import inspect
import logging
import re

from odradek.client.cluster import now_ms
from odradek.client.errors import IllegalStateError, KafkaError
from odradek.client.fetcher import TopicPartition
from odradek.client.group import COOPERATIVE, AssignStep, Membership, PrepareStep, State
from odradek.client.group_consumer import ConsumerMembership
from odradek.client.group_runtime import GroupRuntime
from odradek.client.transactions import ConsumerGroupMetadata

log = logging.getLogger("odradek.client.consumer")

_JOINED = (State.ASSIGNED, State.STABLE)


def _tp(x) -> TopicPartition:
    return x if isinstance(x, TopicPartition) else TopicPartition(*x)


class GroupConsumer:
    # provided by Consumer: config, cluster, _states, _data, _set_assignment, _kick, _check_open

    def _init_group(self) -> None:
        self._membership: Membership | ConsumerMembership | None = None
        self._group: GroupRuntime | None = None
        self._subscribed: tuple | None = None        # (topics, pattern) given to subscribe()
        self._manual = False                         # assign() is in use
        self._listener = None
        self._listener_error: BaseException | None = None
        self._awaiting_committed: set[TopicPartition] = set()
        self._auto_commit_at = 0.0

    async def _start_group(self) -> None:
        c = self.config
        if c["group.id"] is None:
            return
        if c["group.protocol"] == "consumer":
            meta = self.cluster

            def topic_name(topic_id) -> str | None:
                return next((n for n, t in meta.metadata.topics.items() if t.topic_id == topic_id), None)
            self._membership = ConsumerMembership(c, now_ms(), topic_name)
        else:
            self._membership = Membership(c, now_ms())
        self._group = GroupRuntime(self.cluster, c, self._membership, self._notify_group)
        if self._subscribed is not None:
            self._apply_subscription()
        self._auto_commit_at = now_ms() + c["auto.commit.interval.ms"]
        await self._group.start()

    async def _close_group(self) -> None:
        """Auto commit, revoke (or lose) what is owned, leave (dynamic members), stop the runtime."""
        m = self._membership
        try:
            if self.config["enable.auto.commit"] and (not m.subscribed or m.state in _JOINED):
                await self._commit_quietly(set(self._states))
            if m.subscribed and self._states:
                owned = set(self._states)
                if m.generation < 0 or m.lost_pending or m.state not in _JOINED:
                    await self._call_listener("on_partitions_lost", owned)
                else:
                    await self._call_listener("on_partitions_revoked", owned)
        except KafkaError as e:
            log.warning("group %s: closing: %s", m.group_id, e)
        finally:
            await self._group.aclose()
        if self._listener_error is not None:
            log.warning("group %s: rebalance listener failed on close: %r", m.group_id, self._listener_error)

    # ------------------------------------------------------------------------------------ subscription
    def subscribe(self, topics=None, pattern=None, listener=None) -> None:
        """Join `group.id` for `topics` (names) or `pattern` (a regex matched against whole topic
        names); `listener` may have on_partitions_revoked / _assigned / _lost(set of TopicPartition),
        plain functions or coroutine functions, called inside getmany/poll."""
        if self.config["group.id"] is None:
            raise IllegalStateError("subscribe() needs a group.id")
        if self._manual:
            raise IllegalStateError("subscribe() and assign() are mutually exclusive; unsubscribe() first")
        if (topics is None) == (pattern is None):
            raise ValueError("give topics or pattern")
        if isinstance(topics, str):
            topics = [topics]
        pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        self._subscribed = (frozenset(topics or ()), pattern)
        self._listener = listener
        if self._membership is not None:
            self._apply_subscription()

    def _apply_subscription(self) -> None:
        topics, pattern = self._subscribed
        self._group.set_pattern(pattern)
        if isinstance(self._membership, ConsumerMembership):
            self._membership.set_pattern(pattern)   # sent to the coordinator, which resolves it
        if pattern is None:
            self.cluster.add_topics(topics)
            self._membership.subscribe(topics, now_ms())
        else:
            self._membership.subscribe(self._membership.topics, now_ms())
            self._membership.topics_known = False
        self._group.wake()

    def subscription(self) -> set[str]:
        m = self._membership
        if self._subscribed is None:
            return set()
        return set(m.topics) if m is not None and self._subscribed[1] is not None else set(self._subscribed[0])

    def unsubscribe(self) -> None:
        """Leave the group (or drop the manual assignment). Revocation callbacks run now; a coroutine
        callback runs on the group's task."""
        owned = set(self._states)
        m = self._membership
        if self._subscribed is not None and m is not None and m.subscribed:
            self._group.set_pattern(None)
            self._group.send_now(m.unsubscribe(now_ms()))
            if owned:
                result = self._listener_result("on_partitions_revoked", owned)
                if inspect.isawaitable(result):
                    self._group.defer(result)
        self._subscribed = None
        self._manual = False
        self._set_assignment([])

    # ------------------------------------------------------------------------------------ offsets
    def group_metadata(self) -> ConsumerGroupMetadata:
        """What a transactional producer's send_offsets_to_transaction needs (KIP-447): the group, and
        the generation and member id while this consumer is a member (-1 and "" with assign())."""
        m = self._membership
        if m is None:
            raise IllegalStateError("group.id is not set: this consumer has no group metadata")
        if m.subscribed and m.state in _JOINED:
            return ConsumerGroupMetadata(m.group_id, m.generation, m.member_id, m.instance_id)
        return ConsumerGroupMetadata(m.group_id, -1, "", m.instance_id)

    async def commit(self, offsets=None, timeout_ms: int | None = None) -> None:
        """Commit `{tp: offset or (offset, metadata)}` (the next offset to read), by default every
        assigned partition's position; CommitFailedError if the group rebalanced meanwhile."""
        self._check_group()
        await self._group.commit(self._commit_offsets(offsets), timeout_ms)

    def commit_async(self, offsets=None, callback=None) -> None:
        """As commit, without waiting; `callback(offsets, error or None)` runs on the event loop."""
        self._check_group()
        self._group.commit_async(self._commit_offsets(offsets), callback)

    async def committed(self, partitions, timeout_ms: int | None = None) -> dict[TopicPartition, int | None]:
        """The group's committed offsets (None where nothing is committed)."""
        self._check_group()
        return await self._group.committed([_tp(p) for p in partitions], timeout_ms)

    def _check_group(self) -> None:
        self._check_open()
        if self._group is None:
            raise IllegalStateError("offsets are committed for a group: set group.id")

    def _commit_offsets(self, offsets) -> dict:
        if offsets is None:
            return {tp: st.position for tp, st in self._states.items() if st.position is not None}
        return {_tp(tp): v for tp, v in offsets.items()}

    async def _commit_quietly(self, partitions) -> None:
        offsets = {tp: self._states[tp].position for tp in partitions
                   if tp in self._states and self._states[tp].position is not None}
        if not offsets:
            return
        try:
            await self._group.commit(offsets)
        except KafkaError as e:
            log.warning("group %s: auto commit of %s failed: %s", self.config["group.id"], offsets, e)

    def _maybe_auto_commit(self) -> None:
        now = now_ms()
        if not self.config["enable.auto.commit"] or now < self._auto_commit_at:
            return
        self._auto_commit_at = now + self.config["auto.commit.interval.ms"]
        m = self._membership
        if m.subscribed and m.state not in _JOINED:
            return                        # Java skips auto commits during a rebalance
        offsets = self._commit_offsets(None)
        if offsets:
            try:
                self._group.commit_async(offsets)
            except KafkaError as e:
                log.info("auto commit not queued: %s", e)

    # ------------------------------------------------------------------------------------ poll steps
    def _notify_group(self) -> None:
        if self._data is not None:
            self._data.set()

    def _group_step_ready(self) -> bool:
        m = self._membership
        return m is not None and (m.fatal is not None or (m.subscribed and m.app_step() is not None))

    def _poll_started(self) -> None:
        if self._membership is not None:
            self._membership.polling += 1
            self._membership.poll(now_ms())

    def _poll_ended(self) -> None:
        if self._membership is not None:
            self._membership.polling -= 1
            self._membership.poll(now_ms())

    async def _group_poll(self) -> None:
        """Run what membership needs from the application (at most a few steps), auto commit."""
        m = self._membership
        if m is None:
            return
        if m.fatal is not None:
            raise m.fatal
        for _ in range(4):
            step = m.app_step() if m.subscribed else None
            if step is None:
                break
            if isinstance(step, PrepareStep):
                await self._run_prepare(step)
            else:
                await self._run_assign(step)
            self._group.wake()
        if self._awaiting_committed:
            await self._init_committed(quiet=True)
        self._maybe_auto_commit()
        error, self._listener_error = self._listener_error, None
        if error is not None:
            raise error

    async def _run_prepare(self, step: PrepareStep) -> None:
        cooperative = self._membership.protocol == COOPERATIVE
        if step.revoked or (not cooperative and not step.lost):
            if self.config["enable.auto.commit"]:
                await self._commit_quietly(step.revoked)
            await self._call_listener("on_partitions_revoked", step.revoked)
        if step.lost:
            await self._call_listener("on_partitions_lost", step.lost)
        gone = step.revoked | step.lost
        self._set_assignment([tp for tp in self._states if tp not in gone])
        self._membership.prepared_done(step, now_ms())

    async def _run_assign(self, step: AssignStep) -> None:
        if step.revoked:
            if self.config["enable.auto.commit"]:
                await self._commit_quietly(step.revoked)
            await self._call_listener("on_partitions_revoked", step.revoked)
        self._set_assignment(list(step.assigned), initializing=True)
        self._membership.applied(step, now_ms())
        await self._call_listener("on_partitions_assigned", set(step.added))
        await self._init_committed(quiet=True)

    def _listener_result(self, name: str, partitions: set):
        listener = self._listener
        if listener is None:
            return None
        fn = getattr(listener, name, None)
        if fn is None and name == "on_partitions_lost":
            fn = getattr(listener, "on_partitions_revoked", None)   # Java's default for lost
        if fn is None:
            return None
        return fn(set(partitions))

    async def _call_listener(self, name: str, partitions: set) -> None:
        try:
            result = self._listener_result(name, partitions)
            if inspect.isawaitable(result):
                await result
        except Exception as e:  # noqa: BLE001 - raised from poll once the step is done
            log.error("rebalance listener %s(%s) failed: %r", name, sorted(partitions), e)
            if self._listener_error is None:
                self._listener_error = e

    async def _init_committed(self, quiet: bool = False) -> None:
        """Positions of new partitions from the group's committed offsets, else auto.offset.reset."""
        todo = [tp for tp in self._awaiting_committed if tp in self._states
                and self._states[tp].position is None and self._states[tp].reset is None]
        self._awaiting_committed.intersection_update(todo)
        if not todo:
            return
        try:
            found = await self._group.committed(todo, self.config["request.timeout.ms"])
        except KafkaError as e:
            if not quiet:
                raise
            log.info("group %s: committed offsets not fetched (retrying at the next poll): %s",
                     self.config["group.id"], e)
            return
        for tp in todo:
            st = self._states.get(tp)
            self._awaiting_committed.discard(tp)
            if st is None or st.position is not None or st.reset is not None:
                continue                  # unassigned or seeked meanwhile
            offset = found.get(tp)
            if offset is not None:
                st.seek(offset)
            else:
                st.request_reset(self.config["auto.offset.reset"])
        self._kick()
