"""The immutable cluster image: brokers, topics and partitions as committed records left them.

In the spirit of Kafka's MetadataImage. Collections are persistent maps (HAMTs,
`immutables.Map`, and for the partitions a chunked `PartitionMap`), so producing the next
image after a change costs O(changes), not O(cluster). Nothing here changes an image in
place; `metadata_image.replay` builds new ones. This module holds data and read-only
queries only: no rules, no IO.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterator, Mapping
from itertools import chain, pairwise
from typing import Final

import immutables
import msgspec

from metadata_image.partition_map import EMPTY_PARTITIONS, PartitionMap
from metadata_image.state import EMPTY, BrokerState, PartitionState, TopicPartition, TopicState
from metadata_log.records import ELR_FEATURE, MIN_ISR_CONFIG, UncleanRecoveryRecord


class ReplicaIndex(msgspec.Struct, frozen=True, gc=False, eq=False):
    """The partitions that have a replica on one broker, grouped by topic.

    A set-like, immutable collection of TopicPartitions. Grouping by topic makes creating
    a topic of N partitions cost N list appends and one sorted tuple per broker, rather
    than N persistent-map inserts per replica, and keeps a million-partition index small.

    A topic's partitions are a few ascending tuples of partition numbers ("chunks",
    disjoint), not one: a topic created in slices (1,000 partitions each) adds a chunk per
    slice, and the last `_MERGED` chunks are merged into one once they are of about the
    same size (the oldest of them at most twice the newest), as a base-`_MERGED` counter
    carries. Each partition is then copied O(log n) times over the whole creation, where
    one growing chunk copied per slice made a 100,000-partition create quadratic
    (measured: 2,970 set unions, about a third of its replay). Merging four at a time
    rather than two copies each partition about half as often (3.6 times rather than 7.3
    for 100 slices), for at most about 3 log4(slices) chunks.

    Why ascending tuples and not frozensets (as before): a broker's slice of work is read
    in ascending order (`by_topic`), which sorted a set of each topic on every fence
    (about a fifth of a 100,000-partition fence's first step), and merging chunks that follow one
    another (a sliced create's) is a copy, where a set union hashes every number (the
    merges were a fifth of a sliced create's steps). Membership is a binary search per
    chunk.

    Iteration is deterministic: topics in name order, a topic's partitions ascending,
    however they are chunked. Equality is set equality.
    """

    topics: immutables.Map[str, tuple[tuple[int, ...], ...]] = immutables.Map()
    size: int = 0

    def __contains__(self, tp: object) -> bool:
        if not isinstance(tp, tuple) or len(tp) != 2:
            return False
        chunks = self.topics.get(tp[0])
        i = tp[1]
        return chunks is not None and isinstance(i, int) and _holds(chunks, i)

    def __iter__(self) -> Iterator[TopicPartition]:
        for topic, numbers in self.by_topic():
            for i in numbers:
                yield (topic, i)

    def by_topic(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        """Each topic (in name order) with its partition numbers in ascending order: the
        iteration order. Ascending, so that a walk over the partitions (`of_topic`) meets
        each chunk of the partition map in one run. A topic held as one chunk is given as
        it is held: no copy."""
        topics = self.topics
        for topic in sorted(topics.keys()):
            yield topic, _merged(topics[topic])

    def __len__(self) -> int:
        return self.size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ReplicaIndex):
            return NotImplemented
        if self.size != other.size or len(self.topics) != len(other.topics):
            return False
        for topic, chunks in self.topics.items():
            theirs = other.topics.get(topic)
            if theirs is None or _merged(chunks) != _merged(theirs):
                return False
        return True

    def __ne__(self, other: object) -> bool:  # msgspec's own would compare the chunks
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # equal indexes may be chunked differently

    def added(self, new: Mapping[str, Collection[int]], *, fresh: bool = False) -> ReplicaIndex:
        """This index plus new partitions (topic -> partition numbers); one already in it
        is not added twice, unless the caller says none is (`fresh`: replay adds only a
        partition new to the image, once, or the replica a reassignment adds, and the
        property tests check the index against the partitions after every step). Skipping
        the check saves a probe per number and chunk, a tenth of a sliced create."""
        size = self.size
        m = self.topics.mutate()
        for topic, parts in new.items():
            old = m.get(topic)
            if fresh:
                chunk = tuple(sorted(parts))  # a slice's numbers come ascending: one pass
            else:  # a partition already in it (or given twice) is added once
                unique = set(parts)
                if old is not None:
                    unique = {i for i in unique if not _holds(old, i)}
                chunk = tuple(sorted(unique))
            if old is None:
                chunks: tuple[tuple[int, ...], ...] = (chunk,)
            else:
                chunks = (*old, chunk) if chunk else old
            while len(chunks) >= _MERGED and len(chunks[-_MERGED]) <= 2 * len(chunks[-1]):
                chunks = (*chunks[:-_MERGED], _merged(chunks[-_MERGED:]))
            size += len(chunk)
            m[topic] = chunks
        return ReplicaIndex(m.finish(), size)

    def removed(self, gone: Mapping[str, Collection[int]]) -> ReplicaIndex:
        """This index without some partitions (topic -> partition numbers; numbers not
        in it are ignored). A topic's chunks become one: O(its partitions here), in C."""
        size = self.size
        m = self.topics.mutate()
        for topic, parts in gone.items():
            old = m.get(topic)
            if old is None:
                continue
            whole = _merged(old)
            pieces: list[tuple[int, ...]] = []
            start = 0
            for i in sorted(set(parts)):
                at = bisect_left(whole, i, start)
                if at < len(whole) and whole[at] == i:
                    pieces.append(whole[start:at])
                    start = at + 1
            if not pieces:
                continue  # none of them is here
            pieces.append(whole[start:])
            kept = tuple(chain.from_iterable(pieces))
            size -= len(whole) - len(kept)
            if kept:
                m[topic] = (kept,)
            else:
                del m[topic]
        return ReplicaIndex(m.finish(), size)

    def without_topic(self, topic: str) -> ReplicaIndex:
        chunks = self.topics.get(topic)
        if chunks is None:
            return self
        return ReplicaIndex(self.topics.delete(topic), self.size - sum(map(len, chunks)))


_MERGED: Final = 4  # chunks merged at a time (see ReplicaIndex)


def _merged(chunks: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """A topic's chunks as one ascending tuple (the chunk itself if there is one). Chunks
    that follow one another (a topic created or grown in slices) are joined without a
    sort: a copy, where sorting compared every number."""
    if len(chunks) == 1:
        return chunks[0]
    whole = chain.from_iterable(chunks)
    if all(a and b and a[-1] < b[0] for a, b in pairwise(chunks)):
        return tuple(whole)
    return tuple(sorted(whole))


def _holds(chunks: tuple[tuple[int, ...], ...], i: int) -> bool:
    for c in chunks:
        at = bisect_left(c, i)
        if at < len(c) and c[at] == i:
            return True
    return False


EMPTY_INDEX: Final[ReplicaIndex] = ReplicaIndex()


def common(
    a: Collection[TopicPartition], b: Collection[TopicPartition]
) -> Iterator[TopicPartition]:
    """The partitions in both collections, walking the smaller and probing the larger: an
    index of a broker's replicas or the offline set may hold a million entries."""
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return (tp for tp in small if tp in large)


class ClusterImage(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the controller knows, as of `end_offset` (the offset of the next record)."""

    brokers: immutables.Map[int, BrokerState] = immutables.Map()
    topics: immutables.Map[str, TopicState] = immutables.Map()
    partitions: PartitionMap = EMPTY_PARTITIONS
    # Derived indexes, maintained by replay so that rules touch only what they must.
    replicas_by_broker: immutables.Map[int, ReplicaIndex] = immutables.Map()
    offline: immutables.Map[TopicPartition, None] = immutables.Map()
    # The brokers that are registered, unfenced and not in controlled shutdown.
    active: frozenset[int] = EMPTY
    end_offset: int = 0
    # Finalized feature levels (kafka-features) and the cluster-default dynamic configs
    # (kafka-configs --entity-type brokers --entity-default); topic configs live on the
    # topic. Absent: the controller's static settings apply (`elr_enabled`).
    features: immutables.Map[str, int] = immutables.Map()
    cluster_configs: immutables.Map[str, str] = immutables.Map()
    # Partitions with a reassignment in progress (for describe, metrics and --list).
    reassigning: immutables.Map[TopicPartition, None] = immutables.Map()
    # topic id -> name, so that records naming an id resolve in O(1).
    topic_ids: immutables.Map[str, str] = immutables.Map()
    # Each partition's last unclean recovery (a potential data-loss event), kept in the
    # image so that describe shows it after any restart or failover; a delete drops it.
    last_recoveries: immutables.Map[TopicPartition, UncleanRecoveryRecord] = immutables.Map()

    def broker(self, broker_id: int) -> BrokerState | None:
        return self.brokers.get(broker_id)

    def is_active(self, broker_id: int) -> bool:
        return broker_id in self.active

    def partition(self, tp: TopicPartition) -> PartitionState | None:
        p: PartitionState | None = self.partitions.get(tp)
        return p

    def partitions_of(self, broker_id: int) -> Iterator[PartitionState]:
        """Partitions that have a replica on the broker, in the order of its index."""
        partitions = self.partitions
        for topic, numbers in self.replicas_by_broker.get(broker_id, EMPTY_INDEX).by_topic():
            yield from partitions.of_topic(topic, numbers)

    def offline_partitions(self) -> Iterator[PartitionState]:
        for tp in self.offline:
            yield self.partitions[tp]

    def hosts_replicas(self, broker_id: int) -> bool:
        index = self.replicas_by_broker.get(broker_id)
        return index is not None and len(index) > 0

    def leads_anything(self, broker_id: int) -> bool:
        return any(p.leader == broker_id for p in self.partitions_of(broker_id))

    def elr_enabled(self, default: bool) -> bool:
        """KIP-966 on: the finalized eligible.leader.replicas.version, else `default`
        (the controller's --eligible-leader-replicas, which seeds a new cluster)."""
        level = self.features.get(ELR_FEATURE)
        return default if level is None else level >= 1

    def cluster_min_isr(self, default: int) -> int:
        """The cluster-default min.insync.replicas: the dynamic one, else `default`."""
        value = self.cluster_configs.get(MIN_ISR_CONFIG)
        return default if value is None else int(value)

    def topic_min_isr(self, topic: str, default: int) -> int:
        """A topic's configured min.insync.replicas (its own, else the cluster's); the
        effective value of a partition is this capped at its replication factor."""
        t = self.topics.get(topic)
        if t is not None and t.min_isr is not None:
            return t.min_isr
        return self.cluster_min_isr(default)

    def same_state(self, other: ClusterImage) -> bool:
        """Equality of content (maps compare by value; msgspec equality is field-wise)."""
        return (
            self.end_offset == other.end_offset
            and self.brokers == other.brokers
            and self.topics == other.topics
            and self.partitions == other.partitions
            and self.replicas_by_broker == other.replicas_by_broker
            and self.offline == other.offline
            and self.active == other.active
            and self.features == other.features
            and self.cluster_configs == other.cluster_configs
            and self.reassigning == other.reassigning
            and self.topic_ids == other.topic_ids
            and self.last_recoveries == other.last_recoveries
        )
