"""Errors the client raises: one base class, broker error codes carried as `ErrorCode`.

`KafkaError.retriable` follows Kafka's classification (`odradek.protocol.error_codes`); client-side
conditions (timeouts, lost connections, a full buffer) get their own subclasses with Kafka's meaning:
a lost connection and a request timeout are retriable, a full buffer after `max.block.ms` is not.
"""

from __future__ import annotations

from odradek.protocol.error_codes import ErrorCode, for_code


class KafkaError(Exception):
    """Base of every client error. `code` is the broker's error code when there is one."""

    retriable = False
    code: ErrorCode | None = None

    def __init__(self, message: str = "", code: ErrorCode | int | None = None) -> None:
        if code is not None:
            self.code = for_code(int(code))
            self.retriable = self.code.retriable
            message = message or f"{self.code.name}: {self.code.message}"
        super().__init__(message)


class BrokerResponseError(KafkaError):
    """A broker answered with a non-zero error code."""

    def __init__(self, code: ErrorCode | int, detail: str | None = None) -> None:
        err = for_code(int(code))
        super().__init__(f"{err.name}: {detail or err.message}", err)


class KafkaConnectionError(KafkaError):
    """The connection to a broker could not be made or was lost; requests on it may be retried."""

    retriable = True


class KafkaTimeoutError(KafkaError):
    """A request, a metadata wait, `max.block.ms` or `delivery.timeout.ms` ran out."""


class RequestTimedOutError(KafkaConnectionError):
    """No response within `request.timeout.ms`; the connection is closed, as Kafka's clients do."""


class UnsupportedVersionError(KafkaError):
    """The broker does not speak any version of an API that this client speaks."""


class BufferFullError(KafkaError):
    """`send_nowait` found `buffer.memory` exhausted (the async `send` waits instead)."""


class CorruptRecordError(KafkaError):
    """A fetched record batch fails its CRC or does not parse; the position stays before it (seek past
    it to go on), as Kafka's consumer does."""

    code = ErrorCode.CORRUPT_MESSAGE


class OffsetOutOfRangeError(KafkaError):
    """A fetch position is outside the log and `auto.offset.reset` is `none`."""

    code = ErrorCode.OFFSET_OUT_OF_RANGE

    def __init__(self, positions: dict) -> None:
        super().__init__(f"fetch positions out of range and auto.offset.reset=none: {positions}")
        self.positions = positions


class NoOffsetForPartitionError(KafkaError):
    """A partition has no position and `auto.offset.reset` is `none`."""


class IllegalStateError(KafkaError):
    """The client is closed, or the call does not fit its state (for example fetching unassigned)."""


class ConfigError(KafkaError, ValueError):
    """An unknown configuration key or an invalid value."""


class TransactionError(KafkaError):
    """A transactional producer's error. `fatal`: the producer can do nothing more (close it; a new one
    with the same transactional.id fences this one). `abortable`: abort the transaction, then go on.
    Kafka's clients classify them so (Java's TransactionManager; librdkafka's txn_requires_abort)."""

    fatal = False
    abortable = False

    def __init__(self, message: str = "", code: ErrorCode | int | None = None, *, fatal: bool | None = None,
                 abortable: bool | None = None) -> None:
        super().__init__(message, code)
        if fatal is not None:
            self.fatal = fatal
        if abortable is not None:
            self.abortable = abortable
        self.retriable = False


class ProducerFencedError(TransactionError):
    """A newer producer with the same transactional.id (a higher epoch) exists: this one is a zombie.
    Fatal (KIP-588: the coordinator's PRODUCER_FENCED, and INVALID_PRODUCER_EPOCH from it)."""

    fatal = True

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "producer fenced: a newer producer with the same transactional.id exists",
                         ErrorCode.PRODUCER_FENCED)


class InvalidProducerEpochError(TransactionError):
    """A partition leader refused a write for its old epoch (for example the coordinator aborted the
    transaction on its timeout and bumped the epoch). Abortable, as KIP-588 makes it."""

    abortable = True

    def __init__(self, message: str = "") -> None:
        super().__init__(message, ErrorCode.INVALID_PRODUCER_EPOCH)


class TransactionAbortableError(TransactionError):
    """The transaction cannot commit: abort it (`abort_transaction`) and begin a new one. The cause is
    chained (`__cause__`) and its code, when it has one, is `code`."""

    abortable = True


class TransactionAbortedError(KafkaError):
    """A record was not sent because its transaction was aborted first."""
