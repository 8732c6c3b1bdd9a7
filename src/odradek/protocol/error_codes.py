"""Kafka's error codes: one table, from -1 to the highest code in Apache Kafka 4.1.

Every response carries int16 error codes. The table below is the whole vocabulary: the code, Kafka's
UPPER_SNAKE name (the member name), whether Kafka classes the error as retriable (its exception class
is a `RetriableException` subclass) and a short message for logs and for responses that carry one.

Sources: seed 003 (protocol guide, "Error Codes", codes -1..81, Kafka 2.2 era) for the old codes, and
Apache Kafka's protocol reference for the codes added since, through 4.1 (133). Where current Kafka
disagrees with the seed, current Kafka wins (seeds/README: "Where they are silent or out of date, current
Apache Kafka behaviour is the reference"); the differences are listed in `SEED_DEVIATIONS` so tests can
check that no other drift creeps in:

- code 6 was renamed NOT_LEADER_FOR_PARTITION -> NOT_LEADER_OR_FOLLOWER (KIP-392, Kafka 2.6); the old
  name still resolves through `by_name`;
- REPLICA_NOT_AVAILABLE (9) became retriable in Kafka 2.6, together with that rename;
- CONCURRENT_TRANSACTIONS (51) became retriable in Kafka 3.4 (KAFKA-14417).

Unknown codes behave as in Kafka's `Errors.forCode`: they map to UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """A Kafka error code. `int(code)` is the wire value; `.retriable` and `.message` describe it."""

    retriable: bool
    message: str

    def __new__(cls, code: int, retriable: bool, message: str) -> ErrorCode:
        member = int.__new__(cls, code)
        member._value_ = code
        member.retriable = retriable
        member.message = message
        return member

    # name = (code, retriable, message)
    UNKNOWN_SERVER_ERROR = (-1, False, "The server experienced an unexpected error processing the request.")
    NONE = (0, False, "")
    OFFSET_OUT_OF_RANGE = (1, False, "The requested offset is outside the range of offsets the server holds.")
    CORRUPT_MESSAGE = (2, True, "The message failed its CRC check, is too large, has a null key on a "
                                "compacted topic, or is otherwise corrupt.")
    UNKNOWN_TOPIC_OR_PARTITION = (3, True, "This server does not host this topic-partition.")
    INVALID_FETCH_SIZE = (4, False, "The requested fetch size is invalid.")
    LEADER_NOT_AVAILABLE = (5, True, "The topic-partition has no leader: a leader election is in progress.")
    NOT_LEADER_OR_FOLLOWER = (6, True, "This broker is not the leader (or not a replica) of the topic-partition.")
    REQUEST_TIMED_OUT = (7, True, "The request timed out.")
    BROKER_NOT_AVAILABLE = (8, False, "The broker is not available.")
    REPLICA_NOT_AVAILABLE = (9, True, "The replica is not available for the requested topic-partition.")
    MESSAGE_TOO_LARGE = (10, False, "The request included a message larger than the server accepts.")
    STALE_CONTROLLER_EPOCH = (11, False, "The controller moved to another broker.")
    OFFSET_METADATA_TOO_LARGE = (12, False, "The metadata field of the offset request was too large.")
    NETWORK_EXCEPTION = (13, True, "The server disconnected before a response was received.")
    COORDINATOR_LOAD_IN_PROGRESS = (14, True, "The coordinator is loading and cannot process requests yet.")
    COORDINATOR_NOT_AVAILABLE = (15, True, "The coordinator is not available.")
    NOT_COORDINATOR = (16, True, "This is not the correct coordinator.")
    INVALID_TOPIC_EXCEPTION = (17, False, "The request named an invalid topic.")
    RECORD_LIST_TOO_LARGE = (18, False, "The request included a batch larger than the configured segment size.")
    NOT_ENOUGH_REPLICAS = (19, True, "Rejected: fewer in-sync replicas than required.")
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (20, True, "Written to the log, but to fewer in-sync replicas than required.")
    INVALID_REQUIRED_ACKS = (21, False, "The produce request gave an invalid value for required acks.")
    ILLEGAL_GENERATION = (22, False, "The group generation id is not valid.")
    INCONSISTENT_GROUP_PROTOCOL = (23, False, "The member's protocols are incompatible with the group's, or empty.")
    INVALID_GROUP_ID = (24, False, "The group id is invalid.")
    UNKNOWN_MEMBER_ID = (25, False, "The coordinator does not know this member.")
    INVALID_SESSION_TIMEOUT = (26, False, "The session timeout is outside group.min.session.timeout.ms.."
                                          "group.max.session.timeout.ms.")
    REBALANCE_IN_PROGRESS = (27, False, "The group is rebalancing, so a rejoin is needed.")
    INVALID_COMMIT_OFFSET_SIZE = (28, False, "The committed offset data size is not valid.")
    TOPIC_AUTHORIZATION_FAILED = (29, False, "Topic authorization failed.")
    GROUP_AUTHORIZATION_FAILED = (30, False, "Group authorization failed.")
    CLUSTER_AUTHORIZATION_FAILED = (31, False, "Cluster authorization failed.")
    INVALID_TIMESTAMP = (32, False, "The timestamp of the message is out of the acceptable range.")
    UNSUPPORTED_SASL_MECHANISM = (33, False, "The broker does not support the requested SASL mechanism.")
    ILLEGAL_SASL_STATE = (34, False, "The request is not valid in the current SASL state.")
    UNSUPPORTED_VERSION = (35, False, "The version of the API is not supported.")
    TOPIC_ALREADY_EXISTS = (36, False, "A topic with this name already exists.")
    INVALID_PARTITIONS = (37, False, "The number of partitions is invalid.")
    INVALID_REPLICATION_FACTOR = (38, False, "The replication factor is below 1 or above the number of brokers.")
    INVALID_REPLICA_ASSIGNMENT = (39, False, "The replica assignment is invalid.")
    INVALID_CONFIG = (40, False, "The configuration is invalid.")
    NOT_CONTROLLER = (41, True, "This is not the correct controller for this cluster.")
    INVALID_REQUEST = (42, False, "The request is malformed or was sent to an incompatible broker.")
    UNSUPPORTED_FOR_MESSAGE_FORMAT = (43, False, "The broker's message format version does not support the request.")
    POLICY_VIOLATION = (44, False, "The request parameters do not satisfy the configured policy.")
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, False, "The broker received an out of order sequence number.")
    DUPLICATE_SEQUENCE_NUMBER = (46, False, "The broker received a duplicate sequence number.")
    INVALID_PRODUCER_EPOCH = (47, False, "The producer used an old epoch.")
    INVALID_TXN_STATE = (48, False, "The producer attempted a transactional operation in an invalid state.")
    INVALID_PRODUCER_ID_MAPPING = (49, False, "The producer id is not assigned to this transactional id.")
    INVALID_TRANSACTION_TIMEOUT = (50, False, "The transaction timeout is above transaction.max.timeout.ms.")
    CONCURRENT_TRANSACTIONS = (51, True, "Another operation on the same transaction is in progress.")
    TRANSACTION_COORDINATOR_FENCED = (52, False, "The transaction coordinator sending the marker is no longer current.")
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, False, "Transactional id authorization failed.")
    SECURITY_DISABLED = (54, False, "Security features are disabled.")
    OPERATION_NOT_ATTEMPTED = (55, False, "The broker did not attempt this operation because others in the "
                                          "batch failed.")
    KAFKA_STORAGE_ERROR = (56, True, "Disk error while accessing a log file.")
    LOG_DIR_NOT_FOUND = (57, False, "The log directory is not in the broker's configuration.")
    SASL_AUTHENTICATION_FAILED = (58, False, "SASL authentication failed.")
    UNKNOWN_PRODUCER_ID = (59, False, "The broker has no state for this producer id (its records may have "
                                      "been removed by retention).")
    REASSIGNMENT_IN_PROGRESS = (60, False, "A partition reassignment is in progress.")
    DELEGATION_TOKEN_AUTH_DISABLED = (61, False, "Delegation tokens are not enabled.")
    DELEGATION_TOKEN_NOT_FOUND = (62, False, "The delegation token was not found.")
    DELEGATION_TOKEN_OWNER_MISMATCH = (63, False, "The principal is not a valid owner or renewer of the token.")
    DELEGATION_TOKEN_REQUEST_NOT_ALLOWED = (64, False, "Delegation token requests are not allowed on this channel.")
    DELEGATION_TOKEN_AUTHORIZATION_FAILED = (65, False, "Delegation token authorization failed.")
    DELEGATION_TOKEN_EXPIRED = (66, False, "The delegation token has expired.")
    INVALID_PRINCIPAL_TYPE = (67, False, "The principal type is not supported.")
    NON_EMPTY_GROUP = (68, False, "The group is not empty.")
    GROUP_ID_NOT_FOUND = (69, False, "The group id does not exist.")
    FETCH_SESSION_ID_NOT_FOUND = (70, True, "The fetch session id was not found.")
    INVALID_FETCH_SESSION_EPOCH = (71, True, "The fetch session epoch is invalid.")
    LISTENER_NOT_FOUND = (72, True, "The leader has no listener matching the one this request arrived on.")
    TOPIC_DELETION_DISABLED = (73, False, "Topic deletion is disabled.")
    FENCED_LEADER_EPOCH = (74, True, "The leader epoch in the request is older than the broker's.")
    UNKNOWN_LEADER_EPOCH = (75, True, "The leader epoch in the request is newer than the broker's.")
    UNSUPPORTED_COMPRESSION_TYPE = (76, False, "The client does not support the partition's compression type.")
    STALE_BROKER_EPOCH = (77, False, "The broker epoch has changed.")
    OFFSET_NOT_AVAILABLE = (78, True, "The new leader's high watermark has not caught up yet.")
    MEMBER_ID_REQUIRED = (79, False, "The member needs a member id before joining the group.")
    PREFERRED_LEADER_NOT_AVAILABLE = (80, True, "The preferred leader was not available.")
    GROUP_MAX_SIZE_REACHED = (81, False, "The group has reached its maximum size.")
    FENCED_INSTANCE_ID = (82, False, "Another member registered with the same group.instance.id.")
    ELIGIBLE_LEADERS_NOT_AVAILABLE = (83, True, "No eligible leader is available for the partition.")
    ELECTION_NOT_NEEDED = (84, True, "Leader election is not needed for the partition.")
    NO_REASSIGNMENT_IN_PROGRESS = (85, False, "No partition reassignment is in progress.")
    GROUP_SUBSCRIBED_TO_TOPIC = (86, False, "Cannot delete offsets of a topic the group is subscribed to.")
    INVALID_RECORD = (87, False, "The record failed validation on the broker.")
    UNSTABLE_OFFSET_COMMIT = (88, True, "There are unstable offsets that need to be cleared.")
    THROTTLING_QUOTA_EXCEEDED = (89, True, "The throttling quota has been exceeded.")
    PRODUCER_FENCED = (90, False, "A newer producer with the same transactional id fenced this one.")
    RESOURCE_NOT_FOUND = (91, False, "The request referred to a resource that does not exist.")
    DUPLICATE_RESOURCE = (92, False, "The request referred to the same resource twice.")
    UNACCEPTABLE_CREDENTIAL = (93, False, "The credential does not meet the acceptability criteria.")
    INCONSISTENT_VOTER_SET = (94, False, "The sender or recipient of a voter-only request is not a voter.")
    INVALID_UPDATE_VERSION = (95, False, "The update version is invalid.")
    FEATURE_UPDATE_FAILED = (96, False, "Updating finalized features failed on the server.")
    PRINCIPAL_DESERIALIZATION_FAILURE = (97, False, "The forwarded request's principal could not be deserialized.")
    SNAPSHOT_NOT_FOUND = (98, False, "The requested snapshot was not found.")
    POSITION_OUT_OF_RANGE = (99, False, "The requested position is outside the snapshot.")
    UNKNOWN_TOPIC_ID = (100, True, "This server does not host this topic id.")
    DUPLICATE_BROKER_REGISTRATION = (101, False, "This broker id is already in use.")
    BROKER_ID_NOT_REGISTERED = (102, False, "The broker id was not registered.")
    INCONSISTENT_TOPIC_ID = (103, True, "The log's topic id does not match the topic id in the request.")
    INCONSISTENT_CLUSTER_ID = (104, False, "The cluster id in the request does not match the server's.")
    TRANSACTIONAL_ID_NOT_FOUND = (105, False, "The transactional id was not found.")
    FETCH_SESSION_TOPIC_ID_ERROR = (106, True, "The fetch session used topic ids inconsistently.")
    INELIGIBLE_REPLICA = (107, False, "The new ISR contains an ineligible replica.")
    NEW_LEADER_ELECTED = (108, False, "The partition state was updated but the leader has changed.")
    OFFSET_MOVED_TO_TIERED_STORAGE = (109, False, "The requested offset has moved to tiered storage.")
    FENCED_MEMBER_EPOCH = (110, False, "The member epoch is fenced; the member must rejoin with no partitions.")
    UNRELEASED_INSTANCE_ID = (111, False, "The instance id is still used by another member of the group.")
    UNSUPPORTED_ASSIGNOR = (112, False, "The group does not support the assignor or its version range.")
    STALE_MEMBER_EPOCH = (113, False, "The member epoch is stale; retry after the next heartbeat.")
    MISMATCHED_ENDPOINT_TYPE = (114, False, "The request was sent to an endpoint of the wrong type.")
    UNSUPPORTED_ENDPOINT_TYPE = (115, False, "This endpoint type is not supported yet.")
    UNKNOWN_CONTROLLER_ID = (116, False, "This controller id is not known.")
    UNKNOWN_SUBSCRIPTION_ID = (117, False, "The telemetry subscription id is invalid or outdated.")
    TELEMETRY_TOO_LARGE = (118, False, "The telemetry push is larger than the broker accepts.")
    INVALID_REGISTRATION = (119, False, "The controller considers the broker registration invalid.")
    TRANSACTION_ABORTABLE = (120, False, "The transaction failed; abort it to keep using the transactional id.")
    INVALID_RECORD_STATE = (121, False, "The record state is invalid; the acknowledgement failed.")
    SHARE_SESSION_NOT_FOUND = (122, True, "The share session was not found.")
    INVALID_SHARE_SESSION_EPOCH = (123, True, "The share session epoch is invalid.")
    FENCED_STATE_EPOCH = (124, False, "The share-group state epoch does not match.")
    INVALID_VOTER_KEY = (125, False, "The voter key does not match the receiving replica's key.")
    DUPLICATE_VOTER = (126, False, "The voter is already in the set of voters.")
    VOTER_NOT_FOUND = (127, False, "The voter is not in the set of voters.")
    INVALID_REGULAR_EXPRESSION = (128, False, "The regular expression is not valid.")
    REBOOTSTRAP_REQUIRED = (129, False, "Client metadata is stale; the client should rebootstrap.")
    STREAMS_INVALID_TOPOLOGY = (130, False, "The supplied topology is invalid.")
    STREAMS_INVALID_TOPOLOGY_EPOCH = (131, False, "The supplied topology epoch is invalid.")
    STREAMS_TOPOLOGY_FENCED = (132, False, "The supplied topology epoch is outdated.")
    SHARE_SESSION_LIMIT_REACHED = (133, True, "The limit of share sessions has been reached.")


MIN_CODE = -1
MAX_CODE = 133

# Names Kafka used before a rename; wire codes never change, so old names stay resolvable.
FORMER_NAMES: dict[str, ErrorCode] = {
    "UNKNOWN": ErrorCode.UNKNOWN_SERVER_ERROR,
    "GROUP_LOAD_IN_PROGRESS": ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
    "GROUP_COORDINATOR_NOT_AVAILABLE": ErrorCode.COORDINATOR_NOT_AVAILABLE,
    "NOT_COORDINATOR_FOR_GROUP": ErrorCode.NOT_COORDINATOR,
    "NOT_LEADER_FOR_PARTITION": ErrorCode.NOT_LEADER_OR_FOLLOWER,
}

# Where this table knowingly differs from seed 003's table: seed name -> (current name, current retriable).
SEED_DEVIATIONS: dict[str, tuple[str, bool]] = {
    "NOT_LEADER_FOR_PARTITION": ("NOT_LEADER_OR_FOLLOWER", True),
    "REPLICA_NOT_AVAILABLE": ("REPLICA_NOT_AVAILABLE", True),
    "CONCURRENT_TRANSACTIONS": ("CONCURRENT_TRANSACTIONS", True),
}

_BY_CODE: dict[int, ErrorCode] = {int(member): member for member in ErrorCode}


def for_code(code: int) -> ErrorCode:
    """The error for a wire code; unknown codes map to UNKNOWN_SERVER_ERROR, as in Kafka."""
    return _BY_CODE.get(code, ErrorCode.UNKNOWN_SERVER_ERROR)


def is_known(code: int) -> bool:
    return code in _BY_CODE


def is_retriable(code: int) -> bool:
    """Whether a client may retry the request as is; unknown codes are not retriable."""
    member = _BY_CODE.get(code)
    return member is not None and member.retriable


def message(code: int) -> str:
    member = _BY_CODE.get(code)
    if member is None:
        return f"Unknown error code {code}."
    return member.message


def by_name(name: str) -> ErrorCode:
    """Look up by Kafka's name (case-insensitive), including names Kafka used before a rename.

    Raises KeyError for a name that is neither.
    """
    key = name.strip().upper()
    member = ErrorCode.__members__.get(key)
    if member is None:
        member = FORMER_NAMES.get(key)
    if member is None:
        raise KeyError(f"unknown Kafka error name {name!r}")
    return member


class KafkaApiError(Exception):
    """An error that a handler turns into an error code (and message, where the response has one).

    Raise it inside request handling for a failure that belongs in the response, not on the connection.
    """

    def __init__(self, code: ErrorCode, detail: str | None = None) -> None:
        self.code = code
        self.detail = detail if detail is not None else code.message
        super().__init__(f"{code.name}: {self.detail}")

    @property
    def retriable(self) -> bool:
        return self.code.retriable
