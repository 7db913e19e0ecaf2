"""The state a record's line is told against (`View`): the image, and over it what the
records read since changed of partitions and brokers; and whether a log shows KIP-966 at
work (`Kip966Seen`), which decides how an unclean restart is told under a log that
finalized no feature level. Pure: no IO, no clock. Used by `eventfeed.lines` and
`eventfeed.feed`; it words nothing."""

from __future__ import annotations

import msgspec

from metadata_image.image import ClusterImage
from metadata_image.state import PartitionState, TopicPartition, TopicState
from metadata_log.records import (
    ELR_FEATURE,
    NO_LEADER,
    ClearElrRecord,
    ConfigRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnregisterBrokerRecord,
)


class View:
    """The state a record's line is told against: the image, and over it what the records
    read since (not yet replayed into it) changed of partitions and brokers. Replaying
    record by record would cost a replay per line; a long history is replayed in bulk."""

    def __init__(self, image: ClusterImage, kip966: Kip966Seen | None = None) -> None:
        self.image = image
        self.kip966 = kip966 if kip966 is not None else Kip966Seen(image)
        self._partitions: dict[TopicPartition, PartitionState] = {}
        self._brokers: set[int] = set()
        self._topics: dict[str, TopicState] = {}

    def partition(self, tp: TopicPartition) -> PartitionState | None:
        p = self._partitions.get(tp)
        return p if p is not None else self.image.partitions.get(tp)

    def topic(self, name: str) -> TopicState | None:
        t = self._topics.get(name)
        return t if t is not None else self.image.topics.get(name)

    def has_broker(self, broker_id: int) -> bool:
        return broker_id in self._brokers or broker_id in self.image.brokers

    def isrs_of(self, broker_id: int) -> list[TopicPartition]:
        """The partitions whose ISR holds the broker now (the image's, as changed by the
        records read since, and those created since)."""
        now = {q.tp: q for q in self.image.partitions_of(broker_id)}
        now.update(self._partitions)
        return [tp for tp, p in now.items() if broker_id in p.isr]

    def classic(self, broker_id: int) -> bool:
        """The classic rules (eligible.leader.replicas.version 0, KIP-966 off) apply to
        the broker's registration: the finalized level says so (a feature record is
        replayed into the image before the next record is told). A log without one (a
        scenario's, or from before levels were recorded) finalized no KIP-966: it reads
        as classic, unless it shows KIP-966 at work where only KIP-966 can be (an ELR, a
        LastKnownELR or an unclean recovery, `Kip966Seen`) and the broker is not where
        only the classic rules leave a fenced broker (the ISR of a partition with no
        leader)."""
        level = self.image.features.get(ELR_FEATURE)
        if level is not None:
            return level < 1
        if any(
            (p := self.partition(tp)) is not None and p.leader == NO_LEADER
            for tp in self.isrs_of(broker_id)
        ):
            return True
        return not self.kip966.seen()

    def note(self, r: MetadataRecord) -> bool:
        """Take `r` into account; False when this view cannot (replay, then a new view)."""
        if isinstance(r, PartitionChangeRecord):
            p = self.partition((r.topic, r.partition))
            if p is not None:
                self._partitions[p.tp] = msgspec.structs.replace(
                    p,
                    leader=p.leader if r.leader is None else r.leader,
                    isr=p.isr if r.isr is None else frozenset(r.isr),
                    elr=p.elr if r.elr is None else frozenset(r.elr),
                    last_known_elr=(
                        p.last_known_elr
                        if r.last_known_elr is None
                        else frozenset(r.last_known_elr)
                    ),
                    replicas=p.replicas if r.replicas is None else tuple(r.replicas),
                    adding=p.adding if r.adding_replicas is None else tuple(r.adding_replicas),
                    removing=(
                        p.removing if r.removing_replicas is None else tuple(r.removing_replicas)
                    ),
                    min_isr=p.min_isr if r.min_isr is None else r.min_isr,
                )
        elif isinstance(r, PartitionRecord):
            tp = (r.topic, r.partition)
            self._partitions[tp] = PartitionState(
                topic=r.topic,
                partition=r.partition,
                tp=tp,
                replicas=tuple(r.replicas),
                isr=frozenset(r.isr),
                elr=frozenset(r.elr),
                last_known_elr=frozenset(r.last_known_elr),
                leader=r.leader,
                min_isr=r.min_isr,
                adding=tuple(r.adding_replicas),
                removing=tuple(r.removing_replicas),
            )
        elif isinstance(r, TopicRecord):
            self._topics[r.name] = TopicState(
                name=r.name,
                topic_id=r.topic_id,
                partitions=r.partitions,
                min_isr=r.min_isr,
                recovery_strategy=r.recovery_strategy,
            )
        elif isinstance(r, RegisterBrokerRecord):
            self._brokers.add(r.broker_id)
        elif isinstance(
            r,
            ClearElrRecord
            | RemoveTopicRecord
            | ConfigRecord
            | FeatureLevelRecord
            | UnregisterBrokerRecord,
        ):
            # Changes many partitions (a topic's, or a broker's), or state this view does
            # not keep (configs, features); rare: replay instead.
            return False
        return True


class Kip966Seen:
    """Whether a log shows KIP-966 at work: a partition with an ELR or a LastKnownELR, or
    an unclean recovery, in the image the feed started from or in a record read since.
    Only KIP-966 makes them, so a log that finalized no eligible.leader.replicas.version
    and holds one of them ran with ELRs. The start image is looked at only if asked, once
    (it walks the partitions until it finds one); records are looked at as read."""

    def __init__(self, image: ClusterImage) -> None:
        self._image: ClusterImage | None = image
        self._seen = False

    def seen(self) -> bool:
        if not self._seen and self._image is not None:
            image, self._image = self._image, None
            self._seen = bool(image.last_recoveries) or any(
                p.elr or p.last_known_elr for p in image.partitions.values()
            )
        return self._seen

    def take(self, r: MetadataRecord) -> None:
        if self._seen:
            return
        if isinstance(r, PartitionChangeRecord | PartitionRecord):
            self._seen = bool(r.elr or r.last_known_elr)
        elif isinstance(r, UncleanRecoveryRecord):
            self._seen = True
