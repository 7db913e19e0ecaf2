"""metactl's errors as Kafka's numeric error codes (pure).

metactl's codes are Kafka's names (`metactl.errors`), so the number is kio's `ErrorCode`
member of that name; a code Kafka does not have is UNKNOWN_SERVER_ERROR, its message
kept for the fields that carry one.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from metactl.errors import MetactlError


def kafka_code(error: MetactlError | str) -> ErrorCode:
    """Kafka's error code for a metactl error (or code name)."""
    name = error if isinstance(error, str) else error.code
    try:
        return ErrorCode[name.lower()]
    except KeyError:
        return ErrorCode.unknown_server_error
