"""The plumbing Kafka's admin APIs share (pure: no IO): the versions served (by a broker,
and by a controller's Kafka listener), Kafka's error code and message for a metactl error
or a native result's code, a refusal's throttle, and the one native call (`ask`) with the
answer type it expects.

It must not translate any one API (`topics`, `configs`, `replicas`, `cluster` do) or do
IO (`Call` is the caller's).
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable, Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

from metactl.errors import (
    InvalidRequestError,
    MetactlError,
    ThrottlingQuotaExceededError,
)
from protocol.kafka import framing as k
from protocol.kafka.framing import Served
from protocol.kafka.metadata import NO_THROTTLE
from protocol.messages.unions import Message

Call = Callable[[Message], Awaitable[Message]]

# The admin APIs a broker serves (all forwarded to the controller but DescribeCluster,
# answered from the broker's image as Kafka's brokers answer it).
ADMIN_SERVED: Final[Served] = {
    k.CREATE_TOPICS: (2, 7),
    k.DELETE_TOPICS: (1, 6),
    k.CREATE_PARTITIONS: (0, 3),
    k.DESCRIBE_CONFIGS: (1, 4),
    k.INCREMENTAL_ALTER_CONFIGS: (0, 1),
    k.ELECT_LEADERS: (0, 2),
    k.ALTER_PARTITION_REASSIGNMENTS: (0, 1),
    k.LIST_PARTITION_REASSIGNMENTS: (0, 0),
    k.UPDATE_FEATURES: (0, 2),
    k.DESCRIBE_CLUSTER: (0, 2),
}
FORWARDED: Final = frozenset(ADMIN_SERVED) - {k.DESCRIBE_CLUSTER}

# The controller's Kafka listener (KIP-919): ApiVersions, the admin APIs, DescribeQuorum.
CONTROLLER_SERVED: Final[Served] = {
    k.API_VERSIONS: (0, 3),
    **ADMIN_SERVED,
    k.DESCRIBE_QUORUM: (0, 2),
}

# Kafka's ConfigSource numbers.
CONFIG_SOURCES: Final = {
    "DYNAMIC_TOPIC_CONFIG": 1,
    "DYNAMIC_BROKER_CONFIG": 2,
    "DYNAMIC_DEFAULT_BROKER_CONFIG": 3,
    "STATIC_BROKER_CONFIG": 4,
    "DEFAULT_CONFIG": 5,
}
MIN_ISR: Final = "min.insync.replicas"


# metactl's codes Kafka has no number for, as a Kafka client should take them: a log
# that cannot be written now is a controller moving (retried), a recovery policy unknown
# a bad config.
_NOT_KAFKA: Final = {
    "LOG_CLOSED": ErrorCode.not_controller,
    "FATAL_STORAGE_ERROR": ErrorCode.not_controller,
    "CONTROLLER_FENCED": ErrorCode.not_controller,
    "METADATA_STORE_UNAVAILABLE": ErrorCode.not_controller,
    "UNKNOWN_RECOVERY_POLICY": ErrorCode.invalid_config,
    "SSL_AUTHENTICATION_FAILED": ErrorCode.network_exception,
}


def error_code(exc: MetactlError | str | None) -> ErrorCode:
    """Kafka's code for a metactl error (or its code): the same name, or the nearest."""
    if exc is None:
        return ErrorCode.none
    code = exc if isinstance(exc, str) else exc.code
    try:
        return ErrorCode[code.lower()]
    except KeyError:
        return _NOT_KAFKA.get(code, ErrorCode.unknown_server_error)


def error_message(exc: MetactlError | None) -> str | None:
    return None if exc is None else exc.message


def throttle_for(exc: MetactlError | None) -> datetime.timedelta:
    if isinstance(exc, ThrottlingQuotaExceededError) and exc.retry_after_ms > 0:
        return datetime.timedelta(milliseconds=exc.retry_after_ms)
    return NO_THROTTLE


async def ask(call: Call, body: Message, expect: type[Any]) -> Any:
    answer = await call(body)
    if not isinstance(answer, expect):
        raise InvalidRequestError(
            f"unexpected answer {type(answer).__name__} to {body.__class__.__name__}"
        )
    return answer


def coded(code: str | None, message: str) -> MetactlError:
    """A native result's error code and message as an error (for `error_code`)."""
    err = MetactlError(message)
    err.code = code or "UNKNOWN_SERVER_ERROR"
    return err
