"""Pure request checks: every field a request carries is in the range Kafka gives it.

Owns the bounds (broker ids 0 .. 2^31-1; int32 partitions, leader and partition epochs;
int64 broker epochs and offsets; topic names, endpoints, racks) and one `check_*`
function per request, raising a coded `MetactlError` that names the field. The handlers
(`controller.core.*_handlers`, `lifecycle`) call these before they read the image, so a
request that fails here produces no record, and nothing stored can hold a value `metactl
log export` (int32 and int64 Arrow columns) cannot represent, nor a broker id that
collides with the no-leader sentinel -1.

Only requests are checked: responses legitimately carry -1 (no leader, no epoch).
The checks live here rather than as msgspec `Meta` constraints on `protocol.messages`
because the scenario runner, the simulators and the tests build requests without
decoding them, because a decode failure is answered under correlation id 0 (which a
client cannot match to its request, and reports as a retriable network error), and
because one bad topic of a CreateTopics request must fail alone (see docs/protocol.md,
"Validation").

Must not: read the image or the config beyond what a bound needs, do IO, or change any
state. Semantic checks (is the broker registered, is the epoch current) stay in the
handlers.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Final

from metactl.errors import (
    InvalidConfigurationError,
    InvalidPartitionsError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
)
from protocol.messages.admin import (
    AlterConfigs,
    AlterPartitionReassignments,
    ElectLeader,
    UpdateFeature,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    BrokerHeartbeatRequest,
    RegisterBroker,
)
from protocol.messages.internal import (
    ControlledShutdown,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)

INT16_MAX: Final = 2**15 - 1
INT32_MIN: Final = -(2**31)
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

MAX_BROKER_ID: Final = INT32_MAX
MAX_TOPIC_NAME_CHARS: Final = 249  # Kafka's Topic.MAX_NAME_LENGTH
MAX_ENDPOINT_CHARS: Final = 255
MAX_RACK_CHARS: Final = 255
MAX_INCARNATION_CHARS: Final = 255

_TOPIC_NAME: Final = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_HOST: Final = re.compile(r"[A-Za-z0-9._%:\[\]-]+")  # names, IPv4, IPv6 (with a zone)
_PORT: Final = re.compile(r"[0-9]{1,5}")


# --- bounds ---------------------------------------------------------------------------------


def _in_range(value: int, low: int, high: int, field: str) -> None:
    if not low <= value <= high:
        raise InvalidRequestError(f"{field} {value} is outside {low}..{high}")


def broker_id(value: int, field: str = "broker_id") -> None:
    """A broker id: 0 .. 2^31-1 (-1 is the no-leader sentinel, never a broker)."""
    _in_range(value, 0, MAX_BROKER_ID, field)


def int32(value: int, field: str) -> None:
    _in_range(value, INT32_MIN, INT32_MAX, field)


def int64(value: int, field: str) -> None:
    _in_range(value, INT64_MIN, INT64_MAX, field)


def _text(value: str, limit: int, field: str) -> None:
    if len(value) > limit:
        raise InvalidRequestError(f"{field} is {len(value)} characters; the limit is {limit}")
    if not value.isprintable():
        raise InvalidRequestError(f"{field} {value!r} holds a non-printable character")


def endpoint(value: str) -> None:
    """`""` (none) or HOST:PORT, port 1..65535, at most `MAX_ENDPOINT_CHARS` characters."""
    if value == "":
        return
    _text(value, MAX_ENDPOINT_CHARS, "endpoint")
    host, sep, port = value.rpartition(":")
    if not (sep and _HOST.fullmatch(host) and _PORT.fullmatch(port) and 1 <= int(port) <= 65535):
        raise InvalidRequestError(f"endpoint {value!r} is not HOST:PORT with a port in 1..65535")


# --- requests -------------------------------------------------------------------------------


def check_register_broker(req: RegisterBroker) -> None:
    broker_id(req.broker_id)
    _text(req.incarnation_id, MAX_INCARNATION_CHARS, "incarnation_id")
    if req.previous_epoch is not None:
        int64(req.previous_epoch, "previous_broker_epoch")
    endpoint(req.endpoint)
    endpoint(req.kafka_endpoint)
    if req.rack is not None:
        _text(req.rack, MAX_RACK_CHARS, "rack")


def check_heartbeat(req: BrokerHeartbeatRequest) -> None:
    broker_id(req.broker_id)
    int64(req.broker_epoch, "broker_epoch")
    int64(req.metadata_offset, "metadata_offset")


def check_fence_broker(req: FenceBroker) -> None:
    broker_id(req.broker_id)


def check_broker_epoch(req: UnfenceBroker | ControlledShutdown) -> None:
    broker_id(req.broker_id)
    int64(req.broker_epoch, "broker_epoch")


def check_alter_partition(req: AlterPartition) -> None:
    int32(req.partition, "partition")
    broker_id(req.leader, "leader")
    int64(req.broker_epoch, "broker_epoch")
    int32(req.partition_epoch, "partition_epoch")
    if req.leader_epoch is not None:
        int32(req.leader_epoch, "leader_epoch")
    seen: set[int] = set()
    for m in req.isr:
        broker_id(m.broker_id, "isr broker_id")
        int64(m.broker_epoch, "isr broker_epoch")
        # Kafka refuses a new ISR that names a replica twice (INVALID_REQUEST), rather
        # than de-duplicating it: the sender is broken. Stops at the first repeat.
        if m.broker_id in seen:
            raise InvalidRequestError(f"isr lists broker {m.broker_id} more than once")
        seen.add(m.broker_id)


def check_elect_leader(req: ElectLeader) -> None:
    int32(req.partition, "partition")
    if req.replica is not None:
        broker_id(req.replica, "replica")


def check_replica_log_info(req: ReplicaLogInfo) -> None:
    broker_id(req.broker_id)
    int64(req.broker_epoch, "broker_epoch")
    int32(req.partition, "partition")
    int32(req.last_leader_epoch, "last_leader_epoch")
    int64(req.log_end_offset, "log_end_offset")


# --- CreateTopic, in the handler's order (each with Kafka's error code) --------------------


def check_topic_name(name: str) -> None:
    """Kafka's rule: 1-249 characters of [a-zA-Z0-9._-], and not `.` or `..`."""
    if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        shown = repr(name) if len(name) <= 2 * MAX_TOPIC_NAME_CHARS else f"of {len(name)} chars"
        raise InvalidTopicError(
            f"invalid topic name {shown}: a name is 1-{MAX_TOPIC_NAME_CHARS} characters of "
            "[a-zA-Z0-9._-], and not '.' or '..'"
        )


def check_min_isr(min_isr: int) -> None:
    if not 1 <= min_isr <= INT32_MAX:
        raise InvalidConfigurationError(
            f"min.insync.replicas must be within 1..{INT32_MAX}, got {min_isr}"
        )


def check_partition_count(partitions: int) -> None:
    if not 1 <= partitions <= INT32_MAX:
        raise InvalidPartitionsError(f"partitions must be within 1..{INT32_MAX}, got {partitions}")


def check_replication_factor(rf: int, active: int) -> None:
    """1 .. the number of active brokers (and Kafka's int16 bound)."""
    if not 1 <= rf <= min(active, INT16_MAX):
        raise InvalidReplicationFactorError(
            f"replication factor {rf} is not within 1..{min(active, INT16_MAX)} (active brokers)"
        )


def check_assignment_ids(assignments: Sequence[Sequence[int]]) -> None:
    """Every replica is a valid broker id. (The count needs no bound: 2^31 partitions
    cannot fit in a frame.)"""
    for i, a in enumerate(assignments):
        bad = [r for r in a if not 0 <= r <= MAX_BROKER_ID]
        if bad:
            raise InvalidReplicaAssignmentError(
                f"partition {i}: broker id(s) {bad} outside 0..{MAX_BROKER_ID}"
            )


# --- the lifecycle requests ---------------------------------------------------------------

MAX_CONFIG_CHARS: Final = 255


def check_topic_id(topic_id: str) -> None:
    """A topic id is a UUID other than the nil one (Kafka's ZERO_UUID means "none")."""
    try:
        parsed = uuid.UUID(topic_id)
    except (ValueError, TypeError, AttributeError):
        raise InvalidRequestError(f"topic id {topic_id[:64]!r} is not a UUID") from None
    if parsed.int == 0:
        raise InvalidRequestError("the nil UUID is not a topic id")


def check_alter_configs(req: AlterConfigs) -> None:
    if req.resource_type not in ("topic", "broker"):
        raise InvalidRequestError(
            f"resource type {req.resource_type[:32]!r} is not 'topic' or 'broker'"
        )
    if req.resource_type == "topic":
        check_topic_name(req.resource_name)
    else:
        _text(req.resource_name, MAX_CONFIG_CHARS, "resource_name")
    for name, value in req.set_configs.items():
        _text(name, MAX_CONFIG_CHARS, "config name")
        _text(value, MAX_CONFIG_CHARS, f"value of {name[:32]}")
    for name in req.delete_configs:
        _text(name, MAX_CONFIG_CHARS, "config name")


def check_update_feature(req: UpdateFeature) -> None:
    _text(req.name, MAX_CONFIG_CHARS, "feature")
    _in_range(req.level, 0, INT16_MAX, "feature level")


def check_reassignments(req: AlterPartitionReassignments) -> None:
    """Bounds only: each partition's own checks (known partition, registered brokers)
    fail it alone, as Kafka's per-partition errors do."""
    if not req.reassignments:
        raise InvalidRequestError("no partitions to reassign")
    seen: set[tuple[str, int]] = set()
    for r in req.reassignments:
        check_topic_name(r.topic)
        int32(r.partition, "partition")
        if (r.topic, r.partition) in seen:
            raise InvalidRequestError(f"{r.topic}-{r.partition} is named twice")
        seen.add((r.topic, r.partition))
        if r.replicas is not None:
            if len(r.replicas) > INT16_MAX:
                raise InvalidReplicaAssignmentError(
                    f"{r.topic}-{r.partition}: {len(r.replicas)} replicas"
                )
            for b in r.replicas:
                broker_id(b, "replica")
