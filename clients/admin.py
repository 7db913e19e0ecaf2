"""The operator's reads and writes that take several requests: every page of
DescribeCluster (`pages`, `next_request`: v2, each page within the client's frame limit)
and of ListPartitionReassignments (`ongoing`), each falling back to one v1 answer from a
controller older than paging; and reassignments sent in requests of `CHUNK` partitions
(`alter`); and the committed replicas of a set of topics (`current_replicas`).

A walk always ends: a page that makes no progress or goes back is INVALID_REQUEST (a
server bug). Used by `metactl describe`, `brokers`, `configs`, `reassign`, tests and
benchmarks; it asks only (printing is the commands'), and must not import the CLI (`ops`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import msgspec

from clients.controller import ask
from metactl.errors import (
    InvalidRequestError,
    MetactlError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)
from metadata_image.state import TopicPartition
from protocol.client import DEFAULT_TIMEOUT_S, RpcClient
from protocol.messages.admin import (
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    OngoingReassignment,
    Reassignment,
    ReassignmentResult,
)

__all__ = ["CHUNK", "alter", "current_replicas", "next_request", "ongoing", "pages"]

CHUNK: Final = 1000  # partitions per AlterPartitionReassignments request


async def pages(
    client: RpcClient, request: DescribeClusterRequest, *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> AsyncIterator[DescribeClusterResponse]:
    """Every page of `request` (v2), in order, each sized to the client's frame limit.
    Raises the controller's coded error, or InvalidRequestError if a page makes no
    progress or goes back (a server bug), so a walk always ends."""
    request = msgspec.structs.replace(request, v=2, max_bytes=client.max_frame_bytes)
    last_tp: tuple[str, int] | None = None
    last_broker: int | None = None
    while True:
        try:
            r = await ask(client, request, timeout_s)
        except UnsupportedVersionError:
            if request.cursor is not None or request.broker_cursor is not None:
                raise
            # A controller older than paging: one v1 answer (it may not fit a frame).
            v1 = DescribeClusterRequest(topic=request.topic)
            r = await ask(client, v1, timeout_s)
        if not isinstance(r, DescribeClusterResponse):
            raise InvalidRequestError(f"unexpected answer {type(r).__name__}")
        for p in r.partitions:
            if last_tp is not None and (p.topic, p.partition) <= last_tp:
                raise InvalidRequestError(f"the controller went back to {p.topic}-{p.partition}")
            last_tp = (p.topic, p.partition)
        for b in r.brokers:
            if last_broker is not None and b.broker_id <= last_broker:
                raise InvalidRequestError(f"the controller went back to broker {b.broker_id}")
            last_broker = b.broker_id
        yield r
        if r.next_cursor is None and r.next_broker_cursor is None:
            return
        if not r.partitions and not r.brokers:
            raise InvalidRequestError("the controller answered an empty page with a cursor")
        request = next_request(request, r)


def next_request(
    request: DescribeClusterRequest, r: DescribeClusterResponse
) -> DescribeClusterRequest:
    """The request for the page after `r`: each list from its cursor, and a list whose
    cursor is None is complete, so it is not asked for again (limit 0)."""
    return msgspec.structs.replace(
        request,
        cursor=r.next_cursor,
        broker_cursor=r.next_broker_cursor,
        partition_limit=0 if r.next_cursor is None else request.partition_limit,
        broker_limit=0 if r.next_broker_cursor is None else request.broker_limit,
    )


async def ongoing(
    client: RpcClient, topics: set[str] | None, timeout_s: float
) -> dict[TopicPartition, OngoingReassignment]:
    """Every partition being reassigned (of `topics`), page by page. Raises the
    controller's coded error, or InvalidRequestError if a page's cursor does not move on
    (a server bug), so the walk always ends."""
    request = ListPartitionReassignmentsRequest(
        v=2,
        topics=None if topics is None else sorted(topics),
        max_bytes=client.max_frame_bytes,
    )
    out: dict[TopicPartition, OngoingReassignment] = {}
    last: TopicPartition | None = None
    while True:
        try:
            r = await ask(client, request, timeout_s)
        except UnsupportedVersionError:
            if request.cursor is not None:
                raise
            # A controller older than paging: one v1 answer (it may not fit a frame).
            request = msgspec.structs.replace(request, v=1, max_bytes=None)
            r = await ask(client, request, timeout_s)
        if not isinstance(r, ListPartitionReassignmentsResponse):
            raise MetactlError(f"unexpected answer {type(r).__name__} from {client.address}")
        for o in r.reassignments:
            out[(o.topic, o.partition)] = o
        if r.next_cursor is None or request.v < 2:
            return out
        cursor = (r.next_cursor.topic, r.next_cursor.partition)
        if last is not None and cursor <= last:
            raise InvalidRequestError(f"the controller's list went back to {cursor[0]}-{cursor[1]}")
        last = cursor
        request = msgspec.structs.replace(request, cursor=r.next_cursor)


async def alter(
    client: RpcClient, reassignments: list[Reassignment], timeout_s: float
) -> list[ReassignmentResult]:
    results: list[ReassignmentResult] = []
    for start in range(0, len(reassignments), CHUNK):
        body = AlterPartitionReassignments(reassignments=reassignments[start : start + CHUNK])
        r = await ask(client, body, timeout_s)
        if not isinstance(r, AlterPartitionReassignmentsResponse):
            raise MetactlError(f"unexpected answer {type(r).__name__} from {client.address}")
        results.extend(r.results)
    return results


async def current_replicas(
    client: RpcClient, topics: set[str], timeout_s: float
) -> dict[TopicPartition, list[int]]:
    """The committed replicas of every partition of `topics` (a topic that does not
    exist has none)."""
    out: dict[TopicPartition, list[int]] = {}
    for topic in sorted(topics):
        request = DescribeClusterRequest(topic=topic, broker_limit=0)
        try:
            async for page in pages(client, request, timeout_s=timeout_s):
                for p in page.partitions:
                    out[(p.topic, p.partition)] = list(p.replicas)
        except UnknownTopicOrPartitionError:
            continue
    return out
