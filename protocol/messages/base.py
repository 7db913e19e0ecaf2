"""What every message is (`Msg`: a tagged, versioned msgspec Struct; the tag in field
`type`, the version in `v`) and the one answer any request may get instead of its own,
`ErrorResponse` (`error_response` makes it from a metactl error).

Data only: no IO, no rules.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from metactl.errors import MetactlError, NotControllerError, ThrottlingQuotaExceededError


class Msg(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    VERSIONS: ClassVar[frozenset[int]] = frozenset({1})  # what a receiver accepts
    v: int = 1


class ErrorResponse(Msg, tag="Error", frozen=True):
    code: str
    message: str = ""
    retriable: bool = False
    # THROTTLING_QUOTA_EXCEEDED: how long to wait before retrying (Kafka's throttle_time_ms).
    # Omitted when 0; an older receiver ignores it, so no new version.
    throttle_time_ms: int = 0
    # NOT_CONTROLLER: the active controller's address, when the standby knows it (the
    # client's next try). Omitted when unknown; an older receiver ignores it.
    leader: str | None = None


def error_response(exc: MetactlError) -> ErrorResponse:
    throttle = exc.retry_after_ms if isinstance(exc, ThrottlingQuotaExceededError) else 0
    leader = exc.leader if isinstance(exc, NotControllerError) else None
    return ErrorResponse(
        code=exc.code,
        message=exc.message,
        retriable=exc.retriable,
        throttle_time_ms=throttle,
        leader=leader,
    )
