"""What the classic membership (`group.Membership`; seed 000, seed 004 "Group Membership API") and the
consumer protocol's (`group_consumer.ConsumerMembership`; seed 002, KIP-848) share, sans I/O like them:
their states, requests (`Send`), application steps and errors, and `MembershipBase` with what works
the same in both: finding and losing the coordinator (a new session `_epoch` drops stale answers), the
request bookkeeping and dispatch of answers to `_on_<kind>`, the skeleton of `actions` and
`timeout_ms` (a subclass adds `_group_request` and `_due_times`), leaving after max.poll.interval.ms
without a poll, FENCED_INSTANCE_ID, and the OffsetCommit / OffsetFetch error mapping (a subclass adds
its own cases in `_commit_group_error`).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass, field
from typing import Any

from odradek.client.errors import BrokerResponseError, KafkaError
from odradek.client.fetcher import TopicPartition
from odradek.protocol.error_codes import ErrorCode, for_code
from odradek.protocol.messages import find_coordinator as fc

log = logging.getLogger("odradek.client.group")

FIND_COORDINATOR = 10


class CommitFailedError(KafkaError):
    """The group rebalanced before the commit; the partitions may belong to another member now."""


class RebalanceInProgressError(KafkaError):
    """A commit while the group is rebalancing; poll (to finish the rebalance) and commit again."""

    retriable = True


class FencedInstanceIdError(KafkaError):
    """Another consumer joined with this group.instance.id; this one is fenced (fatal)."""

    code = ErrorCode.FENCED_INSTANCE_ID


class State(enum.Enum):
    UNSUBSCRIBED = "unsubscribed"
    UNJOINED = "unjoined"
    JOINING = "joining"
    ASSIGNING = "assigning"
    SYNCING = "syncing"
    ASSIGNED = "assigned"
    STABLE = "stable"
    FATAL = "fatal"
    CLOSED = "closed"


@dataclass(slots=True)
class Send:
    """A request for the runtime to send: FindCoordinator to any broker, the rest to the coordinator."""
    kind: str                 # find, join, sync, heartbeat, leave, prepare, install
    api_key: int
    body: Any
    timeout_ms: int | None = None
    epoch: int = 0            # the membership's _epoch when made: answers to older epochs are ignored
    generation: int = -1


@dataclass(slots=True)
class PrepareStep:
    revoked: set[TopicPartition] = field(default_factory=set)   # commit (auto commit), then revoke
    lost: set[TopicPartition] = field(default_factory=set)      # already someone else's: no commit


@dataclass(slots=True)
class AssignStep:
    assigned: list[TopicPartition]                              # the whole new assignment
    added: set[TopicPartition]
    revoked: set[TopicPartition]                                # cooperative only


COORDINATOR_GONE = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
JOINED = (State.ASSIGNED, State.STABLE)
ENDED = (State.FATAL, State.CLOSED)


class MembershipBase:
    COORDINATOR_KINDS: tuple[str, ...] = ("heartbeat",)   # requests to the coordinator that a loss drops
    UNJOINED_ON_LOSS: tuple[State, ...] = ()               # states a coordinator loss ends
    COMMIT_RETRIABLE = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
    FETCH_RETRIABLE = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.UNSTABLE_OFFSET_COMMIT})
    NOT_A_MEMBER = "this consumer is not a member of group {group!r} now"

    generation: int
    member_id: str

    def __init__(self, config: dict, now_ms: float) -> None:
        c = config
        self.group_id: str = c["group.id"]
        self.instance_id: str | None = c["group.instance.id"]
        self.rebalance_timeout_ms: int = c["max.poll.interval.ms"]
        self.request_timeout_ms: int = c["request.timeout.ms"]
        self.retry_backoff_ms: int = c["retry.backoff.ms"]
        self.rack_id: str | None = c.get("client.rack") or None
        self.state = State.UNSUBSCRIBED
        self.topics: frozenset[str] = frozenset()
        self.topics_known = True                         # False until a pattern is first resolved
        self.owned: set[TopicPartition] = set()          # what the application holds now
        self.coordinator: tuple[int, str, int] | None = None
        self.coordinator_wanted = False                  # commits outside a subscription need one too
        self.lost_pending = False                        # owned partitions must be reported lost
        self.fatal: KafkaError | None = None
        self.polling = 0                                 # the application is inside poll
        self.last_poll_ms = now_ms
        self.in_flight: dict[str, Send] = {}
        self._outbox: list[Send] = []
        self._epoch = 0                                  # of coordinator sessions: stale answers are dropped
        self._find_at = 0.0
        self._heartbeat_at = 0.0

    # ------------------------------------------------------------------------------------ application
    @property
    def subscribed(self) -> bool:
        return self.state not in (State.UNSUBSCRIBED, State.CLOSED)

    def unsubscribe(self, now_ms: float) -> Send | None:
        """Leave the group; the caller revokes what it owns."""
        send = self._leave_request("the consumer unsubscribed from all topics")
        self._out_of_group(lost=False)
        self.owned.clear()
        self.lost_pending = False
        self.state = State.UNSUBSCRIBED
        self.topics = frozenset()
        return send

    def leave(self, now_ms: float) -> Send | None:
        """Closing: the leave request to send, if any."""
        send = self._leave_request("the consumer is being closed", closing=True)
        self.state = State.CLOSED
        return send

    def poll(self, now_ms: float) -> None:
        self.last_poll_ms = now_ms

    def prepared_done(self, step: PrepareStep, now_ms: float) -> None:
        self.owned -= step.revoked | step.lost
        self.lost_pending = False

    # ------------------------------------------------------------------------------------ timers
    def _wants_coordinator(self) -> bool:
        return (self.subscribed and self.state is not State.FATAL) or self.coordinator_wanted

    def actions(self, now_ms: float) -> list[Send]:
        """Requests to send now (timers checked first)."""
        out, self._outbox = self._outbox, []
        if self.state in ENDED:
            return out
        self._check_timers(now_ms)
        out += self._outbox
        self._outbox = []
        if self.coordinator is None:
            if self._wants_coordinator() and "find" not in self.in_flight and now_ms >= self._find_at:
                out.append(self._track(Send("find", FIND_COORDINATOR, fc.FindCoordinatorRequest(
                    key=self.group_id, key_type=0, coordinator_keys=[self.group_id]))))
            return out
        send = self._group_request(now_ms)
        if send is not None:
            out.append(send)
        return out

    def timeout_ms(self, now_ms: float) -> float | None:
        """How long until `actions` may have something new to do (None: only after an event)."""
        if self.state in ENDED:
            return None
        times = self._due_times()
        if self.coordinator is None and self._wants_coordinator() and "find" not in self.in_flight:
            times.append(self._find_at)
        if self.state in JOINED and not self.polling:
            times.append(self.last_poll_ms + self.rebalance_timeout_ms + 1)
        return max(0.0, min(times) - now_ms) if times else None

    def _poll_interval_passed(self, now_ms: float) -> bool:
        """In the group without a poll for max.poll.interval.ms: leave it, the partitions are lost."""
        if self.state not in JOINED or self.polling or now_ms - self.last_poll_ms <= self.rebalance_timeout_ms:
            return False
        log.warning("group %s: no poll for more than max.poll.interval.ms (%d ms): leaving the group",
                    self.group_id, self.rebalance_timeout_ms)
        send = self._leave_request("consumer poll timeout has expired")
        if send is not None:
            self._outbox.append(send)
        self._out_of_group(lost=True)
        return True

    def _check_timers(self, now_ms: float) -> None:
        self._poll_interval_passed(now_ms)

    def _group_request(self, now_ms: float) -> Send | None:   # the request to the coordinator due now
        raise NotImplementedError

    def _due_times(self) -> list[float]:                       # the subclass's own deadlines
        raise NotImplementedError

    def _leave_request(self, reason: str, closing: bool = False) -> Send | None:   # None: nothing to send
        raise NotImplementedError

    def _out_of_group(self, lost: bool) -> None:               # join again later; what is owned may be lost
        raise NotImplementedError

    # ------------------------------------------------------------------------------------ answers
    def _track(self, send: Send) -> Send:
        send.epoch = self._epoch
        self.in_flight[send.kind] = send
        return send

    def on_failure(self, send: Send, exc: BaseException, now_ms: float) -> None:
        """The request was not answered (connection lost, timed out, no broker)."""
        if self.in_flight.get(send.kind) is send:
            del self.in_flight[send.kind]
        if send.kind == "find":
            self._find_at = now_ms + self.retry_backoff_ms
        elif send.epoch == self._epoch and send.kind in self.COORDINATOR_KINDS:
            self.coordinator_lost(now_ms, f"{send.kind} failed: {exc}")

    def on_response(self, send: Send, response, now_ms: float) -> None:
        """An answer goes to `_on_<kind>` (none for a LeaveGroup), unless it belongs to an older session."""
        if self.in_flight.get(send.kind) is send:
            del self.in_flight[send.kind]
        handler = getattr(self, f"_on_{send.kind}", None)
        if handler is not None and (send.kind == "find" or send.epoch == self._epoch):
            handler(send, response, now_ms)

    def _on_find(self, send: Send, r, now_ms: float) -> None:
        c = r.coordinators[0] if getattr(r, "coordinators", None) else r
        if c.error_code == 0:
            self.coordinator = (c.node_id, c.host, c.port)
            self._epoch += 1
            self._heartbeat_at = now_ms
            self._coordinator_found(now_ms)
            log.info("group %s: coordinator is broker %d at %s:%d", self.group_id, c.node_id, c.host, c.port)
            return
        self._find_at = now_ms + self.retry_backoff_ms
        if c.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED:
            self.fail(BrokerResponseError(c.error_code, f"FindCoordinator for group {self.group_id!r}"))
        else:
            log.info("group %s: FindCoordinator: %s", self.group_id, for_code(c.error_code).name)

    def _coordinator_found(self, now_ms: float) -> None:
        """A subclass's own state for a new coordinator session."""

    # ------------------------------------------------------------------------------------ state changes
    def coordinator_lost(self, now_ms: float, reason: str) -> None:
        if self.coordinator is not None:
            log.info("group %s: coordinator %s unavailable: %s", self.group_id, self.coordinator, reason)
        self.coordinator = None
        self._epoch += 1
        self._find_at = max(self._find_at, now_ms)
        for kind in self.COORDINATOR_KINDS:
            self.in_flight.pop(kind, None)
        if self.state in self.UNJOINED_ON_LOSS:
            self.state = State.UNJOINED

    def fail(self, error: KafkaError) -> None:
        log.error("group %s: %s", self.group_id, error)
        self.fatal = error
        self.state = State.FATAL

    def _fence_instance(self) -> KafkaError:
        """FENCED_INSTANCE_ID: another consumer has this group.instance.id (fatal)."""
        self.fail(FencedInstanceIdError(f"group {self.group_id!r}: group.instance.id {self.instance_id!r} "
                                        f"is in use by another consumer"))
        assert self.fatal is not None
        return self.fatal

    # ------------------------------------------------------------------------------------ offsets
    def commit_generation(self) -> tuple[int, str]:
        """(generation or member epoch, member id) to commit with; -1 and "" without a subscription."""
        if self.state in (State.UNSUBSCRIBED, State.CLOSED):
            return -1, ""
        if self.state is State.FATAL:
            assert self.fatal is not None
            raise self.fatal
        if self.state in JOINED:
            return self.generation, self.member_id
        if self._rebalancing():
            raise RebalanceInProgressError(f"group {self.group_id!r} is rebalancing: commit after the next poll")
        raise CommitFailedError(self.NOT_A_MEMBER.format(group=self.group_id))

    def _rebalancing(self) -> bool:
        raise NotImplementedError

    def commit_error(self, code: int, now_ms: float) -> KafkaError | None:
        """The error to raise for a partition's OffsetCommit error code; None: retry (after a backoff,
        and rediscovery when the coordinator moved)."""
        if code in COORDINATOR_GONE or code == ErrorCode.REQUEST_TIMED_OUT:
            self.coordinator_lost(now_ms, f"OffsetCommit: {for_code(code).name}")
            return None
        if code in self.COMMIT_RETRIABLE:
            return None
        if code == ErrorCode.FENCED_INSTANCE_ID:
            return self._fence_instance()
        error = self._commit_group_error(code)
        return error if error is not None else BrokerResponseError(code, f"OffsetCommit for group {self.group_id!r}")

    def _commit_group_error(self, code: int) -> KafkaError | None:
        """The subclass's own OffsetCommit errors (None: the generic error)."""
        return None

    def fetch_error(self, code: int, now_ms: float) -> KafkaError | None:
        """As commit_error, for OffsetFetch (group or partition level)."""
        if code in COORDINATOR_GONE:
            self.coordinator_lost(now_ms, f"OffsetFetch: {for_code(code).name}")
            return None
        if code in self.FETCH_RETRIABLE:
            return None
        return BrokerResponseError(code, f"OffsetFetch for group {self.group_id!r}")
