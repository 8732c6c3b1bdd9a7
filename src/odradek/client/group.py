"""Classic consumer-group membership as a state machine, sans I/O (seed 000; seed 004, "Group
Membership API"; Kafka's ConsumerCoordinator and AbstractCoordinator).

`Membership` never touches a socket, a task or a clock: its owner (`group_runtime.GroupRuntime`) asks
it what to send (`actions(now)`), hands back every response or failure (`on_response`, `on_failure`),
and sleeps until `timeout_ms(now)`. What needs the application (revocation callbacks, committing on
revoke, applying an assignment, fetching committed offsets) is an *application step* the consumer runs
inside its poll, as Java's consumer runs rebalance callbacks inside poll(): `app_step()` gives a
`PrepareStep` (before a JoinGroup: revoke or lose what must go) or an `AssignStep` (after SyncGroup),
and the consumer answers `prepared(now)` or `applied(now)`. What it does as the consumer protocol's
membership does (finding the coordinator, timers, offset commit errors) is in `group_member`.

States and transitions (flags: `rejoin_needed`, `prepared`; "reset" = generation -1, member id kept
after ILLEGAL_GENERATION, cleared after UNKNOWN_MEMBER_ID, and the owned partitions are lost):

    state        event                                              next        output
    UNSUBSCRIBED subscribe()                                        UNJOINED    -
    UNJOINED     poll runs PrepareStep -> prepared()                UNJOINED    - (prepared)
    UNJOINED     prepared, coordinator known                        JOINING     JoinGroup
    STABLE       rejoin_needed, prepared, coordinator known         JOINING     JoinGroup
    JOINING      MEMBER_ID_REQUIRED (v4+)                           UNJOINED    JoinGroup at once, given id
    JOINING      ok, we lead (and may assign)                       ASSIGNING   (runtime: partition counts)
    ASSIGNING    assign(counts)                                     SYNCING     SyncGroup with assignments
    JOINING      ok, we follow                                      SYNCING     SyncGroup
    SYNCING      ok                                                 ASSIGNED    AssignStep for poll
    ASSIGNED     poll runs AssignStep -> applied()                  STABLE      heartbeats
    STABLE       heartbeat due (heartbeat.interval.ms)              STABLE      Heartbeat
    STABLE       Heartbeat REBALANCE_IN_PROGRESS                    STABLE      - (rejoin_needed)
    any joined   ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID             UNJOINED    - (reset)
    JOINING..    NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, lost   UNJOINED    FindCoordinator
    STABLE       no heartbeat answer for session.timeout.ms         STABLE      FindCoordinator
    STABLE       no poll for max.poll.interval.ms                   UNJOINED    LeaveGroup if dynamic (reset)
    any          FENCED_INSTANCE_ID, a fatal join error             FATAL       poll raises
    any          unsubscribe()                                      UNSUBSCRIBED LeaveGroup if dynamic
    any          leave() (close)                                    CLOSED      LeaveGroup if dynamic

Static members (group.instance.id) never send LeaveGroup: the coordinator keeps their place for the
session timeout, so a restart within it gets the same partitions without a rebalance.

The rebalance protocol is cooperative when every configured assignor supports it, else eager. Eager:
the PrepareStep revokes everything before JoinGroup. Cooperative: the PrepareStep revokes only
partitions of topics no longer subscribed; the AssignStep revokes what the leader took away and, if it
revoked anything, asks for the follow-up rebalance that hands those partitions to their new owners.
"""

from __future__ import annotations

import logging
import struct

from odradek.client.assignors import Subscription, assignors_from_config
from odradek.client.config import CONSUMER, ConfigDef, _any, _bool, _int, build
from odradek.client.group_assignors import group_assignors_from_config
from odradek.client.group_member import (  # noqa: F401 - the names the memberships' users import from here
    COORDINATOR_GONE, JOINED, AssignStep, CommitFailedError, FencedInstanceIdError, MembershipBase,
    PrepareStep, RebalanceInProgressError, Send, State,
)
from odradek.client.errors import BrokerResponseError, ConfigError, KafkaError
from odradek.client.fetcher import TopicPartition
from odradek.protocol.api import decode_record, encode_record
from odradek.protocol.error_codes import ErrorCode, for_code
from odradek.protocol.exceptions import ProtocolError
from odradek.protocol.messages import consumer_protocol_assignment as cpa
from odradek.protocol.messages import consumer_protocol_subscription as cps
from odradek.protocol.messages import heartbeat as hb
from odradek.protocol.messages import join_group as jg
from odradek.protocol.messages import leave_group as lg
from odradek.protocol.messages import sync_group as sg

log = logging.getLogger("odradek.client.group")

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 11, 12, 13, 14
PROTOCOL_TYPE = "consumer"
EAGER, COOPERATIVE = "eager", "cooperative"
JOIN_TIMEOUT_LAPSE_MS = 5000          # Java's JOIN_GROUP_TIMEOUT_LAPSE: the broker holds JoinGroup
CONSUMER_PROTOCOL_VERSION = 3         # newer versions are read with the v3 layout, as Kafka does

# Consumer configs of group membership (Java's names and defaults); `consumer` merges them in.
GROUP_CONFIG = [
    ConfigDef("group.id", _any, None, "the consumer group; needed by subscribe() and commit()"),
    ConfigDef("group.instance.id", _any, None, "static membership (KIP-345): no LeaveGroup on close"),
    ConfigDef("session.timeout.ms", _int, 45000),
    ConfigDef("heartbeat.interval.ms", _int, 3000),
    ConfigDef("max.poll.interval.ms", _int, 300000, "also the rebalance timeout sent in JoinGroup"),
    ConfigDef("partition.assignment.strategy", _any, "range,cooperative-sticky"),
    ConfigDef("enable.auto.commit", _bool, True, "only with group.id"),
    ConfigDef("auto.commit.interval.ms", _int, 5000),
    ConfigDef("default.api.timeout.ms", _int, 60000, "bound of commit() and committed()"),
    ConfigDef("group.protocol", _any, "classic", "classic (JoinGroup/SyncGroup) or consumer (KIP-848)"),
    ConfigDef("group.remote.assignor", _any, None, "group.protocol=consumer: the server assignor to ask for"),
    ConfigDef("group.local.assignors", _any, None, "group.protocol=consumer: client-side assignors (names or "
              "objects), an odradek extension the broker must enable (group_assignors)"),
]


def consumer_group_config(config: dict | None = None, **kwargs) -> dict:
    """The consumer's config with the group keys (`config.CONSUMER` overlaid by GROUP_CONFIG)."""
    names = {d.name for d in GROUP_CONFIG}
    given = {**(config or {}), **{k.replace("_", "."): v for k, v in kwargs.items()}}
    out = build([d for d in CONSUMER if d.name not in names] + GROUP_CONFIG, given, {})
    if out["group.id"] is None:
        if given.get("enable.auto.commit") not in (None, False, "false", "False"):
            raise ConfigError("enable.auto.commit needs a group.id")
        out["enable.auto.commit"] = False
    if out["heartbeat.interval.ms"] >= out["session.timeout.ms"]:
        raise ConfigError("heartbeat.interval.ms must be lower than session.timeout.ms")
    for name in ("session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "auto.commit.interval.ms",
                 "default.api.timeout.ms"):
        if out[name] <= 0:
            raise ConfigError(f"{name} must be positive")
    assignors_from_config(out["partition.assignment.strategy"])
    group_assignors_from_config(out["group.local.assignors"])
    out["group.protocol"] = str(out["group.protocol"]).lower()
    if out["group.protocol"] not in ("classic", "consumer"):
        raise ConfigError(f"group.protocol must be classic or consumer, not {out['group.protocol']!r}")
    return out


# ------------------------------------------------------------------------------------ consumer protocol
def encode_subscription(topics, owned=(), generation_id: int = -1, rack_id: str | None = None,
                        user_data: bytes | None = None) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(owned):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return encode_record("ConsumerProtocolSubscription", CONSUMER_PROTOCOL_VERSION, cps.ConsumerProtocolSubscription(
        topics=sorted(topics), user_data=user_data, generation_id=generation_id, rack_id=rack_id,
        owned_partitions=[cps.TopicPartition(topic=t, partitions=ps) for t, ps in by_topic.items()]))


def _capped(data) -> bytes:
    data = bytes(data)
    if len(data) >= 2 and struct.unpack_from(">h", data)[0] > CONSUMER_PROTOCOL_VERSION:
        data = struct.pack(">h", CONSUMER_PROTOCOL_VERSION) + data[2:]
    return data


def decode_subscription(data, group_instance_id: str | None = None) -> Subscription:
    _, s = decode_record("ConsumerProtocolSubscription", _capped(data))
    owned = tuple(TopicPartition(t.topic, p) for t in (s.owned_partitions or ()) for p in t.partitions)
    return Subscription(tuple(s.topics), owned, s.generation_id, group_instance_id, s.rack_id,
                        bytes(s.user_data) if s.user_data is not None else None)


def encode_assignment(partitions) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return encode_record("ConsumerProtocolAssignment", CONSUMER_PROTOCOL_VERSION, cpa.ConsumerProtocolAssignment(
        assigned_partitions=[cpa.TopicPartition(topic=t, partitions=ps) for t, ps in by_topic.items()]))


def decode_assignment(data) -> list[TopicPartition]:
    if not data:
        return []
    _, a = decode_record("ConsumerProtocolAssignment", _capped(data))
    return sorted(TopicPartition(t.topic, p) for t in a.assigned_partitions for p in t.partitions)


# ------------------------------------------------------------------------------------ the machine
_FATAL_JOIN = frozenset({ErrorCode.INCONSISTENT_GROUP_PROTOCOL, ErrorCode.INVALID_SESSION_TIMEOUT,
                         ErrorCode.INVALID_GROUP_ID, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                         ErrorCode.GROUP_MAX_SIZE_REACHED, ErrorCode.UNSUPPORTED_VERSION})
_RESET = frozenset({ErrorCode.ILLEGAL_GENERATION, ErrorCode.UNKNOWN_MEMBER_ID})


class Membership(MembershipBase):
    COORDINATOR_KINDS = ("join", "sync", "heartbeat")
    UNJOINED_ON_LOSS = (State.JOINING, State.ASSIGNING, State.SYNCING)
    NOT_A_MEMBER = "this consumer is not part of an active generation of {group!r}"

    def __init__(self, config: dict, now_ms: float) -> None:
        super().__init__(config, now_ms)
        c = config
        self.session_timeout_ms: int = c["session.timeout.ms"]
        self.heartbeat_interval_ms: int = c["heartbeat.interval.ms"]
        self.assignors = assignors_from_config(c["partition.assignment.strategy"])
        self.protocol = COOPERATIVE if all(a.supports_cooperative for a in self.assignors) else EAGER
        self.member_id = ""
        self.generation = -1
        self.protocol_name: str | None = None
        self.leader_id = ""
        self.rejoin_needed = False
        self.rejoin_reason = ""
        self.prepared = False
        self.members: dict[str, Subscription] = {}       # the leader's view of the members
        self.assignment_snapshot: dict[str, int] | None = None   # counts the leader assigned from
        self.pending_assignment: list[TopicPartition] | None = None
        self._join_at = 0.0
        self._heartbeat_ok_ms = now_ms

    # ------------------------------------------------------------------------------------ application
    def subscribe(self, topics, now_ms: float) -> None:
        topics = frozenset(topics)
        if self.state is State.UNSUBSCRIBED:
            self.state = State.UNJOINED
            self.prepared = False
        elif topics != self.topics:
            self.request_rejoin("the subscription changed")
        self.topics = topics

    def unsubscribe(self, now_ms: float) -> Send | None:
        send = super().unsubscribe(now_ms)
        self.rejoin_needed = False
        return send

    def request_rejoin(self, reason: str) -> None:
        if self.state in (State.UNSUBSCRIBED, State.CLOSED, State.FATAL):
            return
        if not self.rejoin_needed:
            log.info("group %s: rejoin needed: %s", self.group_id, reason)
        self.rejoin_needed = True
        self.rejoin_reason = reason

    def app_step(self) -> PrepareStep | AssignStep | None:
        """What the application must do in its poll before membership can go on (None: nothing)."""
        if self.state is State.ASSIGNED:
            new = set(self.pending_assignment or ())
            revoked = self.owned - new if self.protocol == COOPERATIVE else set()
            added = new - self.owned if self.protocol == COOPERATIVE else new
            return AssignStep(sorted(new), added, revoked)
        if self._need_join() and not self.prepared:
            if self.lost_pending:
                return PrepareStep(lost=set(self.owned))
            if self.protocol == EAGER:
                return PrepareStep(revoked=set(self.owned))
            return PrepareStep(revoked={tp for tp in self.owned if tp.topic not in self.topics})
        return None

    def prepared_done(self, step: PrepareStep, now_ms: float) -> None:
        super().prepared_done(step, now_ms)
        self.prepared = True

    def applied(self, step: AssignStep, now_ms: float) -> None:
        self.owned = set(step.assigned)
        self.pending_assignment = None
        self.prepared = False
        if self.state is State.ASSIGNED:
            self.state = State.STABLE
        if step.revoked:
            self.request_rejoin("partitions were revoked; the follow-up rebalance hands them over")

    # ------------------------------------------------------------------------------------ timers
    def _need_join(self) -> bool:
        return self.state is State.UNJOINED or (self.state is State.STABLE and self.rejoin_needed)

    def _group_request(self, now_ms: float) -> Send | None:
        if (self._need_join() and self.prepared and self.topics_known and now_ms >= self._join_at
                and "join" not in self.in_flight and "sync" not in self.in_flight):
            return self._join_request()
        if self.state in JOINED and "heartbeat" not in self.in_flight and now_ms >= self._heartbeat_at:
            self._heartbeat_at = now_ms + self.heartbeat_interval_ms
            return self._track(Send("heartbeat", HEARTBEAT, hb.HeartbeatRequest(
                group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
                group_instance_id=self.instance_id), generation=self.generation))
        return None

    def _check_timers(self, now_ms: float) -> None:
        if self.state in JOINED and not self._poll_interval_passed(now_ms) and self.coordinator is not None \
                and now_ms - self._heartbeat_ok_ms > self.session_timeout_ms:
            self.coordinator_lost(now_ms, "no heartbeat answer within session.timeout.ms")

    def _out_of_group(self, lost: bool) -> None:
        self._reset(member_id=True)

    def _due_times(self) -> list[float]:
        times = []
        if self.coordinator is not None and self._need_join() and self.prepared and self.topics_known:
            times.append(self._join_at)
        if self.state in JOINED:
            if "heartbeat" not in self.in_flight:
                times.append(self._heartbeat_at)
            times.append(self._heartbeat_ok_ms + self.session_timeout_ms + 1)
        return times

    # ------------------------------------------------------------------------------------ requests
    def _join_request(self) -> Send:
        metadata = encode_subscription(self.topics, self.owned, self.generation, self.rack_id)
        body = jg.JoinGroupRequest(
            group_id=self.group_id, session_timeout_ms=self.session_timeout_ms,
            rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=self.member_id,
            group_instance_id=self.instance_id, protocol_type=PROTOCOL_TYPE,
            protocols=[jg.JoinGroupRequestProtocol(name=a.name, metadata=metadata) for a in self.assignors],
            reason=self.rejoin_reason or None)
        self.state = State.JOINING
        self.rejoin_needed = False
        return self._track(Send("join", JOIN_GROUP, body, max(self.request_timeout_ms,
                                                              self.rebalance_timeout_ms + JOIN_TIMEOUT_LAPSE_MS)))

    def _leave_request(self, reason: str, closing: bool = False) -> Send | None:
        """LeaveGroup (dynamic members only)."""
        if self.instance_id is not None or self.coordinator is None or not self.member_id:
            return None
        if self.state in (State.UNSUBSCRIBED, State.CLOSED, State.FATAL):
            return None
        return Send("leave", LEAVE_GROUP, lg.LeaveGroupRequest(
            group_id=self.group_id, member_id=self.member_id,
            members=[lg.MemberIdentity(member_id=self.member_id, reason=reason)]), epoch=self._epoch)

    # ------------------------------------------------------------------------------------ answers
    def _coordinator_found(self, now_ms: float) -> None:
        self._heartbeat_ok_ms = now_ms

    def _on_join(self, send: Send, r, now_ms: float) -> None:
        code = r.error_code
        if code == 0:
            if self.state is not State.JOINING:
                return
            self.member_id, self.generation = r.member_id, r.generation_id
            self.protocol_name, self.leader_id = r.protocol_name, r.leader
            if r.leader == r.member_id and not r.skip_assignment:
                self.members = {}
                for m in r.members:
                    try:
                        self.members[m.member_id] = decode_subscription(m.metadata, m.group_instance_id)
                    except ProtocolError as e:
                        log.warning("group %s: member %s sent an unreadable subscription: %s",
                                    self.group_id, m.member_id, e)
                        self.members[m.member_id] = Subscription((), group_instance_id=m.group_instance_id)
                self.state = State.ASSIGNING
            else:
                self._sync([])
            return
        self.state = State.UNJOINED
        if code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = r.member_id            # and join again at once
        elif code == ErrorCode.UNKNOWN_MEMBER_ID:
            self._reset(member_id=True)
        elif code in COORDINATOR_GONE:
            self.coordinator_lost(now_ms, for_code(code).name)
        elif code == ErrorCode.FENCED_INSTANCE_ID:
            self._fence_instance()
        elif code in _FATAL_JOIN or not for_code(code).retriable and code not in (
                ErrorCode.REBALANCE_IN_PROGRESS, ErrorCode.ILLEGAL_GENERATION):
            self.fail(BrokerResponseError(code, f"JoinGroup for group {self.group_id!r}"))
        else:   # COORDINATOR_LOAD_IN_PROGRESS, REBALANCE_IN_PROGRESS, ...: again after a backoff
            self._join_at = now_ms + self.retry_backoff_ms

    def partition_counts_needed(self) -> set[str] | None:
        """ASSIGNING: the topics whose partition counts `assign` needs (every member's)."""
        if self.state is not State.ASSIGNING:
            return None
        return {t for s in self.members.values() for t in s.topics}

    def assign(self, partition_counts: dict[str, int], now_ms: float) -> None:
        """The leader runs the group's assignor and sends the assignments in SyncGroup."""
        if self.state is not State.ASSIGNING:
            return
        assignor = next((a for a in self.assignors if a.name == self.protocol_name), None)
        if assignor is None:
            self.fail(KafkaError(f"group {self.group_id!r} chose assignor {self.protocol_name!r}, "
                                  f"which this consumer does not have"))
            return
        result = assignor.assign(dict(partition_counts), dict(self.members))
        if self.protocol == COOPERATIVE:
            _check_cooperative(self.members, result)
        self.assignment_snapshot = {t: n for t, n in partition_counts.items()
                                    if any(t in s.topics for s in self.members.values())}
        self._sync([sg.SyncGroupRequestAssignment(member_id=m, assignment=encode_assignment(result.get(m, ())))
                    for m in self.members])

    def _sync(self, assignments: list) -> None:
        self.state = State.SYNCING
        self._outbox.append(self._track(Send("sync", SYNC_GROUP, sg.SyncGroupRequest(
            group_id=self.group_id, generation_id=self.generation, member_id=self.member_id,
            group_instance_id=self.instance_id, protocol_type=PROTOCOL_TYPE, protocol_name=self.protocol_name,
            assignments=assignments), generation=self.generation)))

    def _on_sync(self, send: Send, r, now_ms: float) -> None:
        code = r.error_code
        if code == 0:
            if self.state is not State.SYNCING:
                return
            try:
                assigned = decode_assignment(r.assignment)
            except ProtocolError as e:
                self.fail(KafkaError(f"group {self.group_id!r}: unreadable assignment: {e}"))
                return
            mine = [tp for tp in assigned if tp.topic in self.topics]
            if len(mine) != len(assigned):
                self.request_rejoin("the assignment has topics this consumer does not subscribe to")
            self.pending_assignment = mine
            self.state = State.ASSIGNED
            self._heartbeat_ok_ms = now_ms
            self._heartbeat_at = now_ms + self.heartbeat_interval_ms
            log.info("group %s generation %d: assigned %s", self.group_id, self.generation, mine)
            return
        self.state = State.UNJOINED
        self._group_error(code, "SyncGroup", now_ms)
        if self.state is State.UNJOINED and code not in _RESET | COORDINATOR_GONE:
            self._join_at = now_ms + (0 if code == ErrorCode.REBALANCE_IN_PROGRESS else self.retry_backoff_ms)

    def _on_heartbeat(self, send: Send, r, now_ms: float) -> None:
        code = r.error_code
        if code == 0 or code == ErrorCode.REBALANCE_IN_PROGRESS:
            self._heartbeat_ok_ms = now_ms
        if code == 0 or send.generation != self.generation or self.state not in JOINED:
            return
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.request_rejoin("the group is rebalancing")
        else:
            self._group_error(code, "Heartbeat", now_ms)
            if code not in _RESET | COORDINATOR_GONE | {ErrorCode.FENCED_INSTANCE_ID}:
                self._heartbeat_at = now_ms + self.retry_backoff_ms

    def _group_error(self, code: int, what: str, now_ms: float) -> None:
        if code in _RESET:
            log.info("group %s: %s: %s: rejoining", self.group_id, what, for_code(code).name)
            self._reset(member_id=code == ErrorCode.UNKNOWN_MEMBER_ID)
        elif code in COORDINATOR_GONE:
            self.coordinator_lost(now_ms, f"{what}: {for_code(code).name}")
        elif code == ErrorCode.FENCED_INSTANCE_ID:
            self._fence_instance()
        elif code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.request_rejoin("the group is rebalancing")
        elif code in (ErrorCode.GROUP_AUTHORIZATION_FAILED, ErrorCode.INCONSISTENT_GROUP_PROTOCOL):
            self.fail(BrokerResponseError(code, f"{what} for group {self.group_id!r}"))
        else:
            log.warning("group %s: %s: %s", self.group_id, what, for_code(code).name)

    # ------------------------------------------------------------------------------------ state changes
    def _reset(self, member_id: bool) -> None:
        """Out of the generation: rejoin, and the partitions held now are lost."""
        self.generation = -1
        if member_id:
            self.member_id = ""
        self._epoch += 1
        for kind in ("join", "sync", "heartbeat"):
            self.in_flight.pop(kind, None)
        self.pending_assignment = None
        if self.owned:
            self.lost_pending = True
            self.prepared = False
        if self.state not in (State.UNSUBSCRIBED, State.CLOSED, State.FATAL):
            self.state = State.UNJOINED
            if not self.prepared:
                self._join_at = 0.0

    def metadata_changed(self, partition_counts: dict[str, int]) -> None:
        """The leader rebalances when a topic it assigned from changes its partition count."""
        snap = self.assignment_snapshot
        if snap is None or self.leader_id != self.member_id or self.state not in JOINED:
            return
        if any(partition_counts.get(t, n) != n for t, n in snap.items()) or any(
                t not in snap and n > 0 for t, n in partition_counts.items()
                if any(t in s.topics for s in self.members.values())):
            self.assignment_snapshot = None
            self.request_rejoin("the partitions of a subscribed topic changed")

    # ------------------------------------------------------------------------------------ offsets
    def _rebalancing(self) -> bool:
        return self.state in (State.JOINING, State.ASSIGNING, State.SYNCING) or self.generation >= 0

    def _commit_group_error(self, code: int) -> KafkaError | None:
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.request_rejoin("a commit found the group rebalancing")
            return RebalanceInProgressError(f"group {self.group_id!r} is rebalancing: commit after the next poll")
        if code in _RESET:
            if self.subscribed:
                self._reset(member_id=code == ErrorCode.UNKNOWN_MEMBER_ID)
            return CommitFailedError(f"commit failed: {for_code(code).name}: the group rebalanced and the "
                                     f"partitions may belong to another member", code)
        return None


def _check_cooperative(members: dict[str, Subscription], result: dict[str, list[TopicPartition]]) -> None:
    """Java's validateCooperativeAssignment: no partition goes straight from one owner to another."""
    owner = {tp: m for m, s in members.items() for tp in s.owned_partitions}
    for m, tps in result.items():
        for tp in tps:
            if owner.get(tp, m) != m:
                raise KafkaError(f"the assignor moved {tp} from {owner[tp]} to {m} in one rebalance, "
                                 f"which the cooperative protocol does not allow")
