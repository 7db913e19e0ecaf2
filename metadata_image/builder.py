"""The builder replay works on (`Builder`): one batch of changes collected on mutable
views of an image's persistent maps, then `finish()`ed into the next image. It keeps the
derived indexes (replicas by broker, offline partitions, active brokers) and holds the
partition paths, the bulk of every large change: runs of PartitionChangeRecords (a
fence's thousands) and PartitionRecords (a create's, a snapshot's), in loops with their
lookups inlined and replica lists and ISRs interned.

Applies what it is given and checks only that it fits the image (`ReplayError`): which
record does what to brokers, topics and configs is `metadata_image.record_replay`'s, and
the order records are applied in `metadata_image.replay`'s. No IO.

The active-broker set is kept incrementally: the brokers map's mutation remembers which
brokers a batch touched (`BrokerChanges`), and `finish` looks at those alone, where
walking every broker per broker record made each registration, fence or unfence on a
cluster of 1,000 brokers cost a thousand lookups.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from sys import intern
from typing import Any

import immutables
from msgspec.structs import replace as _replace

from metactl.errors import ReplayError
from metadata_image.delta import Election, MetadataDelta
from metadata_image.image import EMPTY_INDEX, ClusterImage, ReplicaIndex
from metadata_image.partition_map import CHUNK_BITS, CHUNK_MASK
from metadata_image.state import EMPTY, BrokerState, PartitionState, TopicPartition
from metadata_log.records import (
    NO_LEADER,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
)

# Replicas, ISRs and ELRs repeat across partitions; sharing one object per distinct value
# keeps a million-partition image small and cuts allocation during bulk replay.
_SETS: dict[tuple[int, ...], frozenset[int]] = {}
_TUPLES: dict[tuple[int, ...], tuple[int, ...]] = {}
_INTERN_LIMIT = 1 << 16


def _index_new(
    added: dict[int, dict[str, list[int]]],
    topic: str,
    groups: dict[tuple[int, ...], tuple[tuple[int, ...], list[int]]],
) -> None:
    """Add new partitions of `topic`, grouped by replicas (replica list -> the interned
    replicas and the new partitions), to each replica's list in `added` (broker -> topic
    -> partition numbers)."""
    for replicas, numbers in groups.values():
        if numbers:
            for b in replicas:
                added.setdefault(b, {}).setdefault(topic, []).extend(numbers)


def _fset(values: list[int]) -> frozenset[int]:
    if not values:
        return EMPTY
    key = tuple(values)
    s = _SETS.get(key)
    if s is None:
        if len(_SETS) >= _INTERN_LIMIT:
            _SETS.clear()
        s = _SETS[key] = frozenset(key)
    return s


def _tuple(values: list[int]) -> tuple[int, ...]:
    key = tuple(values)
    t = _TUPLES.get(key)
    if t is None:
        if len(_TUPLES) >= _INTERN_LIMIT:
            _TUPLES.clear()
        t = _TUPLES[key] = key
    return t


BULK = 10_000


class BrokerChanges:
    """The brokers map of one batch, mutable, remembering which brokers were set or
    removed (`touched`): the active set is updated for those alone (`active_after`)."""

    __slots__ = ("_map", "touched")

    def __init__(self, brokers: immutables.Map[int, BrokerState]) -> None:
        self._map = brokers.mutate()
        self.touched: set[int] = set()

    def get(self, broker_id: int) -> BrokerState | None:
        return self._map.get(broker_id)

    def __setitem__(self, broker_id: int, state: BrokerState) -> None:
        self._map[broker_id] = state
        self.touched.add(broker_id)

    def __delitem__(self, broker_id: int) -> None:
        del self._map[broker_id]
        self.touched.add(broker_id)

    def finish(self) -> immutables.Map[int, BrokerState]:
        return self._map.finish()


def active_after(
    active: frozenset[int], brokers: immutables.Map[int, BrokerState], touched: set[int]
) -> frozenset[int]:
    """`active` (the active brokers before a batch) after the batch left `brokers`, given
    the brokers it `touched`: those are looked at again, no other. The set is copied only
    if it changes (once, unless brokers both join and leave it)."""
    joined: list[int] = []
    left: list[int] = []
    for broker_id in touched:
        b = brokers.get(broker_id)
        if b is not None and b.active:
            if broker_id not in active:
                joined.append(broker_id)
        elif broker_id in active:
            left.append(broker_id)
    if not left:
        return active.union(joined) if joined else active
    if not joined:
        return active.difference(left)
    return active.difference(left).union(joined)


@contextmanager
def bulk(n: int) -> Iterator[None]:
    """Pause the cyclic GC while building many objects that form no cycles: repeated full
    collections over a growing heap otherwise made bulk replay four times slower."""
    pause = n >= BULK and gc.isenabled()
    if pause:
        gc.disable()
    try:
        yield
    finally:
        if pause:
            gc.enable()


class Builder:
    """Collects one batch of changes on mutable views of the persistent maps."""

    __slots__ = (
        "added",
        "base_active",
        "base_index",
        "brokers",
        "brokers_changed",
        "cluster_configs",
        "delta",
        "end_offset",
        "features",
        "index",
        "index_brokers",
        "last_recoveries",
        "offline",
        "partitions",
        "reassigning",
        "removed",
        "topic_ids",
        "topics",
    )

    def __init__(self, image: ClusterImage, delta: MetadataDelta | None = None) -> None:
        self.delta = delta
        self.brokers = BrokerChanges(image.brokers)
        # Set by `record_replay` with every change to `brokers` (which tracks the brokers
        # it touched itself: the active set follows those).
        self.brokers_changed = False
        self.topics = image.topics.mutate()
        self.partitions = image.partitions.mutate()
        self.offline = image.offline.mutate()
        # New replicas, broker -> topic -> partition numbers; merged into the index once.
        self.added: dict[int, dict[str, list[int]]] = {}
        # Replicas gone (a reassignment completed or cancelled), the same way: removing
        # them one partition at a time rebuilt a topic's index per partition (a cancel
        # of 1,000 partitions took 40-270 ms). No replica is pending in both.
        self.removed: dict[int, dict[str, list[int]]] = {}
        self.end_offset = image.end_offset
        self.base_index = image.replicas_by_broker
        self.base_active = image.active
        # Rarely changed: made mutable on first use.
        self.index: Any = None  # a mutation of replicas_by_broker, once one is removed
        self.index_brokers: set[int] = set()  # brokers the mutation gained
        self.features: Any = image.features
        self.cluster_configs: Any = image.cluster_configs
        self.reassigning: Any = image.reassigning
        self.topic_ids: Any = image.topic_ids
        self.last_recoveries: Any = image.last_recoveries

    def flush_added(self) -> Any:
        """The replica index as a mutation, with the replicas added and removed so far
        merged in (the two are disjoint, so their order does not matter)."""
        if self.index is None:
            self.index = self.base_index.mutate()
        im = self.index
        if self.added:
            for broker_id, new in self.added.items():
                im[broker_id] = im.get(broker_id, EMPTY_INDEX).added(new, fresh=True)
            self.index_brokers.update(self.added)
            self.added = {}
        if self.removed:
            for broker_id, parts in self.removed.items():
                set_index(im, broker_id, im.get(broker_id, EMPTY_INDEX).removed(parts))
            self.removed = {}
        return im

    def remove_replica(self, broker_id: int, topic: str, partition: int) -> None:
        """The broker no longer hosts the partition (merged into the index later, with
        the other removals). Where the broker's replicas of the topic also have additions
        pending, those are merged first, so that the two stay disjoint."""
        if topic in self.added.get(broker_id, ()):
            self.flush_added()
        self.removed.setdefault(broker_id, {}).setdefault(topic, []).append(partition)

    def add_replica(self, broker_id: int, topic: str, partition: int) -> None:
        """The broker hosts the partition now (merged into the index later), after any
        removal pending for the broker's replicas of the topic."""
        if topic in self.removed.get(broker_id, ()):
            self.flush_added()
        self.added.setdefault(broker_id, {}).setdefault(topic, []).append(partition)

    def finish(self) -> ClusterImage:
        index = self.base_index
        if self.index is not None or self.removed:
            index = self.flush_added().finish()
        elif self.added:
            with index.mutate() as im:
                for broker_id, new in self.added.items():
                    im[broker_id] = im.get(broker_id, EMPTY_INDEX).added(new, fresh=True)
                index = im.finish()
        brokers = self.brokers.finish()
        active = self.base_active
        if self.brokers.touched:
            active = active_after(active, brokers, self.brokers.touched)
        return ClusterImage(
            brokers=brokers,
            topics=self.topics.finish(),
            partitions=self.partitions.finish(),
            replicas_by_broker=index,
            offline=self.offline.finish(),
            active=active,
            end_offset=self.end_offset,
            features=self.features,
            cluster_configs=self.cluster_configs,
            reassigning=self.reassigning,
            topic_ids=self.topic_ids,
            last_recoveries=self.last_recoveries,
        )

    def set_partition(
        self, tp: TopicPartition, p: PartitionState, old: PartitionState | None
    ) -> None:
        """Store `p` (replacing `old`) and keep the offline index: exactly the partitions
        without a leader."""
        self.partitions[tp] = p
        was_offline = old is not None and old.leader == NO_LEADER
        if p.leader == NO_LEADER:
            if not was_offline:
                self.offline[tp] = None
        elif was_offline:
            del self.offline[tp]

    def broker(self, broker_id: int, record: MetadataRecord) -> BrokerState:
        b = self.brokers.get(broker_id)
        if b is None:
            raise ReplayError(f"{type(record).__name__} for unknown broker {broker_id}")
        return b

    def partition_changes(self, records: Iterable[PartitionChangeRecord]) -> None:
        """Apply a run of PartitionChangeRecords (a fence writes thousands in a row).

        One loop with the lookups inlined: the partition is read and replaced in its
        chunk of the partition map, which is fetched again only when the run moves to
        another chunk (a broker's partitions come topic by topic, mostly in chunk order).
        Per record this is what a `get`, a `PartitionState` and a `set_partition` do;
        calling those methods cost about half of a 100,000-partition fence's replay."""
        parts = self.partitions
        offline = self.offline
        delta = self.delta
        mark = None if delta is None else delta.partitions.add
        elections = None if delta is None else delta.elections
        fset = _fset
        interned = _SETS.get  # `_fset`'s lookup, inlined: most ISRs are interned already
        replace = _replace
        last_topic: str | None = None
        last_c = -1
        chunk: list[PartitionState | None] = []
        # The records of one decision share their ISR list (a fence restamps one change
        # per shape): its frozenset is looked up once per run of them.
        last_isr: list[int] | None = None
        last_set: frozenset[int] = EMPTY
        for r in records:
            topic = r.topic
            i = r.partition
            c = i >> CHUNK_BITS
            if c != last_c or topic != last_topic:
                chunk = parts.chunk(topic, c) or []
                last_topic = topic
                last_c = c
            j = i & CHUNK_MASK
            try:
                p = chunk[j]
            except IndexError:
                p = None
            if p is None:
                raise ReplayError(f"PartitionChange for unknown partition {topic}-{i}")
            leader = r.leader
            isr = r.isr
            if r.replicas is not None:  # a reassignment step: the rare, slower path
                chunk[j] = self._reassigned(p, r, p.leader if leader is None else leader)
            elif r.elr is None and r.last_known_elr is None and r.recovery_state is None:
                # The usual change (a fence's, an election's): the ISR, the leader and the
                # epochs. `replace` copies the rest in C, where the constructor took every
                # field as a keyword (a third of a 100,000-partition fence's replay).
                if isr is None:
                    new_isr = p.isr
                elif isr is last_isr:
                    new_isr = last_set
                else:
                    new_isr = last_set = interned(tuple(isr)) or fset(isr)
                    last_isr = isr
                if leader is None:
                    # Kept apart on purpose (most of a fence's changes): no leader keyword
                    # to pass, no offline or election bookkeeping to test.
                    chunk[j] = replace(
                        p,
                        isr=new_isr,
                        leader_epoch=r.leader_epoch,
                        partition_epoch=r.partition_epoch,
                    )
                    if mark is not None:
                        mark(p.tp)
                    continue
                chunk[j] = replace(
                    p,
                    isr=new_isr,
                    leader=leader,
                    leader_epoch=r.leader_epoch,
                    partition_epoch=r.partition_epoch,
                )
            else:
                chunk[j] = replace(
                    p,
                    isr=p.isr if isr is None else fset(isr),
                    elr=p.elr if r.elr is None else fset(r.elr),
                    last_known_elr=(
                        p.last_known_elr if r.last_known_elr is None else fset(r.last_known_elr)
                    ),
                    leader=p.leader if leader is None else leader,
                    leader_epoch=r.leader_epoch,
                    partition_epoch=r.partition_epoch,
                    recovery_state=(
                        p.recovery_state if r.recovery_state is None else r.recovery_state
                    ),
                )
            if leader is not None and leader != p.leader:
                if leader == NO_LEADER:
                    offline[p.tp] = None
                elif p.leader == NO_LEADER:
                    del offline[p.tp]
            if mark is not None:
                mark(p.tp)
                if r.election is not None and leader is not None:
                    elections.append(Election(p.tp, leader, r.election))  # type: ignore[union-attr]

    def partition_records(self, records: Iterable[PartitionRecord]) -> None:
        """Apply a run of PartitionRecords (a create writes a thousand per slice).

        The usual record, a new partition outside any reassignment, is stored in one loop
        with the lookups inlined, as in `partition_changes`: the chunk of the partition
        map is fetched once per chunk, and new partitions are grouped by their (interned)
        replica tuple, which goes to each broker's list of new partitions once per topic
        and group rather than once per partition and replica. Anything else (a partition
        that exists, a reassignment) takes `store_partition`.
        A sliced 100,000-partition create spent a quarter of its replay in the per-record
        calls the inlining saves, and a fifth in the per-replica appends the grouping saves."""
        parts = self.partitions
        offline = self.offline
        changed = None if self.delta is None else self.delta.partitions
        added = self.added
        fset = _fset
        tup = _tuple
        # `_fset`'s lookup, inlined (with its test for an empty list): ISRs are mostly
        # interned already.
        interned_set = _SETS.get
        last_topic: str | None = None
        topic = ""
        # The replicas of `topic`'s records seen so far (as given, a tuple) -> their
        # interned tuple and the new partitions with them: one lookup per record both
        # interns the replicas and finds the group.
        groups: dict[tuple[int, ...], tuple[tuple[int, ...], list[int]]] = {}
        last_c = -1
        chunk: list[PartitionState | None] = []
        new = 0  # partitions stored in `own_chunk` lists, counted once at the end
        for r in records:
            i = r.partition
            c = i >> CHUNK_BITS
            if r.topic != last_topic:
                if groups:
                    _index_new(added, topic, groups)
                    groups = {}
                last_topic = r.topic
                topic = intern(r.topic)
                last_c = -1
            if c != last_c:
                chunk = parts.own_chunk(topic, c)
                last_c = c
            j = i & CHUNK_MASK
            n = len(chunk)
            tp = (topic, i)
            values = r.replicas
            key = tuple(values)
            group = groups.get(key)
            if group is None:
                group = groups[key] = (tup(values), [])
            replicas = group[0]
            values = r.isr
            elr = r.elr
            lkelr = r.last_known_elr
            adding = tuple(r.adding_replicas) if r.adding_replicas else ()
            removing = tuple(r.removing_replicas) if r.removing_replicas else ()
            state = PartitionState(
                topic=topic,
                partition=i,
                tp=tp,
                replicas=replicas,
                isr=interned_set(tuple(values)) or fset(values),
                elr=fset(elr) if elr else EMPTY,
                last_known_elr=fset(lkelr) if lkelr else EMPTY,
                leader=r.leader,
                leader_epoch=r.leader_epoch,
                partition_epoch=r.partition_epoch,
                recovery_state=r.recovery_state,
                min_isr=r.min_isr,
                adding=adding,
                removing=removing,
            )
            old = chunk[j] if j < n else None
            if old is not None or adding or removing:
                self.store_partition(state, old)
            else:
                if j < n:
                    chunk[j] = state
                else:
                    if j > n:
                        chunk.extend([None] * (j - n))
                    chunk.append(state)
                new += 1
                if r.leader == NO_LEADER:
                    offline[tp] = None
                group[1].append(i)
            if changed is not None:
                changed.add(tp)
        parts.count_new(new)
        _index_new(added, topic, groups)

    def _reassigned(
        self, p: PartitionState, r: PartitionChangeRecord, leader: int
    ) -> PartitionState:
        """`p` after a change that sets its replicas (a reassignment's start, completion
        or cancel): the replica index and the reassigning set follow."""
        replicas = _tuple(r.replicas or [])
        if not replicas:
            raise ReplayError(f"PartitionChange leaves {p.topic}-{p.partition} without replicas")
        tp = p.tp
        new = set(replicas) - set(p.replicas)
        gone = set(p.replicas) - set(replicas)
        for b in sorted(new):
            self.add_replica(b, p.topic, p.partition)
        for b in sorted(gone):
            self.remove_replica(b, p.topic, p.partition)
        adding = p.adding if r.adding_replicas is None else tuple(r.adding_replicas)
        removing = p.removing if r.removing_replicas is None else tuple(r.removing_replicas)
        if adding or removing:
            if tp not in self.reassigning:
                self.reassigning = self.reassigning.set(tp, None)
        elif tp in self.reassigning:
            self.reassigning = self.reassigning.delete(tp)
        return PartitionState(
            topic=p.topic,
            partition=p.partition,
            tp=tp,
            replicas=replicas,
            isr=p.isr if r.isr is None else _fset(r.isr),
            elr=p.elr if r.elr is None else _fset(r.elr),
            last_known_elr=p.last_known_elr
            if r.last_known_elr is None
            else _fset(r.last_known_elr),
            leader=leader,
            leader_epoch=r.leader_epoch,
            partition_epoch=r.partition_epoch,
            recovery_state=p.recovery_state if r.recovery_state is None else r.recovery_state,
            min_isr=p.min_isr if r.min_isr is None else r.min_isr,
            adding=adding,
            removing=removing,
        )

    def store_partition(self, p: PartitionState, old: PartitionState | None) -> None:
        """`partition_records`' slower path: a PartitionRecord over an existing partition
        (its state replaced) or one in a reassignment (noted as reassigning)."""
        if p.adding or p.removing:
            self.reassigning = self.reassigning.set(p.tp, None)
        if old is None:
            for b in p.replicas:
                self.added.setdefault(b, {}).setdefault(p.topic, []).append(p.partition)
        self.set_partition(p.tp, p, old)


def set_index(im: Any, broker_id: int, index: ReplicaIndex) -> None:
    """Store a broker's replica index; an empty one is no entry (as a snapshot has it)."""
    if len(index):
        im[broker_id] = index
    else:
        im.pop(broker_id, None)
