"""Turning an image into the wire's describe shapes, one page at a time (used online by
the service and offline by the CLI).

Owns the describe order and its paging: partitions by (topic name, partition index),
brokers by id, a page bounded by an item count and by the encoded size of its frame, and
the cursor where the next page starts (KIP-966 DescribeTopicPartitions). One topic is
read through its partition count, never by scanning the other topics' partitions. A
page also carries the summary of every topic its partitions belong to (Kafka's topic
line), counted in its size.

`DescribeNotes` keeps what describe shows beyond the image, from committed records and
their commit times: each partition's last unclean recovery (shown, with its age, while
it is within the request's window, 24 h by default) and why each fenced broker is
fenced. The service feeds it as a commit listener, the offline CLI from the log it
reads; it holds one entry per partition ever recovered and one per broker.

Pure: no IO, no clock, and nothing here decides anything. Besides `DescribeNotes`, the
only state is a one-entry cache of the sorted topic names and broker ids of the last
image described.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Final, Generic, TypeVar

import msgspec

from metactl.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    UnknownTopicOrPartitionError,
)
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.state import BrokerState, TopicPartition
from metadata_image.state import PartitionState as ImagePartition
from metadata_log.records import (
    BrokerRegistrationChangeRecord,
    FenceBrokerRecord,
    LeaderRecoveryState,
    MetadataRecord,
    RegisterBrokerRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
)
from protocol.codec import Frame
from protocol.messages.admin import (
    BrokerDescription,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeCursor,
    PartitionState,
    RecoverySummary,
    TopicDescription,
)

# Items per page, and the most a request may ask for: Kafka's DescribeTopicPartitions
# default and cap (ResponsePartitionLimit, max.request.partition.size.limit).
PAGE_ITEMS: Final = 2000
# The largest correlation id msgpack encodes (9 bytes): a page is sized for any frame.
_MAX_CORRELATION_ID: Final = 2**64 - 1
# Growth of a list's msgpack header from empty (1 byte) to array32 (5 bytes).
_LIST_HEADER_GROWTH: Final = 4
# A topic name's length in the first estimate of a page's envelope (Kafka's longest); a
# longer cursor is still measured exactly before the page is answered.
_TOPIC_NAME_CHARS: Final = 249
# The `topics` key of a page (omitted from the measured envelope, which has none yet):
# its msgpack string and the growth of its list's header.
_TOPICS_KEY_BYTES: Final = 7 + 5
# How old an unclean recovery describe shows by default (DescribeClusterRequest).
RECOVERIES_WITHIN_MS: Final = 24 * 3600 * 1000

_encoder: Final = msgspec.msgpack.Encoder()
# The fewest bytes a partition takes in an answer (an empty topic name, no replicas): a
# v1 answer of more partitions than fit at this size is refused before any is built.
_MIN_PARTITION_BYTES: Final = len(
    _encoder.encode(
        PartitionState(
            topic="", partition=0, replicas=[], leader=0, leader_epoch=0, partition_epoch=0, isr=[]
        )
    )
)

RecoveryPending = Callable[[TopicPartition], list[int] | None]
HeartbeatAge = Callable[[int], int | None]


def partition_state(
    p: ImagePartition,
    recovery_pending: list[int] | None = None,
    last_unclean_recovery: RecoverySummary | None = None,
) -> PartitionState:
    return PartitionState(
        topic=p.topic,
        partition=p.partition,
        replicas=list(p.replicas),
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        isr=sorted(p.isr),
        elr=sorted(p.elr),
        last_known_elr=sorted(p.last_known_elr),
        recovering=p.recovery_state is LeaderRecoveryState.RECOVERING,
        recovery_pending=recovery_pending,
        min_isr=p.min_isr,
        last_unclean_recovery=last_unclean_recovery,
        adding_replicas=list(p.adding),
        removing_replicas=list(p.removing),
    )


def broker_description(
    b: BrokerState, last_heartbeat_age_ms: int | None, fenced_reason: str | None = None
) -> BrokerDescription:
    return BrokerDescription(
        broker_id=b.broker_id,
        epoch=b.epoch,
        fenced=b.fenced,
        controlled_shutdown=b.in_controlled_shutdown,
        last_registration_clean=b.last_registration_clean,
        last_heartbeat_age_ms=last_heartbeat_age_ms,
        endpoint=b.endpoint,
        rack=b.rack,
        fenced_reason=fenced_reason if b.fenced else None,
    )


def topic_description(image: ClusterImage, name: str) -> TopicDescription:
    t = image.topics[name]
    first = image.partitions.get((name, 0))
    return TopicDescription(
        name=name,
        topic_id=t.topic_id,
        partitions=t.partitions,
        replication_factor=len(first.target) if first is not None else 0,
        # The topic's own, else the cluster default (pinned at bootstrap), else what its
        # first partition was created with.
        min_isr=(
            t.min_isr
            if t.min_isr is not None
            else image.cluster_min_isr(first.min_isr if first is not None else 1)
        ),
        recovery_strategy=t.recovery_strategy,
    )


class DescribeNotes:
    """What describe shows beyond the image, from committed records in log order:
    each partition's last unclean recovery and its commit time, and why each broker is
    fenced (the last FenceBrokerRecord's reason, "registered" after a registration, or
    "requested" for a fence a heartbeat asked for). Records of a transaction go in once
    it is committed whole (the service's commit listener, or the offline reader)."""

    def __init__(self) -> None:
        self.recoveries: dict[TopicPartition, tuple[int, UncleanRecoveryRecord]] = {}
        self.fenced_reasons: dict[int, str] = {}

    def observe(self, records: Iterable[MetadataRecord], timestamp_ms: int) -> None:
        for r in records:
            if isinstance(r, UncleanRecoveryRecord):
                self.recoveries[(r.topic, r.partition)] = (timestamp_ms, r)
            elif isinstance(r, FenceBrokerRecord):
                self.fenced_reasons[r.broker_id] = r.reason
            elif isinstance(r, RegisterBrokerRecord):
                self.fenced_reasons[r.broker_id] = "registered"
            elif isinstance(r, UnfenceBrokerRecord):
                self.fenced_reasons.pop(r.broker_id, None)
            elif isinstance(r, BrokerRegistrationChangeRecord) and r.fenced is not None:
                if r.fenced:
                    self.fenced_reasons[r.broker_id] = "requested"
                else:
                    self.fenced_reasons.pop(r.broker_id, None)

    def on_commit(
        self,
        base_offset: int,
        records: Sequence[MetadataRecord],
        delta: MetadataDelta,
        now_ms: int,
    ) -> None:
        """A `Controller.commit_listeners` entry: one event's committed records."""
        if delta.unclean_recoveries or delta.brokers:
            self.observe(records, now_ms)

    def recovery(self, tp: TopicPartition, now_ms: int, within_ms: int) -> RecoverySummary | None:
        """The partition's last unclean recovery, if at most `within_ms` old."""
        seen = self.recoveries.get(tp)
        if seen is None:
            return None
        at, r = seen
        return _summary(r, at, now_ms, within_ms)


def recovery_summary(
    r: UncleanRecoveryRecord | None, now_ms: int, within_ms: int
) -> RecoverySummary | None:
    """A partition's last unclean recovery as the image keeps it, if at most `within_ms`
    old by the time the controller decided it (a record of an older log, without that
    time, is not shown: its age is unknown)."""
    if r is None or r.at_ms is None:
        return None
    return _summary(r, r.at_ms, now_ms, within_ms)


def _summary(
    r: UncleanRecoveryRecord, at: int, now_ms: int, within_ms: int
) -> RecoverySummary | None:
    if within_ms <= 0:
        return None
    age = max(0, now_ms - at)
    if age > within_ms:
        return None
    return RecoverySummary(
        chosen=r.chosen,
        strategy=r.strategy,
        trigger=r.trigger,
        candidates=[c.broker_id for c in r.candidates],
        at_ms=at,
        age_ms=age,
        offline_since_ms=r.offline_since_ms,
    )


# --- the order ------------------------------------------------------------------------

K = TypeVar("K")
Sortable = TypeVar("Sortable", str, int)
W = TypeVar("W")


class _SortedKeys(Generic[Sortable]):
    """The sorted keys of the last map asked about. Image maps are immutable and replaced
    on change, so identity is the cache key; holding the map keeps its id from being
    reused. Paging a large cluster sorts its topic names once per change, not per page."""

    def __init__(self) -> None:
        self._map: Mapping[Sortable, object] | None = None
        self._keys: list[Sortable] = []

    def __call__(self, m: Mapping[Sortable, object]) -> list[Sortable]:
        if m is not self._map:
            self._keys = sorted(m.keys())
            self._map = m
        return self._keys


_topic_names = _SortedKeys[str]()
_broker_ids = _SortedKeys[int]()


def iter_partitions(
    image: ClusterImage, topic: str | None = None, start: TopicPartition | None = None
) -> Iterator[ImagePartition]:
    """The image's partitions in describe order from `start` on (inclusive; it need not
    exist), of `topic` only if set. A topic's partitions are 0..count-1, so one topic
    costs its own partitions only."""
    if topic is not None:
        if start is not None and start[0] > topic:
            return
        names: Iterator[str] = iter([topic] if topic in image.topics else [])
    else:
        ordered: list[str] = _topic_names(image.topics)
        first = 0 if start is None else bisect.bisect_left(ordered, start[0])
        names = itertools.islice(ordered, first, None)
    partitions = image.partitions
    for name in names:
        first_partition = start[1] if start is not None and start[0] == name else 0
        for i in range(first_partition, image.topics[name].partitions):
            p = partitions.get((name, i))
            if p is not None:
                yield p


def iter_brokers(image: ClusterImage, start: int | None = None) -> Iterator[BrokerState]:
    """Registered brokers by id, from id `start` on (inclusive)."""
    ordered: list[int] = _broker_ids(image.brokers)
    first = 0 if start is None else bisect.bisect_left(ordered, start)
    for broker_id in itertools.islice(ordered, first, None):
        yield image.brokers[broker_id]


# --- pages ----------------------------------------------------------------------------


def describe_page(
    image: ClusterImage,
    request: DescribeClusterRequest,
    *,
    max_bytes: int,
    end_offset: int,
    committed_offset: int,
    recovery_pending: RecoveryPending = lambda tp: None,
    heartbeat_age_ms: HeartbeatAge = lambda broker_id: None,
    notes: DescribeNotes | None = None,
    now_ms: int = 0,
) -> DescribeClusterResponse:
    """The answer to `request` from `image`, in a frame payload of at most `max_bytes`.
    `notes` and `now_ms` add each partition's recent unclean recovery and each fenced
    broker's reason.

    v1: everything in one answer, or FrameTooLargeError when it does not fit (at once,
    without building any of it, when even the smallest encoding of that many partitions
    would not). v2: one page, with the cursors where the next page starts, and at least
    one item whenever any is left (else FrameTooLargeError: one item is over the limit on
    its own).
    """
    topic = request.topic
    if request.v < 2:
        total = len(image.partitions) if topic is None else _partition_count(image, topic)
        if total * _MIN_PARTITION_BYTES > max_bytes:
            raise FrameTooLargeError(
                f"the whole answer ({len(image.brokers)} brokers, {total} partitions) "
                f"exceeds the {max_bytes}-byte frame limit: DescribeCluster v2 pages it "
                "(metactl describe does)"
            )
    partition_limit: int | None = None  # None: no limit (v1)
    broker_limit: int | None = None
    start: TopicPartition | None = None
    if request.v >= 2:
        _check_ranges(request, max_bytes)
        partition_limit = _limit(request.partition_limit)
        broker_limit = _limit(request.broker_limit)
        if topic is not None and topic not in image.topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {topic}")
        cursor = request.cursor
        if cursor is not None:
            if topic is not None and cursor.topic != topic:
                raise InvalidRequestError(
                    f"the cursor names topic {cursor.topic!r}, the request {topic!r}"
                )
            start = (cursor.topic, cursor.partition)

    def envelope(
        partition_key: TopicPartition | None, broker_key: int | None
    ) -> DescribeClusterResponse:
        cursor = None
        if partition_key is not None:
            cursor = DescribeCursor(topic=partition_key[0], partition=partition_key[1])
        return DescribeClusterResponse(
            v=request.v,
            brokers=[],
            partitions=[],
            end_offset=end_offset,
            committed_offset=committed_offset,
            next_cursor=cursor,
            next_broker_cursor=broker_key,
        )

    def overhead(r: DescribeClusterResponse) -> int:
        frame = len(_encoder.encode(Frame(_MAX_CORRELATION_ID, r)))
        return frame + 2 * _LIST_HEADER_GROWTH + _TOPICS_KEY_BYTES

    # Items are measured one by one against what a generous envelope leaves; the real
    # envelope (its cursors) is measured at the end, and items go back to the next page
    # while the whole does not fit.
    budget = _Budget(max_bytes - overhead(envelope(("t" * _TOPIC_NAME_CHARS, 2**31), -(2**63))))
    within = request.recoveries_within_ms
    within = RECOVERIES_WITHIN_MS if within is None else within
    reasons = notes.fenced_reasons if notes is not None else {}

    def last_recovery(tp: TopicPartition) -> RecoverySummary | None:
        seen = None if notes is None else notes.recovery(tp, now_ms, within)
        if seen is None:  # after a restart or failover: the image keeps the last one
            seen = recovery_summary(image.last_recoveries.get(tp), now_ms, within)
        return seen

    brokers = _Section[int, BrokerDescription]()
    if broker_limit != 0:
        brokers.fill(
            (
                (
                    b.broker_id,
                    broker_description(b, heartbeat_age_ms(b.broker_id), reasons.get(b.broker_id)),
                )
                for b in iter_brokers(image, None if request.v < 2 else request.broker_cursor)
            ),
            broker_limit,
            budget,
        )
    partitions = _Section[TopicPartition, PartitionState]()
    summaries: dict[str, TopicDescription] = {}

    def topic_bytes(item: PartitionState, previous: PartitionState | None) -> int:
        """The first partition of a topic in the page brings the topic's summary."""
        if previous is not None and previous.topic == item.topic:
            return 0
        summary = summaries.get(item.topic)
        if summary is None:
            summary = summaries[item.topic] = topic_description(image, item.topic)
        return len(_encoder.encode(summary))

    if partition_limit != 0:
        partitions.fill(
            (
                (p.tp, partition_state(p, recovery_pending(p.tp), last_recovery(p.tp)))
                for p in iter_partitions(image, topic, start)
            ),
            partition_limit,
            budget,
            extra=topic_bytes,
        )

    def fits() -> bool:
        size = overhead(envelope(partitions.next_key, brokers.next_key))
        return size + budget.used <= max_bytes

    while not fits():
        if not (partitions.give_back(budget) or brokers.give_back(budget)):
            raise FrameTooLargeError(f"no answer fits the {max_bytes}-byte frame limit")
    if partitions.next_key is not None or brokers.next_key is not None:
        if request.v < 2:
            total = len(image.partitions) if topic is None else _partition_count(image, topic)
            raise FrameTooLargeError(
                f"the whole answer ({len(image.brokers)} brokers, {total} partitions) "
                f"exceeds the {max_bytes}-byte frame limit: DescribeCluster v2 pages it "
                "(metactl describe does)"
            )
        if not partitions.items and not brokers.items:
            raise FrameTooLargeError(
                f"the next item of the answer exceeds the {max_bytes}-byte frame limit on its own"
            )
    topics = [summaries[name] for name in dict.fromkeys(p.topic for p in partitions.items)]
    return msgspec.structs.replace(
        envelope(partitions.next_key, brokers.next_key),
        brokers=brokers.items,
        partitions=partitions.items,
        topics=topics,
    )


def _check_ranges(request: DescribeClusterRequest, max_bytes: int) -> None:
    """INVALID_REQUEST, naming the field, for a negative limit, cursor or byte limit."""
    fields = {
        "partition_limit": request.partition_limit,
        "broker_limit": request.broker_limit,
        "cursor.partition": None if request.cursor is None else request.cursor.partition,
        "max_bytes": request.max_bytes,
    }
    for name, value in fields.items():
        if value is not None and value < (1 if name == "max_bytes" else 0):
            raise InvalidRequestError(f"DescribeCluster {name} must not be {value}")
    if max_bytes < 1:
        raise InvalidRequestError(f"no answer fits {max_bytes} bytes")


def _partition_count(image: ClusterImage, topic: str) -> int:
    t = image.topics.get(topic)
    return 0 if t is None else t.partitions


def _limit(asked: int | None) -> int:
    return PAGE_ITEMS if asked is None else min(asked, PAGE_ITEMS)


class _Budget:
    """The bytes a page's items may take, and how many they take so far."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0


class _Section(Generic[K, W]):
    """One list of a page: its items, their encoded sizes and keys, and the key of the
    first item left for the next page (None: none is left)."""

    def __init__(self) -> None:
        self.items: list[W] = []
        self.sizes: list[int] = []
        self.keys: list[K] = []
        self.next_key: K | None = None

    def fill(
        self,
        source: Iterator[tuple[K, W]],
        limit: int | None,
        budget: _Budget,
        extra: Callable[[W, W | None], int] | None = None,
    ) -> None:
        """Take items while `limit` (None: any number) and the budget allow. `extra(item,
        previous item)` is what else the page must carry with the item (its bytes)."""
        for key, item in source:
            if limit is not None and len(self.items) >= limit:
                self.next_key = key
                return
            size = len(_encoder.encode(item))
            if extra is not None:
                size += extra(item, self.items[-1] if self.items else None)
            if budget.used + size > budget.limit:
                self.next_key = key
                return
            budget.used += size
            self.items.append(item)
            self.sizes.append(size)
            self.keys.append(key)

    def give_back(self, budget: _Budget) -> bool:
        """Leave the last item to the next page; False if there is none."""
        if not self.items:
            return False
        self.items.pop()
        self.next_key = self.keys.pop()
        budget.used -= self.sizes.pop()
        return True
