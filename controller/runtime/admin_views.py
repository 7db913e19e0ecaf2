"""Read-only admin answers from a committed image: DescribeConfigs, DescribeFeatures and
ListPartitionReassignments (kafka-configs --describe, kafka-features describe,
kafka-reassign-partitions --list / --verify), and the maintenance pre-flight's plans
(PlanRestart, PlanRoll: `plan_answer`, which `planning` makes and this bounds).

Owns only the shaping of those answers, and ListPartitionReassignments' paging: partitions
in (topic name, partition) order, a page bounded by an item count, by the encoded size of
its frame and by how many partitions it may look at (`LIST_SCAN`), so that no answer
exceeds the frame limit and no page costs more than a bounded walk, however many
partitions are being reassigned. Must not decide anything (the core does), read an
uncommitted image (the service passes the committed one: nothing is shown before it is
durable), or do IO. The only state is a one-entry cache of the last image's sorted topic
names.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator, Mapping
from typing import Final

import msgspec

from controller.core.config import ControllerConfig
from controller.core.lifecycle import SUPPORTED_FEATURES
from controller.core.step import Rules
from metactl.errors import FrameTooLargeError, InvalidRequestError, UnknownTopicOrPartitionError
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from metadata_log.records import BROKER_RESOURCE, ELR_FEATURE, MIN_ISR_CONFIG, TOPIC_RESOURCE
from protocol.codec import Frame
from protocol.messages.admin import (
    ConfigEntry,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    DescribeCursor,
    DescribeFeaturesResponse,
    FeatureLevel,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    OngoingReassignment,
)
from protocol.messages.plan import (
    MAX_PLAN_LIST_ITEMS,
    PLAN_LIST_ITEMS,
    PlanRestartRequest,
    PlanRestartResponse,
    PlanRollRequest,
    PlanRollResponse,
)

LIST_PAGE_ITEMS: Final = 2000
"""Partitions per ListPartitionReassignments page, and the most a v2 request may ask for
(DescribeCluster's page size: about 160 KB of answer at RF 3)."""
LIST_SCAN: Final = 50_000
"""Partitions one page may look at (about 5-10 ms of membership checks) when many are
being reassigned: the page then ends where the walk stopped, with fewer items, or none."""
_SORT_BELOW: Final = 4000
"""Fewer partitions being reassigned than this are sorted outright (O(n log n) of them)
instead of walking the topics' partitions."""
_encoder: Final = msgspec.msgpack.Encoder()
_MAX_CORRELATION_ID: Final = 2**64 - 1


def describe_configs(
    image: ClusterImage, req: DescribeConfigsRequest, config: ControllerConfig
) -> DescribeConfigsResponse:
    """min.insync.replicas of a topic (its own, else the cluster default it inherits) or
    of the cluster default, with where the value comes from, as Kafka names sources."""
    # The cluster default: the dynamic one, else the controller's static setting.
    cluster = image.cluster_configs.get(MIN_ISR_CONFIG)
    if cluster is not None:
        value, source = cluster, "DYNAMIC_DEFAULT_BROKER_CONFIG"
    else:
        value, source = str(config.default_min_insync_replicas), "STATIC_BROKER_CONFIG"
    if req.resource_type == TOPIC_RESOURCE:
        t = image.topics.get(req.resource_name)
        if t is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {req.resource_name[:255]}")
        if t.min_isr is not None:  # the topic's own
            value, source = str(t.min_isr), "DYNAMIC_TOPIC_CONFIG"
    elif req.resource_type != BROKER_RESOURCE or req.resource_name != "":
        raise InvalidRequestError(
            "configs are kept for topics and for the cluster default (--entity-default) only"
        )
    entry = ConfigEntry(name=MIN_ISR_CONFIG, value=value, source=source)
    return DescribeConfigsResponse(
        resource_type=req.resource_type, resource_name=req.resource_name, configs=[entry]
    )


def describe_features(image: ClusterImage, config: ControllerConfig) -> DescribeFeaturesResponse:
    out = []
    for name, (low, high) in sorted(SUPPORTED_FEATURES.items()):
        finalized = image.features.get(name)
        effective = finalized
        if effective is None and name == ELR_FEATURE:
            effective = 1 if config.eligible_leader_replicas else 0
        out.append(
            FeatureLevel(
                name=name,
                min_version=low,
                max_version=high,
                finalized=finalized,
                effective=effective or 0,
            )
        )
    return DescribeFeaturesResponse(features=out)


def list_reassignments(
    image: ClusterImage, req: ListPartitionReassignmentsRequest, *, max_bytes: int
) -> ListPartitionReassignmentsResponse:
    """The partitions being reassigned (of `req.topics`, if given), in (topic, partition)
    order, in a frame payload of at most `max_bytes` (the smaller of the service's limit
    and the request's). v1: all of them, or MESSAGE_TOO_LARGE when they do not fit. v2:
    one page of at most `limit` partitions from `cursor` on, and the cursor of the next
    (None: done); a page looks at no more than `LIST_SCAN` partitions, so it may hold
    fewer than asked, even none, and still name a next page."""
    paged = req.v >= 2
    limit: int | None = None
    start: TopicPartition | None = None
    if paged:
        if req.max_bytes is not None:
            if req.max_bytes < 1:
                raise InvalidRequestError(
                    f"ListPartitionReassignments max_bytes must not be {req.max_bytes}"
                )
            max_bytes = min(max_bytes, req.max_bytes)
        if req.limit is not None and req.limit < 1:
            raise InvalidRequestError(f"ListPartitionReassignments limit must not be {req.limit}")
        limit = LIST_PAGE_ITEMS if req.limit is None else min(req.limit, LIST_PAGE_ITEMS)
        if req.cursor is not None:
            if req.cursor.partition < 0:
                raise InvalidRequestError(
                    "ListPartitionReassignments cursor.partition must not be "
                    f"{req.cursor.partition}"
                )
            start = (req.cursor.topic, req.cursor.partition)
    walk = _Walk(image, req.topics, start, LIST_SCAN if paged else None)
    # What the items may take: the frame less a generous envelope (the longest cursor);
    # the real envelope is measured at the end.
    room = max_bytes - _envelope_bytes(req.v, ("t" * 249, 2**31))
    used = 0
    out: list[OngoingReassignment] = []
    sizes: list[int] = []
    keys: list[TopicPartition] = []
    next_key: TopicPartition | None = None
    for tp in walk:
        if limit is not None and len(out) >= limit:
            next_key = tp
            break
        item = _ongoing(image, tp)
        size = len(_encoder.encode(item))
        if used + size > room:
            next_key = tp
            break
        used += size
        out.append(item)
        sizes.append(size)
        keys.append(tp)
    else:
        next_key = walk.resume  # None: the walk reached the end
    if next_key is not None and not paged:
        raise FrameTooLargeError(
            f"the partitions being reassigned ({len(image.reassigning):,} in all) exceed the "
            f"{max_bytes:,}-byte frame limit: ListPartitionReassignments v2 pages them "
            "(metactl reassign --list does)"
        )
    while out and _envelope_bytes(req.v, next_key) + used > max_bytes:
        out.pop()
        next_key = keys.pop()
        used -= sizes.pop()
    if not out and next_key is not None and next_key != walk.resume:
        raise FrameTooLargeError(
            f"the next partition of the answer exceeds the {max_bytes:,}-byte frame limit "
            "on its own"
        )
    cursor = None
    if next_key is not None:
        cursor = DescribeCursor(topic=next_key[0], partition=next_key[1])
    return ListPartitionReassignmentsResponse(v=req.v, reassignments=out, next_cursor=cursor)


class _Walk:
    """The partitions being reassigned, of `topics` if set, in (topic, partition) order
    from `start` (inclusive; it need not exist). Few are sorted outright; many are found
    by walking the topics' partitions, looking at no more than `scan` of them (None: no
    limit): `resume` is then where the walk stopped (None: it reached the end)."""

    def __init__(
        self,
        image: ClusterImage,
        topics: list[str] | None,
        start: TopicPartition | None,
        scan: int | None,
    ) -> None:
        self.image = image
        self.topics = None if topics is None else sorted(set(topics))
        self.start = start
        self.scan = scan
        self.resume: TopicPartition | None = None

    def __iter__(self) -> Iterator[TopicPartition]:
        image, start = self.image, self.start
        reassigning = image.reassigning
        if len(reassigning) < _SORT_BELOW:
            wanted = None if self.topics is None else frozenset(self.topics)
            yield from sorted(
                tp
                for tp in reassigning
                if (wanted is None or tp[0] in wanted) and (start is None or tp >= start)
            )
            return
        names = _topic_names(image.topics) if self.topics is None else self.topics
        first = 0 if start is None else bisect.bisect_left(names, start[0])
        scan = self.scan
        for name in itertools.islice(names, first, None):
            t = image.topics.get(name)
            if t is None:  # a topic asked for that does not exist: nothing of it
                continue
            i = start[1] if start is not None and start[0] == name else 0
            while i < t.partitions:
                if scan is not None and scan <= 0:
                    self.resume = (name, i)
                    return
                end = t.partitions if scan is None else min(t.partitions, i + scan)
                for j in range(i, end):
                    tp = (name, j)
                    if tp in reassigning:
                        yield tp
                if scan is not None:
                    scan -= end - i
                i = end


class _SortedNames:
    """The sorted keys of the last topic map asked about (image maps are replaced on
    change, so identity is the key): a walk of many pages sorts them once per change."""

    def __init__(self) -> None:
        self._map: Mapping[str, object] | None = None
        self._names: list[str] = []

    def __call__(self, m: Mapping[str, object]) -> list[str]:
        if m is not self._map:
            self._names = sorted(m.keys())
            self._map = m
        return self._names


_topic_names = _SortedNames()


def _ongoing(image: ClusterImage, tp: TopicPartition) -> OngoingReassignment:
    p = image.partitions[tp]
    return OngoingReassignment(
        topic=p.topic,
        partition=p.partition,
        replicas=list(p.replicas),
        adding_replicas=list(p.adding),
        removing_replicas=list(p.removing),
    )


def _envelope_bytes(v: int, next_key: TopicPartition | None) -> int:
    """An empty answer's frame with this cursor, and the growth of its list's header."""
    cursor = None if next_key is None else DescribeCursor(topic=next_key[0], partition=next_key[1])
    empty = ListPartitionReassignmentsResponse(v=v, reassignments=[], next_cursor=cursor)
    return len(_encoder.encode(Frame(_MAX_CORRELATION_ID, empty))) + 4


def plan_answer(
    image: ClusterImage,
    request: PlanRestartRequest | PlanRollRequest,
    *,
    rules: Rules,
    now_ms: int,
    max_bytes: int,
) -> PlanRestartResponse | PlanRollResponse:
    """A plan of `planning` from the committed `image` with the controller's `rules`:
    each list cut to the request's `limit` (default `PLAN_LIST_ITEMS`, at most
    `MAX_PLAN_LIST_ITEMS`), and MESSAGE_TOO_LARGE if it still outgrows `max_bytes` (a
    smaller limit fits). Seconds of CPU for a large cluster: the service runs it off the
    event loop (`controller.runtime.admin_apis`), on an image nobody changes."""
    # Imported when a plan is asked: the controller starts without the planner's modules.
    from planning.restart import plan_restart
    from planning.roll import plan_roll

    limit = PLAN_LIST_ITEMS if request.limit is None else request.limit
    if not 0 <= limit <= MAX_PLAN_LIST_ITEMS:
        raise InvalidRequestError(
            f"a plan's limit must be 0 to {MAX_PLAN_LIST_ITEMS:,}, not {request.limit}"
        )
    answer: PlanRestartResponse | PlanRollResponse
    if isinstance(request, PlanRestartRequest):
        answer = plan_restart(image, request.broker_id, rules=rules, now_ms=now_ms, limit=limit)
    else:
        answer = plan_roll(image, rules=rules, now_ms=now_ms, limit=limit)
    size = len(_encoder.encode(Frame(_MAX_CORRELATION_ID, answer)))
    if size > max_bytes:
        raise FrameTooLargeError(
            f"the plan ({size:,} bytes with lists of up to {limit:,} partitions) exceeds the "
            f"{max_bytes:,}-byte frame limit: ask for fewer (a smaller limit)"
        )
    return answer
