"""The consumer group protocol's membership (`group.protocol=consumer`; seed 002, KIP-848: the member
heartbeats, the coordinator assigns), sans I/O, with the interface of the classic `group.Membership`
so the same runtime (`group_runtime.GroupRuntime`) and the same poll steps (`consumer_group`) drive it;
what the two do alike (coordinator, timers, offset errors) is in `group_member.MembershipBase`.

The member generates its member id (a random UUID, ConsumerGroupHeartbeat v1) and sends:

- a full heartbeat to join (epoch 0): rebalance timeout (max.poll.interval.ms), subscribed topic
  names or, for a pattern subscription, the regex itself (SubscribedTopicRegex: the coordinator
  resolves it), `group.remote.assignor`, `group.instance.id`, no owned partitions;
- then a heartbeat every heartbeat interval the coordinator hands out, with the partitions it owns
  (its acknowledgement of a revocation) and the subscription only when it changed;
- epoch -1 to leave on close or unsubscribe (-2 for a static member: it keeps its partitions for
  the session timeout, so a restart gets them back without a rebalance).

Reconciliation: an assignment in a response (topic ids, resolved to names through the client's
metadata) becomes one `AssignStep` run inside poll: commit what is revoked (enable.auto.commit),
on_partitions_revoked, then the new assignment, then on_partitions_assigned. Revocation comes before
acquisition, and the coordinator never hands out a partition another member has not released, so no
partition has two owners. The next heartbeat reports the new owned set, which lets the coordinator
move the member to its new epoch and release the revoked partitions to others.

Errors: FENCED_MEMBER_EPOCH and UNKNOWN_MEMBER_ID lose the partitions (on_partitions_lost) and join
again with epoch 0; NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE find the coordinator again;
COORDINATOR_LOAD_IN_PROGRESS and UNRELEASED_INSTANCE_ID retry after retry.backoff.ms; the rest
(FENCED_INSTANCE_ID, UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION, GROUP_MAX_SIZE_REACHED, ...)
are fatal and raised from poll. Offsets are committed with the member epoch (OffsetCommit v9+);
STALE_MEMBER_EPOCH is retried with the epoch the next heartbeat brings.

Client-side assignors (`group.local.assignors`; the seed's design, which Kafka 4.0 did not ship, an
odradek extension: docs/extensions.md, `group_assignors`): the member declares them in the heartbeat's
ClientAssignors (joining, and when an assignor's metadata changes). When the coordinator elects it
(`should_compute_assignment`), it sends ConsumerGroupPrepareAssignment, runs the selected assignor on
the group it gets back, and sends ConsumerGroupInstallAssignment with the result (error 1 and no
members when the assignor raised: the coordinator then assigns with its server-side assignor). One
such round at a time; a new flag after it starts another. A broker that does not serve the extension
ignores the declaration and assigns server-side.
"""

from __future__ import annotations

import base64
import logging
import re
import uuid
from typing import Callable

from odradek.client import group_assignors as ga
from odradek.client.errors import BrokerResponseError, KafkaError
from odradek.client.fetcher import TopicPartition
from odradek.client.group import COOPERATIVE
from odradek.client.group_member import (
    COORDINATOR_GONE, JOINED, AssignStep, CommitFailedError, MembershipBase, PrepareStep, Send, State,
)
from odradek.protocol.error_codes import ErrorCode, for_code
from odradek.protocol.extensions import CONSUMER_GROUP_INSTALL_ASSIGNMENT, CONSUMER_GROUP_PREPARE_ASSIGNMENT
from odradek.protocol.messages import consumer_group_heartbeat as cgh
from odradek.protocol.messages import consumer_group_install_assignment as cgi
from odradek.protocol.messages import consumer_group_prepare_assignment as cgp

log = logging.getLogger("odradek.client.group")

CONSUMER_GROUP_HEARTBEAT = 68
LEAVE_EPOCH, STATIC_LEAVE_EPOCH = -1, -2
_FENCED = frozenset({ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID})
_RETRY = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.UNRELEASED_INSTANCE_ID,
                    ErrorCode.REQUEST_TIMED_OUT})


def new_member_id() -> str:
    """A random UUID as Kafka prints one (URL-safe base64, no padding)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class ConsumerMembership(MembershipBase):
    protocol = COOPERATIVE          # partitions move one at a time: only what is revoked is given up
    assignment_snapshot = None      # the coordinator watches the metadata, not the member
    leader_id = ""                  # nobody leads: the coordinator assigns
    COMMIT_RETRIABLE = MembershipBase.COMMIT_RETRIABLE | {ErrorCode.STALE_MEMBER_EPOCH}
    FETCH_RETRIABLE = MembershipBase.FETCH_RETRIABLE | {ErrorCode.STALE_MEMBER_EPOCH}

    def __init__(self, config: dict, now_ms: float, topic_name: Callable[[uuid.UUID], str | None]) -> None:
        super().__init__(config, now_ms)
        c = config
        self.server_assignor: str | None = c.get("group.remote.assignor") or None
        self.local_assignors: list = ga.group_assignors_from_config(c.get("group.local.assignors"))
        self._sent_assignors: tuple | None = None      # the ClientAssignors the coordinator has
        self._assignors_in_flight: tuple | None = None
        self.assignments_computed = 0                   # installs this member made (tests, logs)
        self.topic_name = topic_name
        self.pattern: re.Pattern | None = None
        self.member_id = new_member_id()
        self.member_epoch = 0
        self.heartbeat_interval_ms = 3000               # until the coordinator says otherwise
        self.target: set[TopicPartition] | None = None  # an assignment not yet applied by the application
        self.unresolved: dict[uuid.UUID, list[int]] = {}
        self._latest: dict[uuid.UUID, list[int]] = {}   # the coordinator's last assignment, by topic id
        self._sent_subscription: tuple | None = None   # (names, regex) the coordinator has
        self._subscription_in_flight: tuple | None = None
        self._known_ids: dict[str, uuid.UUID] = {}      # topic name -> id, from assignments
        self._refreshed = False

    # ------------------------------------------------------------------------------------ application
    @property
    def generation(self) -> int:
        return self.member_epoch if self.state in JOINED else -1

    def subscribe(self, topics, now_ms: float) -> None:
        self.topics = frozenset(topics)
        if self.state is State.UNSUBSCRIBED:
            self.state = State.UNJOINED
            self.member_epoch = 0
        self._heartbeat_at = 0.0                        # tell the coordinator at once

    def set_pattern(self, pattern: re.Pattern | None) -> None:
        self.pattern = pattern

    def request_rejoin(self, reason: str) -> None:
        self._heartbeat_at = 0.0

    def app_step(self) -> PrepareStep | AssignStep | None:
        if self.lost_pending:
            return PrepareStep(lost=set(self.owned))
        if self.state is State.ASSIGNED and self.target is not None:
            new = self.target
            return AssignStep(sorted(new), new - self.owned, self.owned - new)
        return None

    def applied(self, step: AssignStep, now_ms: float) -> None:
        self.owned = set(step.assigned)
        if self.target is not None and set(step.assigned) == self.target:
            self.target = None
        if self.state is State.ASSIGNED and self.target is None:
            self.state = State.STABLE
        self._heartbeat_at = 0.0                        # acknowledge at once: others may wait for these
        log.info("group %s epoch %d: now owns %s", self.group_id, self.member_epoch, sorted(self.owned))

    # ------------------------------------------------------------------------------------ timers
    def _group_request(self, now_ms: float) -> Send | None:
        if self.subscribed and self.topics_known and "heartbeat" not in self.in_flight \
                and now_ms >= self._heartbeat_at and not (self.state is State.UNJOINED and self.lost_pending):
            return self._heartbeat_request(now_ms)
        return None

    def _due_times(self) -> list[float]:
        if self.coordinator is not None and self.subscribed and "heartbeat" not in self.in_flight:
            return [self._heartbeat_at]
        return []

    # ------------------------------------------------------------------------------------ requests
    def _subscription(self) -> tuple:
        if self.pattern is not None:
            return (None, self.pattern.pattern)
        return (tuple(sorted(self.topics)), None)

    def _declared_assignors(self) -> tuple:
        out = []
        for a in self.local_assignors:
            md = a.metadata()
            out.append((a.name, a.minimum_version, a.maximum_version, md.reason, md.version, bytes(md.metadata)))
        return tuple(out)

    def _heartbeat_request(self, now_ms: float) -> Send:
        joining = self.member_epoch == 0
        subscription = self._subscription()
        full = joining or subscription != self._sent_subscription
        declared = self._declared_assignors() if self.local_assignors else None
        send_assignors = declared is not None and (joining or declared != self._sent_assignors)
        names, regex = subscription
        body = cgh.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=self.member_epoch,
            instance_id=self.instance_id, rack_id=self.rack_id if joining else None,
            rebalance_timeout_ms=self.rebalance_timeout_ms if joining else -1,
            subscribed_topic_names=(list(names) if names is not None else []) if full else None,
            subscribed_topic_regex=(regex or "") if full and (regex is not None or not joining) else None,
            server_assignor=self.server_assignor if joining else None,
            topic_partitions=[] if joining else self._owned_ids(),
            client_assignors=[cgh.ClientAssignor(name=n, minimum_version=lo, maximum_version=hi, reason=r, version=v,
                                                 metadata=md) for n, lo, hi, r, v, md in declared]
            if send_assignors and declared is not None else None)
        self._assignors_in_flight = declared if send_assignors else None
        if self.state is State.UNJOINED:
            self.state = State.JOINING
        self._heartbeat_at = now_ms + self.heartbeat_interval_ms
        send = self._track(Send("heartbeat", CONSUMER_GROUP_HEARTBEAT, body, self.request_timeout_ms))
        send.generation = self.member_epoch
        self._subscription_in_flight = subscription if full else None
        return send

    def _owned_ids(self) -> list[cgh.TopicPartitions]:
        """What the application owns, by topic id (every owned partition came in an assignment)."""
        by_id: dict[uuid.UUID, list[int]] = {}
        for tp in self.owned:
            tid = self._known_ids.get(tp.topic)
            if tid is not None:
                by_id.setdefault(tid, []).append(tp.partition)
        return [cgh.TopicPartitions(topic_id=t, partitions=sorted(ps))
                for t, ps in sorted(by_id.items(), key=lambda kv: str(kv[0]))]

    def _leave_request(self, reason: str, closing: bool = False) -> Send | None:
        """A heartbeat with epoch -1, or -2 for a static member that closes (it keeps its partitions)."""
        epoch = STATIC_LEAVE_EPOCH if closing and self.instance_id is not None else LEAVE_EPOCH
        if self.coordinator is None or self.member_epoch <= 0 \
                or self.state in (State.UNSUBSCRIBED, State.CLOSED, State.FATAL):
            return None
        return Send("leave", CONSUMER_GROUP_HEARTBEAT, cgh.ConsumerGroupHeartbeatRequest(
            group_id=self.group_id, member_id=self.member_id, member_epoch=epoch, instance_id=self.instance_id),
            epoch=self._epoch)

    # ------------------------------------------------------------------------------------ answers
    def _on_heartbeat(self, send: Send, r, now_ms: float) -> None:
        code = r.error_code
        if code != 0:
            self._heartbeat_error(code, r.error_message, now_ms)
            return
        if self.state in (State.UNSUBSCRIBED, State.CLOSED, State.FATAL):
            return
        if self._subscription_in_flight is not None:
            self._sent_subscription = self._subscription_in_flight
        if self._assignors_in_flight is not None:
            self._sent_assignors = self._assignors_in_flight
        if r.heartbeat_interval_ms > 0:
            self.heartbeat_interval_ms = r.heartbeat_interval_ms
            self._heartbeat_at = min(self._heartbeat_at, now_ms + r.heartbeat_interval_ms)
        if r.member_epoch != self.member_epoch:
            log.info("group %s: member %s epoch %d -> %d", self.group_id, self.member_id, self.member_epoch,
                     r.member_epoch)
        self.member_epoch = r.member_epoch
        if self.state is State.JOINING:
            self.state = State.STABLE
        if r.assignment is not None:
            self._new_assignment({tp.topic_id: list(tp.partitions) for tp in r.assignment.topic_partitions})
            if r.assignment.assignor_metadata is not None:
                self._assignor_metadata(r.assignment)
        elif self.unresolved:
            self._new_assignment(self._latest)
        self._refreshed = False
        if r.should_compute_assignment and self.local_assignors and "prepare" not in self.in_flight \
                and "install" not in self.in_flight:
            self._outbox.append(self._track(Send("prepare", CONSUMER_GROUP_PREPARE_ASSIGNMENT,
                                                 cgp.ConsumerGroupPrepareAssignmentRequest(
                                                     group_id=self.group_id, member_id=self.member_id,
                                                     member_epoch=self.member_epoch), self.request_timeout_ms)))

    # ------------------------------------------------------------------------------------ client-side assignment
    def _assignor_metadata(self, assignment: cgh.Assignment) -> None:
        parts = [TopicPartition(name, p) for tp in assignment.topic_partitions
                 if (name := self.topic_name(tp.topic_id)) is not None for p in tp.partitions]
        for a in self.local_assignors:
            on_assignment = getattr(a, "on_assignment", None)
            if on_assignment is not None:
                try:
                    on_assignment(sorted(parts), assignment.assignor_metadata_version, bytes(assignment.assignor_metadata))
                except Exception as e:  # noqa: BLE001 - the application's callback; the group goes on
                    log.warning("group %s: %s.on_assignment failed: %r", self.group_id, a.name, e)

    def _on_prepare(self, send: Send, r: cgp.ConsumerGroupPrepareAssignmentResponse, now_ms: float) -> None:
        if r.error_code != 0:
            log.info("group %s: ConsumerGroupPrepareAssignment: %s: %s", self.group_id, for_code(r.error_code).name,
                     r.error_message)
            return
        assignor = next((a for a in self.local_assignors if a.name == r.assignor_name), None)
        names = {t.topic_id: t.topic_name for t in r.topics}
        ids = {t.topic_name: t.topic_id for t in r.topics}
        error, members = 0, []
        try:
            if assignor is None:
                raise ValueError(f"the coordinator selected {r.assignor_name!r}, which this member does not have")
            spec = ga.GroupSpec(
                group_epoch=r.group_epoch, version=r.assignor_version,
                partitions_per_topic={t.topic_name: t.num_partitions for t in r.topics},
                members={m.member_id: ga.GroupMember(
                    member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                    topics=frozenset(names[t] for t in m.subscribed_topic_ids if t in names),
                    target=frozenset(TopicPartition(names[tp.topic_id], p) for tp in m.topic_partitions
                                     if tp.topic_id in names for p in tp.partitions),
                    metadata=ga.AssignorMetadata(m.assignor_reason, m.assignor_version, bytes(m.assignor_metadata)))
                    for m in r.members})
            result = ga.normalise(assignor.assign(spec), spec.members)
            for member_id, share in sorted(result.items()):
                by_id: dict[uuid.UUID, list[int]] = {}
                for tp in share.partitions:
                    if tp.topic not in ids:
                        raise ValueError(f"the assignor assigned {tp}, not a subscribed topic")
                    by_id.setdefault(ids[tp.topic], []).append(tp.partition)
                members.append(cgi.Member(member_id=member_id, topic_partitions=[
                    cgi.TopicPartitions(topic_id=t, partitions=sorted(ps))
                    for t, ps in sorted(by_id.items(), key=lambda kv: str(kv[0]))],
                    metadata_version=share.metadata_version, metadata_bytes=share.metadata))
        except Exception as e:  # noqa: BLE001 - a custom assignor's bug: the coordinator assigns instead
            log.error("group %s: the client-side assignor %r failed: %r", self.group_id, r.assignor_name, e)
            error, members = ga.ASSIGNOR_FAILED, []
        log.info("group %s: computed the assignment of group epoch %d with %r for %d members", self.group_id,
                 r.group_epoch, r.assignor_name, len(members))
        self._outbox.append(self._track(Send("install", CONSUMER_GROUP_INSTALL_ASSIGNMENT,
                                             cgi.ConsumerGroupInstallAssignmentRequest(
                                                 group_id=self.group_id, member_id=self.member_id,
                                                 member_epoch=self.member_epoch, group_epoch=r.group_epoch,
                                                 error=error, members=members), self.request_timeout_ms)))

    def _on_install(self, send: Send, r: cgi.ConsumerGroupInstallAssignmentResponse, now_ms: float) -> None:
        if r.error_code != 0:
            log.info("group %s: ConsumerGroupInstallAssignment: %s: %s", self.group_id, for_code(r.error_code).name,
                     r.error_message)
            return
        self.assignments_computed += 1
        self._heartbeat_at = 0.0          # reconcile towards the new target at once

    def _new_assignment(self, by_id: dict[uuid.UUID, list[int]]) -> None:
        """The coordinator's latest assignment (by topic id) as the target the application applies next;
        topics not in the metadata yet are left out until a metadata refresh resolves them."""
        self._latest = by_id
        target: set[TopicPartition] = set()
        self.unresolved = {}
        for tid, parts in by_id.items():
            name = self.topic_name(tid)
            if name is None:
                self.unresolved[tid] = parts
                continue
            self._known_ids = {**self._known_ids, name: tid}
            target |= {TopicPartition(name, p) for p in parts}
        if self.unresolved:
            log.info("group %s: topic ids %s not in the metadata yet", self.group_id, sorted(map(str, self.unresolved)))
        if target != self.owned or self.target is not None:
            self.target = target
            self.state = State.ASSIGNED

    def _heartbeat_error(self, code: int, message: str | None, now_ms: float) -> None:
        what = f"ConsumerGroupHeartbeat: {for_code(code).name}: {message or ''}"
        if code in _FENCED:
            log.info("group %s: %s; the partitions are lost, joining again", self.group_id, what)
            self._out_of_group(lost=True)
        elif code in COORDINATOR_GONE:
            self.coordinator_lost(now_ms, what)
        elif code in _RETRY:
            log.info("group %s: %s; retrying", self.group_id, what)
            self._heartbeat_at = now_ms + self.retry_backoff_ms
            if self.state is State.JOINING:
                self.state = State.UNJOINED
        elif code == ErrorCode.FENCED_INSTANCE_ID:
            self._fence_instance()
        else:
            self.fail(BrokerResponseError(code, f"ConsumerGroupHeartbeat for group {self.group_id!r}: {message}"))

    # ------------------------------------------------------------------------------------ state changes
    def _out_of_group(self, lost: bool) -> None:
        """Out of the group: join again with epoch 0 (the same member id); what is owned is lost."""
        self.member_epoch = 0
        self.target = None
        self.unresolved = {}
        self._latest = {}
        self._sent_subscription = None
        self._sent_assignors = None
        self._epoch += 1
        self.in_flight.pop("heartbeat", None)
        self._heartbeat_at = 0.0
        if lost and self.owned:
            self.lost_pending = True
        if self.state not in (State.UNSUBSCRIBED, State.CLOSED, State.FATAL):
            self.state = State.UNJOINED

    def metadata_changed(self, partition_counts: dict[str, int]) -> None:
        """The coordinator watches the metadata of the subscribed topics."""

    def partition_counts_needed(self) -> set[str] | None:
        """Topic ids of an assignment not in the metadata: ask the runtime for a metadata refresh."""
        return set() if self.unresolved and not self._refreshed else None

    def assign(self, partition_counts: dict[str, int], now_ms: float) -> None:
        """After the runtime refreshed the metadata: resolve the assignment's topic ids again."""
        self._refreshed = True        # once per heartbeat: the next answer may bring it back
        if self.unresolved and self.state not in (State.FATAL, State.CLOSED):
            self._new_assignment(self._latest)

    # ------------------------------------------------------------------------------------ offsets
    def _rebalancing(self) -> bool:
        return self.state is State.JOINING or self.member_epoch > 0

    def _commit_group_error(self, code: int) -> KafkaError | None:
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            return CommitFailedError(f"commit failed: {for_code(code).name}: this member left or was removed from "
                                     f"the group and the partitions may belong to another member", code)
        return None
