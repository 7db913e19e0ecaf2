"""The one error root of metactl and its coded subclasses.

Every error that crosses a module boundary is a `MetactlError` with a stable `code`
(Kafka's name where Kafka has one) and a `retriable` flag, so the wire protocol, the
CLI and the tests can all match on the code rather than on message text.
This module must not import anything from the rest of the project.
"""

from __future__ import annotations

from typing import ClassVar


class MetactlError(Exception):
    """Root of every error metactl raises on purpose."""

    code: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code)
        self.message = message or self.code

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


# --- controller request errors (Kafka names) -------------------------------------------


class NotLeaderOrFollowerError(MetactlError):
    code = "NOT_LEADER_OR_FOLLOWER"
    retriable = True


class StaleBrokerEpochError(MetactlError):
    code = "STALE_BROKER_EPOCH"


class InvalidUpdateVersionError(MetactlError):
    code = "INVALID_UPDATE_VERSION"
    retriable = True


class FencedLeaderEpochError(MetactlError):
    code = "FENCED_LEADER_EPOCH"
    retriable = True


class IneligibleReplicaError(MetactlError):
    code = "INELIGIBLE_REPLICA"


class DuplicateBrokerRegistrationError(MetactlError):
    code = "DUPLICATE_BROKER_REGISTRATION"
    retriable = True


class BrokerIdNotRegisteredError(MetactlError):
    code = "BROKER_ID_NOT_REGISTERED"


class ElectionNotNeededError(MetactlError):
    code = "ELECTION_NOT_NEEDED"


class EligibleLeadersNotAvailableError(MetactlError):
    code = "ELIGIBLE_LEADERS_NOT_AVAILABLE"
    retriable = True


class PreferredLeaderNotAvailableError(MetactlError):
    code = "PREFERRED_LEADER_NOT_AVAILABLE"
    retriable = True


class UnknownTopicOrPartitionError(MetactlError):
    code = "UNKNOWN_TOPIC_OR_PARTITION"


class TopicAlreadyExistsError(MetactlError):
    code = "TOPIC_ALREADY_EXISTS"


class InvalidReplicationFactorError(MetactlError):
    code = "INVALID_REPLICATION_FACTOR"


class InvalidReplicaAssignmentError(MetactlError):
    code = "INVALID_REPLICA_ASSIGNMENT"


class InvalidRequestError(MetactlError):
    code = "INVALID_REQUEST"


class InvalidConfigurationError(MetactlError):
    code = "INVALID_CONFIG"


class UnknownRecoveryPolicyError(MetactlError):
    code = "UNKNOWN_RECOVERY_POLICY"


# --- metadata log errors ----------------------------------------------------------------


class LogError(MetactlError):
    """Base of the durable log's errors."""

    code = "LOG_ERROR"


class CorruptLogError(LogError):
    """A log file failed a check: bad CRC, broken offset continuity, malformed SQLite pages.

    Carries the file and, where known, the first bad offset.
    """

    code = "CORRUPT_MESSAGE"

    def __init__(self, message: str, *, path: str, offset: int | None = None) -> None:
        where = f"{path}" + (f" at offset {offset}" if offset is not None else "")
        super().__init__(f"{message} ({where})")
        self.path = path
        self.offset = offset


class LogSchemaError(LogError):
    """The file is not a metactl log, or was written by an unsupported schema version."""

    code = "UNSUPPORTED_LOG_VERSION"


class OffsetOutOfRangeError(LogError):
    """A read asked for offsets the log no longer (or does not yet) hold."""

    code = "OFFSET_OUT_OF_RANGE"


class LogClosedError(LogError):
    code = "LOG_CLOSED"
    retriable = True


class StorageError(LogError):
    """The disk refused a write (full, read-only, I/O error). Nothing was acknowledged."""

    code = "KAFKA_STORAGE_ERROR"
    retriable = True


class RecordDecodeError(LogError):
    code = "CORRUPT_MESSAGE"


ERRORS_BY_CODE: dict[str, type[MetactlError]] = {}


def _index(cls: type[MetactlError]) -> None:
    ERRORS_BY_CODE.setdefault(cls.code, cls)
    for sub in cls.__subclasses__():
        _index(sub)


_index(MetactlError)


def error_for_code(code: str, message: str) -> MetactlError:
    """Rebuild an error received over the wire from its code."""
    cls = ERRORS_BY_CODE.get(code)
    if cls is None or cls is CorruptLogError:
        # An unknown (newer) code, or one whose class needs local context: keep the code.
        remote: type[MetactlError] = type(f"RemoteError_{code}", (MetactlError,), {"code": code})
        return remote(message)
    return cls(message)
