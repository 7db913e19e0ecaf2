"""The one error root of metactl and its coded subclasses.

Every error that crosses a module boundary is a `MetactlError` with a stable `code`
(Kafka's name where Kafka has one) and a `retriable` flag, so the wire protocol, the
CLI and the tests can all match on the code rather than on message text.
This module must not import anything from the rest of the project.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar


class MetactlError(Exception):
    """Root of every error metactl raises on purpose.

    `code` and `retriable` are set per class; an error rebuilt from an unknown wire code
    (`error_for_code`) carries the received code and flag on the instance instead.
    """

    code: str = "UNKNOWN_SERVER_ERROR"
    retriable: bool = False

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


class UnknownLeaderEpochError(MetactlError):
    """A request named a leader epoch newer than the one the receiver knows: the receiver
    has not caught up with that metadata yet (Kafka 74). Retriable: it catches up."""

    code = "UNKNOWN_LEADER_EPOCH"
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


class NoReassignmentInProgressError(MetactlError):
    """A cancel named a partition that is not being reassigned (KIP-455)."""

    code = "NO_REASSIGNMENT_IN_PROGRESS"


class InconsistentTopicIdError(MetactlError):
    """A replica fetch named another topic id than the leader's replica has: one side has
    not yet applied a delete and re-create of the topic (KIP-516). Retriable: the
    metadata catches up."""

    code = "INCONSISTENT_TOPIC_ID"
    retriable = True


class TopicAlreadyExistsError(MetactlError):
    code = "TOPIC_ALREADY_EXISTS"


class InvalidReplicationFactorError(MetactlError):
    code = "INVALID_REPLICATION_FACTOR"


class InvalidReplicaAssignmentError(MetactlError):
    code = "INVALID_REPLICA_ASSIGNMENT"


class InvalidRequestError(MetactlError):
    code = "INVALID_REQUEST"


class InvalidTopicError(InvalidRequestError):
    """Kafka's INVALID_TOPIC_EXCEPTION: a topic name that is not 1-249 characters of
    [a-zA-Z0-9._-], or is `.` or `..`."""

    code = "INVALID_TOPIC_EXCEPTION"


class InvalidPartitionsError(InvalidRequestError):
    """Kafka's INVALID_PARTITIONS: a partition count outside 1 .. 2^31-1."""

    code = "INVALID_PARTITIONS"


class UnsupportedVersionError(MetactlError):
    """A message arrived at a version (`v`) its receiver does not support."""

    code = "UNSUPPORTED_VERSION"

    def __init__(self, message: str = "", *, correlation_id: int = 0) -> None:
        super().__init__(message)
        self.correlation_id = correlation_id  # of the refused frame, so it can be answered


# --- data plane: Produce (Kafka's names; its numeric code in each docstring) ------------


class NotEnoughReplicasError(MetactlError):
    """Kafka error 19: an acks=all batch refused at append, the ISR being below MinISR."""

    code = "NOT_ENOUGH_REPLICAS"
    retriable = True


class NotEnoughReplicasAfterAppendError(MetactlError):
    """Kafka error 20: an acks=all batch was appended, then the ISR shrank below MinISR
    before the high watermark covered it. It may still commit later; it was not
    acknowledged."""

    code = "NOT_ENOUGH_REPLICAS_AFTER_APPEND"
    retriable = True


class RequestTimedOutError(MetactlError):
    """Kafka error 7: an acks=all batch was not committed within the request's timeout.
    It may still commit later; it was not acknowledged."""

    code = "REQUEST_TIMED_OUT"
    retriable = True


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


class LogDirNotFoundError(LogError):
    """No metadata log where a command was told to look (Kafka 57, LOG_DIR_NOT_FOUND);
    the message names every place tried."""

    code = "LOG_DIR_NOT_FOUND"


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


class FatalStorageError(StorageError):
    """A commit failed in a way whose outcome is unknown; the store takes no more writes.

    Reopening the log re-reads what is really on disk.
    """

    code = "FATAL_STORAGE_ERROR"


class StoreUnavailableError(StorageError):
    """The metadata store cannot be reached or has no quorum (etcd: every endpoint down,
    or fewer than a majority of its members up). Nothing was acknowledged; retry once it
    is back."""

    code = "METADATA_STORE_UNAVAILABLE"


class WriterFencedError(FatalStorageError):
    """An append was refused because this writer no longer holds the log's leadership
    key (another controller won the election): the equivalent of a stale Raft term. The
    store takes no more writes; the controller steps down."""

    code = "CONTROLLER_FENCED"


class InconsistentClusterIdError(LogError):
    """The log belongs to another cluster than the one configured (Kafka 104)."""

    code = "INCONSISTENT_CLUSTER_ID"


class StorageIdentityError(LogError):
    """A data directory's identity file (``meta.properties``, as Kafka's) cannot be used:
    unreadable, of a version this metactl does not read, or of another kind of process
    (a broker's directory given to a controller). Its subclasses name the other refusals
    of `metactl storage` and of a process's start-up (docs/operations.md)."""

    code = "INVALID_STORAGE_IDENTITY"


class StorageNotFormattedError(StorageIdentityError):
    """The directory has no identity and holds something that cannot be adopted (an
    empty log file): run `metactl storage format`."""

    code = "STORAGE_NOT_FORMATTED"


class StorageAlreadyFormattedError(StorageIdentityError):
    """`metactl storage format` on a formatted directory, without --ignore-formatted."""

    code = "STORAGE_ALREADY_FORMATTED"


class MetadataLogMissingError(StorageIdentityError):
    """The identity says the metadata log was created, but it is missing or empty (a
    deleted or truncated file, a wiped etcd prefix): starting would serve an empty cluster
    over lost metadata."""

    code = "METADATA_LOG_MISSING"


class ReplicaDataMissingError(StorageIdentityError):
    """A broker's replica directory is missing although its identity says it existed, or
    a replica file is empty although the last shutdown was clean: the broker would claim
    data it no longer has."""

    code = "REPLICA_DATA_MISSING"


class InconsistentNodeIdError(StorageIdentityError):
    """The directory belongs to another node (its identity records another node id)."""

    code = "INCONSISTENT_NODE_ID"


class RecordDecodeError(LogError):
    """A record's bytes do not decode to a known record type."""

    code = "INVALID_RECORD"


# --- controller quorum ------------------------------------------------------------------


class NotControllerError(MetactlError):
    """This controller is a standby (or just lost its leadership): it answers reads, not
    writes. `leader` names the active controller's address when it is known (the
    client's next try), as Kafka's NOT_CONTROLLER (41) sends the client to the quorum's
    leader."""

    code = "NOT_CONTROLLER"
    retriable = True

    def __init__(self, message: str = "", leader: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader


class VoterNotFoundError(MetactlError):
    """`metactl quorum remove` named a controller that is not recorded in etcd under the
    log's prefix (Kafka's VOTER_NOT_FOUND, which remove-controller answers for a node
    that is not a voter)."""

    code = "VOTER_NOT_FOUND"


class ControllerInUseError(MetactlError):
    """`metactl quorum remove` was asked to forget a controller that looks alive: it
    recorded itself in etcd recently (`--force` removes its record anyway), or recorded
    itself again while being removed. metactl's code."""

    code = "CONTROLLER_IN_USE"


class ControllerIsActiveError(ControllerInUseError):
    """`metactl quorum remove` named the active controller (it holds the leadership
    key): refused even with `--force`. metactl's code."""

    code = "CONTROLLER_IS_ACTIVE"


# --- image, brokers, scenarios ------------------------------------------------------------


class ReplayError(MetactlError):
    """A record cannot be applied to the image it follows."""

    code = "METADATA_REPLAY_ERROR"


class MetadataGapError(MetactlError):
    """A broker's metadata fetch skipped records: it must refetch from its own end."""

    code = "METADATA_GAP"


class ScenarioError(MetactlError):
    """The scenario file is invalid; the message names the step and field."""

    code = "INVALID_SCENARIO"


class SparkJobFailedError(MetactlError):
    """An audit's Spark job failed with an error that is not metactl's (the message is
    Spark's first telling line)."""

    code = "SPARK_JOB_FAILED"


class JavaNotFoundError(MetactlError):
    """An audit needs a Java runtime (Spark's driver is a JVM) and none is installed: the
    message names the one command that installs it (`make system`)."""

    code = "JAVA_NOT_FOUND"


class PySparkNotFoundError(MetactlError):
    """An audit needs PySpark, an optional part of metactl that is not installed: the
    message names how to install it (`make audit`, or the ``audit`` extra)."""

    code = "PYSPARK_NOT_FOUND"


# --- wire protocol ------------------------------------------------------------------------


class FrameTooLargeError(InvalidRequestError):
    """A frame's length exceeds the receiver's limit; the stream cannot be resynchronised."""

    code = "MESSAGE_TOO_LARGE"


# Kafka error 10 (MESSAGE_TOO_LARGE) for a Produce batch over the broker's record limit:
# the same code, hence the same class, as an oversized frame.
MessageTooLargeError = FrameTooLargeError


class ClusterStartError(MetactlError):
    """`metactl cluster up` could not start a child (it exited, or was not ready in
    time); the message names it and ends with the last lines of its log."""

    code = "CLUSTER_START_FAILED"


class ListenError(MetactlError):
    """A server could not listen where it was told (the port is in use, the address is
    not this host's): start-up fails."""

    code = "LISTEN_FAILED"


class NetworkError(MetactlError):
    """The peer could not be reached, or the connection broke mid-request. `refused`:
    the connection was refused (nothing listens at the address), the one network error
    that says the peer is down rather than that one exchange failed."""

    code = "NETWORK_EXCEPTION"
    retriable = True
    refused = False


# --- security and quotas (Kafka names) ---------------------------------------------------


class SslAuthenticationError(MetactlError):
    """The TLS handshake failed, or the peer's certificate does not name the expected
    principal. Kafka raises SslAuthenticationException on the client side without a wire
    code; this code is metactl's. Not retriable: retrying cannot fix a certificate."""

    code = "SSL_AUTHENTICATION_FAILED"


class ClusterAuthorizationFailedError(MetactlError):
    """The authenticated principal may not perform this cluster operation (Kafka 31)."""

    code = "CLUSTER_AUTHORIZATION_FAILED"


class TopicAuthorizationFailedError(MetactlError):
    """The authenticated principal may not perform this operation on a topic (Kafka 29)."""

    code = "TOPIC_AUTHORIZATION_FAILED"


class ThrottlingQuotaExceededError(MetactlError):
    """The principal's controller mutation quota is used up (Kafka 89, KIP-599). The
    message carries the time to wait; `retry_after_ms` holds it when raised locally."""

    code = "THROTTLING_QUOTA_EXCEEDED"
    retriable = True

    def __init__(self, message: str = "", retry_after_ms: int = 0) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class PolicyViolationError(MetactlError):
    """The request breaks a configured policy, e.g. the partitions-per-request cap
    (Kafka 44)."""

    code = "POLICY_VIOLATION"


ERRORS_BY_CODE: dict[str, type[MetactlError]] = {}


def _index(cls: type[MetactlError]) -> None:
    known = ERRORS_BY_CODE.setdefault(cls.code, cls)
    if known is not cls:
        raise TypeError(f"{cls.__name__} reuses the code {cls.code} of {known.__name__}")
    for sub in cls.__subclasses__():
        _index(sub)


_index(MetactlError)


def error_for_code(code: str, message: str, retriable: bool | None = None) -> MetactlError:
    """Rebuild an error received over the wire from its code.

    A known code gives its class. An unknown (newer) code, or one whose class needs local
    context to build, gives a plain `MetactlError` that keeps the code and the sender's
    `retriable` flag, so a retry decision still follows the sender.
    """
    cls = ERRORS_BY_CODE.get(code)
    if cls is not None:
        try:
            return cls(message)
        except TypeError:
            pass  # e.g. CorruptLogError needs a path
    err = MetactlError(message)
    err.code = code
    err.retriable = cls.retriable if cls is not None else bool(retriable)
    return err


# --- details: lines an error carries beside its one line ------------------------------

E = TypeVar("E", bound=BaseException)


def with_details(exc: E, lines: Iterable[str]) -> E:
    """`exc`, with lines that the CLI prints after its one error line (indented context,
    e.g. the end of a child's log: `cluster up`, `broker start`)."""
    exc.__dict__["details"] = tuple(lines)
    return exc


def details_of(exc: BaseException) -> tuple[str, ...]:
    details = exc.__dict__.get("details", ())
    return tuple(details) if isinstance(details, tuple | list) else ()


# --- Kafka record batches ----------------------------------------------------------------
# The refusals of a Produce request's records (protocol/kafka/records.py) and of an
# idempotent producer's batch (protocol/kafka/producer_state.py), Kafka's names and
# numbers. Two of their codes already have an owner, and a code has one class
# (tests/protocol/test_errors.py): a bad batch CRC raises `CorruptLogError`
# (CORRUPT_MESSAGE, Kafka 2; give it `path=` naming where the bytes came from) and a
# malformed batch or record `RecordDecodeError` (INVALID_RECORD, Kafka 87). The aliases
# below name them for this use, as `MessageTooLargeError` names `FrameTooLargeError`.

CorruptRecordError = CorruptLogError
InvalidRecordError = RecordDecodeError


class OutOfOrderSequenceError(MetactlError):
    """Kafka 45: an idempotent producer's batch does not follow its last one (a gap or a
    new epoch not starting at sequence 0). Not retriable as is: the producer resets."""

    code = "OUT_OF_ORDER_SEQUENCE_NUMBER"


class InvalidProducerEpochError(MetactlError):
    """Kafka 47: a batch carries an older producer epoch than the partition has seen
    (Kafka answers this, not PRODUCER_FENCED, to a Produce since 2.7)."""

    code = "INVALID_PRODUCER_EPOCH"


class UnsupportedCompressionTypeError(MetactlError):
    """Kafka 76: a batch's compression bits name no codec (5-7), or zstd in a Produce
    request older than v7."""

    code = "UNSUPPORTED_COMPRESSION_TYPE"


class UnsupportedForMessageFormatError(MetactlError):
    """Kafka 43: the batch needs what the partition's log cannot hold; here, a
    transactional batch (metactl does not implement transactions)."""

    code = "UNSUPPORTED_FOR_MESSAGE_FORMAT"


# Defined after the index was built: index them too (one code, one class, as above).
for _cls in (
    OutOfOrderSequenceError,
    InvalidProducerEpochError,
    UnsupportedCompressionTypeError,
    UnsupportedForMessageFormatError,
):
    _index(_cls)
del _cls
