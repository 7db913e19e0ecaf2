"""etcd's and gRPC's errors as metactl's: unreachable, no quorum or no answer is
`StoreUnavailableError` (retriable), a request over etcd's ``--max-request-bytes``
`InvalidRequestError`, anything else `StorageError` (`mapped`); and whether a retriable
failure came from a member that answered (`answered_busy`: worth asking it again).

Pure functions of an exception: no calls, no retries (`metadata_log.etcd.hedging` decides
those).
"""

from __future__ import annotations

import grpc
import grpc.aio

from metactl.errors import InvalidRequestError, MetactlError, StorageError, StoreUnavailableError


def cause(exc: BaseException) -> str:
    """The gist of a failed call: gRPC's last connection error, without its wrapping
    (e.g. "Connection refused")."""
    detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    detail = " ".join((detail or type(exc).__name__).split())
    _, found, last = detail.rpartition("last error: ")
    if not found:
        return detail
    while last.endswith(")") and last.count(")") > last.count("("):
        last = last[:-1]
    return last.rsplit(": ", 1)[-1] or detail


def answered_busy(error: MetactlError) -> bool:
    """Whether a retriable failure came from a member that answered (etcd's own words:
    no leader, leader changed, request timed out, too many requests, a proposal dropped
    during an election), not from one that could not be reached."""
    return "etcdserver:" in error.message or "proposal dropped" in error.message


def mapped(exc: BaseException, what: str, where: str) -> MetactlError:
    code = exc.code() if isinstance(exc, grpc.aio.AioRpcError) else None
    detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
    detail = detail or type(exc).__name__
    if code is grpc.StatusCode.INVALID_ARGUMENT and "too large" in detail:
        return InvalidRequestError(f"etcd refused {what}: {detail}")
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED and "too many requests" not in detail:
        return InvalidRequestError(f"etcd refused {what}: {detail}")
    # Retriable: no connection, no quorum or leader (a follower drops a proposal while
    # an election is under way), a member too far behind ("too many requests").
    if code in (
        None,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    ) or (
        code is grpc.StatusCode.UNKNOWN
        and any(w in detail for w in ("deadline", "timed out", "proposal dropped"))
    ):
        return StoreUnavailableError(f"etcd at {where} failed {what}: {detail}")
    return StorageError(f"etcd at {where} refused {what}: {code.name if code else ''} {detail}")
