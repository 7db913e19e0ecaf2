"""Replay: the only place where cluster state changes.

`apply(image, records)` applies committed (or, in the driver, about-to-be-committed)
records to an image and returns the next image and a `MetadataDelta` naming what
changed; `replay` is the same without the delta (restart, snapshots, tests). The
controller runs exactly this code on every change and again on restart, from the newest
snapshot plus the log after it; the brokers and the audits replay with it too.
`image_to_records` is the inverse used for snapshots: replaying its output onto an
empty image gives an equal image.

Transaction markers (Begin/End/AbortTransactionRecord) are no-ops here that only advance
`end_offset`: this is the replay of records known to take effect (the controller's
working image, whole transactions). Whoever reads the *committed log*, where a
transaction may still be open or was aborted, replays through
`metadata_image.transactions`, which holds a transaction back until its end marker.

Replay trusts its input to be a log the controller wrote; it raises `ReplayError` on a
record that contradicts the image (unknown partition, unknown broker) rather than
guessing.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from itertools import groupby
from sys import intern
from typing import Any, cast

from msgspec.structs import replace as _replace

from metactl.errors import ReplayError
from metadata_image.delta import Election, MetadataDelta
from metadata_image.image import (
    EMPTY,
    EMPTY_INDEX,
    BrokerState,
    ClusterImage,
    PartitionState,
    ReplicaIndex,
    TopicPartition,
    TopicState,
)
from metadata_image.partition_map import CHUNK_BITS, CHUNK_MASK
from metadata_log.records import (
    BROKER_RESOURCE,
    CLEAR_ELR_EPOCH_VERSION,
    MIN_ISR_CONFIG,
    NO_LEADER,
    RECORD_TYPES,
    TOPIC_RESOURCE,
    AbortTransactionRecord,
    BeginTransactionRecord,
    BrokerRegistrationChangeRecord,
    ClearElrRecord,
    ConfigRecord,
    EndTransactionRecord,
    FeatureLevelRecord,
    FenceBrokerRecord,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    UnregisterBrokerRecord,
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

_TAGS: dict[type, str] = {cls: tag for tag, cls in RECORD_TYPES.items()}


@contextmanager
def _bulk(n: int) -> Iterator[None]:
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


class _Builder:
    """Collects one batch of changes on mutable views of the persistent maps."""

    __slots__ = (
        "_base_active",
        "_base_index",
        "added",
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
        self.brokers = image.brokers.mutate()
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
        self._base_index = image.replicas_by_broker
        self._base_active = image.active
        # Rarely changed: made mutable on first use.
        self.index: Any = None  # a mutation of replicas_by_broker, once one is removed
        self.index_brokers: set[int] = set()  # brokers the mutation gained
        self.features: Any = image.features
        self.cluster_configs: Any = image.cluster_configs
        self.reassigning: Any = image.reassigning
        self.topic_ids: Any = image.topic_ids
        self.last_recoveries: Any = image.last_recoveries

    def _flush_added(self) -> Any:
        """The replica index as a mutation, with the replicas added and removed so far
        merged in (the two are disjoint, so their order does not matter)."""
        if self.index is None:
            self.index = self._base_index.mutate()
        im = self.index
        if self.added:
            for broker_id, new in self.added.items():
                im[broker_id] = im.get(broker_id, EMPTY_INDEX).added(new, fresh=True)
            self.index_brokers.update(self.added)
            self.added = {}
        if self.removed:
            for broker_id, parts in self.removed.items():
                _set_index(im, broker_id, im.get(broker_id, EMPTY_INDEX).removed(parts))
            self.removed = {}
        return im

    def remove_replica(self, broker_id: int, topic: str, partition: int) -> None:
        """The broker no longer hosts the partition (merged into the index later, with
        the other removals). Where the broker's replicas of the topic also have additions
        pending, those are merged first, so that the two stay disjoint."""
        if topic in self.added.get(broker_id, ()):
            self._flush_added()
        self.removed.setdefault(broker_id, {}).setdefault(topic, []).append(partition)

    def add_replica(self, broker_id: int, topic: str, partition: int) -> None:
        """The broker hosts the partition now (merged into the index later), after any
        removal pending for the broker's replicas of the topic."""
        if topic in self.removed.get(broker_id, ()):
            self._flush_added()
        self.added.setdefault(broker_id, {}).setdefault(topic, []).append(partition)

    def finish(self) -> ClusterImage:
        index = self._base_index
        if self.index is not None or self.removed:
            index = self._flush_added().finish()
        elif self.added:
            with index.mutate() as im:
                for broker_id, new in self.added.items():
                    im[broker_id] = im.get(broker_id, EMPTY_INDEX).added(new, fresh=True)
                index = im.finish()
        brokers = self.brokers.finish()
        active = self._base_active
        if self.brokers_changed:
            active = frozenset(bid for bid, b in brokers.items() if b.active)
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

    def apply(self, record: MetadataRecord) -> None:
        # Dispatch on the exact type: isinstance against a msgspec Struct class costs about
        # half a microsecond, so a `match` over eleven record classes dominated bulk replay.
        handler = _APPLY.get(type(record)) or _handler_for(type(record))
        handler(self, record)

    def _apply_partition_change(self, record: PartitionChangeRecord) -> None:
        self.partition_changes((record,))

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
        that exists, a reassignment) takes `_store_partition`.
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
                self._store_partition(state, old)
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

    def _apply_remove_topic(self, record: RemoveTopicRecord) -> None:
        """The topic and all its partitions go: O(its offline partitions + brokers)."""
        name = record.name
        t = self.topics.get(name)
        if t is None or t.topic_id != record.topic_id:
            raise ReplayError(f"RemoveTopic for unknown topic {name} ({record.topic_id})")
        del self.topics[name]
        self.topic_ids = (
            self.topic_ids.delete(t.topic_id) if t.topic_id in self.topic_ids else self.topic_ids
        )
        parts = self.partitions
        offline = self.offline
        reassigning = self.reassigning
        recoveries = self.last_recoveries
        for p in list(parts.topic_states(name, range(t.partitions))):
            if p.leader == NO_LEADER:
                del offline[p.tp]
            if p.tp in reassigning:
                reassigning = reassigning.delete(p.tp)
            if p.tp in recoveries:
                recoveries = recoveries.delete(p.tp)
        self.reassigning = reassigning
        self.last_recoveries = recoveries
        parts.drop_topic(name, t.partitions)
        im = self._flush_added()
        for broker_id in {*self._base_index.keys(), *self.index_brokers}:
            index = im.get(broker_id)
            if index is not None and name in index.topics:
                _set_index(im, broker_id, index.without_topic(name))
        delta = self.delta
        if delta is not None:
            delta.removed_topics[name] = (t.topic_id, t.partitions)
            delta.topics.discard(name)
            if delta.partitions:
                delta.partitions = {tp for tp in delta.partitions if tp[0] != name}

    def _apply_config(self, record: ConfigRecord) -> None:
        if record.name != MIN_ISR_CONFIG:
            raise ReplayError(f"Config {record.name!r} is not one metactl knows")
        value = record.value
        if record.resource_type == TOPIC_RESOURCE:
            t = self.topics.get(record.resource_name)
            if t is None:
                raise ReplayError(f"Config for unknown topic {record.resource_name}")
            self.topics[t.name] = TopicState(
                name=t.name,
                topic_id=t.topic_id,
                partitions=t.partitions,
                min_isr=None if value is None else int(value),
                recovery_strategy=t.recovery_strategy,
            )
        elif record.resource_type == BROKER_RESOURCE and record.resource_name == "":
            if value is None:
                if record.name in self.cluster_configs:
                    self.cluster_configs = self.cluster_configs.delete(record.name)
            else:
                self.cluster_configs = self.cluster_configs.set(record.name, value)
        else:
            raise ReplayError(
                f"Config for {record.resource_type} {record.resource_name!r} is not one "
                "metactl keeps"
            )
        if self.delta is not None:
            self.delta.configs.add((record.resource_type, record.resource_name, record.name))

    def _apply_feature(self, record: FeatureLevelRecord) -> None:
        self.features = self.features.set(record.name, record.level)
        if self.delta is not None:
            self.delta.features.add(record.name)

    def _apply_unregister(self, record: UnregisterBrokerRecord) -> None:
        b = self.broker(record.broker_id, record)
        if b.epoch != record.broker_epoch:
            raise ReplayError(
                f"UnregisterBroker of broker {b.broker_id} at epoch {record.broker_epoch}, "
                f"its epoch is {b.epoch}"
            )
        del self.brokers[record.broker_id]
        self.brokers_changed = True
        if self.delta is not None:
            self.delta.unregistered.add(record.broker_id)
            self.delta.brokers.discard(record.broker_id)

    def _apply_fence(self, record: FenceBrokerRecord) -> None:
        self._set_fenced(record, record.broker_id, record.broker_epoch, fenced=True)

    def _apply_unfence(self, record: UnfenceBrokerRecord) -> None:
        self._set_fenced(record, record.broker_id, record.broker_epoch, fenced=False)

    def _set_fenced(self, record: MetadataRecord, bid: int, epoch: int, *, fenced: bool) -> None:
        b = self.broker(bid, record)
        if b.epoch == epoch:
            self.brokers_changed = True
            self.brokers[bid] = _replace_broker(b, fenced=fenced)
            if self.delta is not None:
                self.delta.brokers.add(bid)

    def _apply_registration_change(self, record: BrokerRegistrationChangeRecord) -> None:
        b = self.broker(record.broker_id, record)
        if b.epoch == record.broker_epoch:
            if self.delta is not None:
                self.delta.brokers.add(record.broker_id)
            self.brokers_changed = True
            self.brokers[record.broker_id] = _replace_broker(
                b,
                fenced=b.fenced if record.fenced is None else record.fenced,
                in_controlled_shutdown=(
                    b.in_controlled_shutdown
                    if record.in_controlled_shutdown is None
                    else record.in_controlled_shutdown
                ),
            )

    def _apply_register(self, record: RegisterBrokerRecord) -> None:
        self.brokers_changed = True
        self.brokers[record.broker_id] = BrokerState(
            broker_id=record.broker_id,
            epoch=record.broker_epoch,
            incarnation_id=record.incarnation_id,
            endpoint=record.endpoint,
            rack=record.rack,
            fenced=record.fenced,
            in_controlled_shutdown=False,
            last_registration_clean=record.clean,
        )
        delta = self.delta
        if delta is not None:
            delta.brokers.add(record.broker_id)
            if not record.clean:
                delta.unclean_registrations.append(record.broker_id)

    def _apply_partition(self, record: PartitionRecord) -> None:
        self.partition_records((record,))

    def _apply_topic(self, record: TopicRecord) -> None:
        if self.delta is not None:
            self.delta.topics.add(record.name)
        old = self.topics.get(record.name)
        if old is not None and (
            old.topic_id != record.topic_id or old.partitions > record.partitions
        ):
            raise ReplayError(
                f"Topic {record.name} ({record.topic_id}, {record.partitions} partitions) "
                f"over the existing {old.topic_id} of {old.partitions}"
            )
        if old is None:
            self.topic_ids = self.topic_ids.set(record.topic_id, record.name)
        self.topics[record.name] = TopicState(
            name=record.name,
            topic_id=record.topic_id,
            partitions=record.partitions,
            min_isr=record.min_isr,
            recovery_strategy=record.recovery_strategy,
        )

    def _apply_clear_elr(self, record: ClearElrRecord) -> None:
        topic = record.topic
        t = self.topics.get(topic)
        if t is None:
            raise ReplayError(f"ClearElr for unknown topic {topic}")
        end = t.partitions if record.end is None else min(record.end, t.partitions)
        configured = record.min_isr
        changed = None if self.delta is None else self.delta.partitions
        # From version 3 on (Kafka's rule) only a partition whose ELR or LastKnownELR is
        # cleared gets a new partition epoch; one whose effective MinISR alone changes
        # keeps it, so that its leader's next AlterPartition is not refused for nothing.
        # Earlier records replay as they were written: every changed partition bumped.
        bump_all = record.v < CLEAR_ELR_EPOCH_VERSION
        for p in self.partitions.topic_states(topic, range(record.first, end)):
            min_isr = p.min_isr if configured is None else min(configured, len(p.target))
            clears = bool(p.elr or p.last_known_elr)
            if clears or min_isr != p.min_isr:
                self.set_partition(
                    p.tp,
                    _replace_partition(
                        p, elr=EMPTY, lkelr=EMPTY, min_isr=min_isr, bump=clears or bump_all
                    ),
                    p,
                )
                if changed is not None:
                    changed.add(p.tp)

    def _apply_unclean_recovery(self, record: UncleanRecoveryRecord) -> None:
        tp = (intern(record.topic), record.partition)
        if tp not in self.partitions:
            raise ReplayError(f"UncleanRecovery for unknown partition {tp[0]}-{tp[1]}")
        self.last_recoveries = self.last_recoveries.set(tp, record)
        if self.delta is not None:
            self.delta.unclean_recoveries.append(record)

    def _apply_noop(self, record: NoOpRecord) -> None:
        """Audit records: the PartitionChangeRecord beside them carries the state.

        Transaction markers replay as no-ops here too: `replay` and `apply` are the
        controller's working image, which holds everything it has decided. Readers of the
        committed log honour the markers through `metadata_image.transactions`."""

    def _store_partition(self, p: PartitionState, old: PartitionState | None) -> None:
        """`partition_records`' slower path: a PartitionRecord over an existing partition
        (its state replaced) or one in a reassignment (noted as reassigning)."""
        if p.adding or p.removing:
            self.reassigning = self.reassigning.set(p.tp, None)
        if old is None:
            for b in p.replicas:
                self.added.setdefault(b, {}).setdefault(p.topic, []).append(p.partition)
        self.set_partition(p.tp, p, old)


_APPLY: dict[type, Callable[[_Builder, Any], None]] = {
    PartitionChangeRecord: _Builder._apply_partition_change,
    FenceBrokerRecord: _Builder._apply_fence,
    UnfenceBrokerRecord: _Builder._apply_unfence,
    BrokerRegistrationChangeRecord: _Builder._apply_registration_change,
    RegisterBrokerRecord: _Builder._apply_register,
    PartitionRecord: _Builder._apply_partition,
    TopicRecord: _Builder._apply_topic,
    ClearElrRecord: _Builder._apply_clear_elr,
    RemoveTopicRecord: _Builder._apply_remove_topic,
    ConfigRecord: _Builder._apply_config,
    FeatureLevelRecord: _Builder._apply_feature,
    UnregisterBrokerRecord: _Builder._apply_unregister,
    UncleanRecoveryRecord: _Builder._apply_unclean_recovery,
    NoOpRecord: _Builder._apply_noop,
    BeginTransactionRecord: _Builder._apply_noop,
    EndTransactionRecord: _Builder._apply_noop,
    AbortTransactionRecord: _Builder._apply_noop,
}


def _set_index(im: Any, broker_id: int, index: ReplicaIndex) -> None:
    """Store a broker's replica index; an empty one is no entry (as a snapshot has it)."""
    if len(index):
        im[broker_id] = index
    else:
        im.pop(broker_id, None)


def _handler_for(kind: type) -> Callable[[_Builder, Any], None]:
    """The handler of the nearest record class `kind` derives from (a subclass replays as
    its base did under isinstance dispatch); refuses anything else."""
    for base in kind.__mro__:
        handler = _APPLY.get(base)
        if handler is not None:
            _APPLY[kind] = handler
            return handler
    raise ReplayError(f"cannot replay a {kind.__name__}")


def _replace_broker(
    b: BrokerState, *, fenced: bool, in_controlled_shutdown: bool | None = None
) -> BrokerState:
    return BrokerState(
        broker_id=b.broker_id,
        epoch=b.epoch,
        incarnation_id=b.incarnation_id,
        endpoint=b.endpoint,
        rack=b.rack,
        fenced=fenced,
        in_controlled_shutdown=(
            b.in_controlled_shutdown if in_controlled_shutdown is None else in_controlled_shutdown
        ),
        last_registration_clean=b.last_registration_clean,
    )


def _replace_partition(
    p: PartitionState, *, elr: frozenset[int], lkelr: frozenset[int], min_isr: int, bump: bool
) -> PartitionState:
    return PartitionState(
        topic=p.topic,
        partition=p.partition,
        tp=p.tp,
        replicas=p.replicas,
        isr=p.isr,
        elr=elr,
        last_known_elr=lkelr,
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch + 1 if bump else p.partition_epoch,
        recovery_state=p.recovery_state,
        min_isr=min_isr,
        adding=p.adding,
        removing=p.removing,
    )


def replay(image: ClusterImage, records: Iterable[MetadataRecord]) -> ClusterImage:
    """Apply records in order; each advances `end_offset` by one."""
    return _replay(image, records, None)


def apply(
    image: ClusterImage, records: Iterable[MetadataRecord]
) -> tuple[ClusterImage, MetadataDelta]:
    """`replay`, and the delta that says what the records changed."""
    delta = MetadataDelta()
    return _replay(image, records, delta), delta


def _replay(
    image: ClusterImage, records: Iterable[MetadataRecord], delta: MetadataDelta | None
) -> ClusterImage:
    b = _Builder(image, delta)
    batch = records if isinstance(records, list) else list(records)
    with _bulk(len(batch)):
        counts = None if delta is None else delta.records_by_type
        _apply_runs(b, batch, counts)
        b.end_offset += len(batch)
        return b.finish()


def _apply_runs(
    b: _Builder, records: Iterable[MetadataRecord], counts: dict[str, int] | None = None
) -> None:
    """Apply records in runs of one type: partition records and changes (thousands in a
    row in a create, a fence or a snapshot) take their bulk loops, the rest one by one.
    Consumes an iterator as it goes. `counts` (record type tag -> records), when given,
    is added what was applied, a run at a time (a `Counter` over the batch's types cost
    about 3% of a 100,000-partition fence's steps)."""
    for kind, group in groupby(records, type):
        run: Iterable[MetadataRecord]
        if counts is None:
            run = group
        else:
            run = listed = list(group)
            tag = _TAGS[kind]
            counts[tag] = counts.get(tag, 0) + len(listed)
        if kind is PartitionChangeRecord:
            b.partition_changes(cast("Iterator[PartitionChangeRecord]", run))
        elif kind is PartitionRecord:
            b.partition_records(cast("Iterator[PartitionRecord]", run))
        else:
            for record in run:
                b.apply(record)


def image_to_records(image: ClusterImage) -> list[MetadataRecord]:
    """The records that rebuild `image` from empty (its snapshot form, without end_offset)."""
    return list(iter_image_records(image))


def iter_image_records(image: ClusterImage) -> Iterator[MetadataRecord]:
    """`image_to_records`, one record at a time (snapshots encode it in batches)."""
    for b in sorted(image.brokers.values(), key=lambda b: b.broker_id):
        yield RegisterBrokerRecord(
            broker_id=b.broker_id,
            incarnation_id=b.incarnation_id,
            broker_epoch=b.epoch,
            endpoint=b.endpoint,
            rack=b.rack,
            clean=b.last_registration_clean,
            fenced=b.fenced,
        )
        if b.in_controlled_shutdown:
            yield BrokerRegistrationChangeRecord(
                broker_id=b.broker_id, broker_epoch=b.epoch, in_controlled_shutdown=True
            )
    for name, level in sorted(image.features.items()):
        yield FeatureLevelRecord(name=name, level=level)
    for name, value in sorted(image.cluster_configs.items()):
        yield ConfigRecord(resource_type=BROKER_RESOURCE, resource_name="", name=name, value=value)
    for t in sorted(image.topics.values(), key=lambda t: t.name):
        yield TopicRecord(
            name=t.name,
            topic_id=t.topic_id,
            partitions=t.partitions,
            min_isr=t.min_isr,
            recovery_strategy=t.recovery_strategy,
        )
        for p in image.partitions.of_topic(t.name, range(t.partitions)):
            yield partition_record(p)
            last = image.last_recoveries.get(p.tp)
            if last is not None:  # kept as the record itself: replay keeps it again
                yield last


def partition_record(p: PartitionState) -> PartitionRecord:
    return PartitionRecord(
        topic=p.topic,
        partition=p.partition,
        replicas=list(p.replicas),
        isr=sorted(p.isr),
        elr=sorted(p.elr),
        last_known_elr=sorted(p.last_known_elr),
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        recovery_state=p.recovery_state,
        min_isr=p.min_isr,
        adding_replicas=list(p.adding),
        removing_replicas=list(p.removing),
    )


def image_from_records(records: Iterable[MetadataRecord], end_offset: int) -> ClusterImage:
    """Rebuild an image from snapshot records; `end_offset` is the snapshot's offset."""
    b = _Builder(ClusterImage())
    # An iterator (a snapshot decoding batch by batch) is consumed as it goes, never listed.
    with _bulk(len(records) if isinstance(records, Sized) else BULK):
        _apply_runs(b, records)
        b.end_offset = end_offset
        return b.finish()
