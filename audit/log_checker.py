"""The log-level dispatcher of the invariant check: decoded records to partition checkers.

`LogChecker` runs a `audit.partition_checker.PartitionChecker` per partition over the
records of one log in offset order, routing each record to the checkers that must see
it; `bucket_of` spreads partitions over buckets so that several checkers can share one
log, each reading all of it and keeping its own bucket's partitions. It judges nothing
itself: the rules are the partition checker's (`audit.rules` describes them).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from audit.partition_checker import PartitionChecker
from metadata_log.records import (
    ELR_FEATURE,
    ClearElrRecord,
    FeatureLevelRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    UncleanRecoveryRecord,
    UnregisterBrokerRecord,
)


def bucket_of(topic: str, partition: int, buckets: int) -> int:
    """A stable bucket for a partition (the same in every process, unlike ``hash``)."""
    if buckets <= 1:
        return 0
    return zlib.crc32(f"{topic}\x00{partition}".encode()) % buckets


class LogChecker:
    """Runs a `PartitionChecker` per partition over decoded records in offset order.

    Routes each record to the checkers that must see it: partition records to their
    partition's; an unclean RegisterBroker or an UnregisterBroker to every partition that
    has (or had: reassignments move replicas) a replica on that broker; a ClearElr or a
    RemoveTopic to every partition of its topic; an eligible.leader.replicas.version
    FeatureLevel to every partition. With ``buckets > 1`` it keeps only the partitions of
    ``bucket`` (see `bucket_of`), so that several checkers can share one log, each
    reading all of it.
    """

    def __init__(self, cluster: str, bucket: int = 0, buckets: int = 1) -> None:
        self.cluster = cluster
        self.bucket = bucket
        self.buckets = buckets
        self.checkers: dict[tuple[str, int], PartitionChecker] = {}
        self.by_broker: dict[int, list[PartitionChecker]] = {}
        self.by_topic: dict[str, list[PartitionChecker]] = {}
        self._routed: set[tuple[int, str, int]] = set()  # (broker, topic, partition)
        self._in_topic: set[tuple[str, int]] = set()
        self._elsewhere: set[tuple[str, int]] = set()  # partitions of other buckets
        self.elr_enabled = True  # the cluster's, for partitions created from now on
        self.records = 0

    def checker(self, topic: str, partition: int) -> PartitionChecker | None:
        """The partition's checker, made at its first record; None when the partition is
        in another bucket. Hot loops try ``checkers.get((topic, partition))`` first."""
        tp = (topic, partition)
        c = self.checkers.get(tp)
        if c is None and tp not in self._elsewhere:
            if self.buckets > 1 and bucket_of(topic, partition, self.buckets) != self.bucket:
                self._elsewhere.add(tp)
                return None
            c = self.checkers[tp] = PartitionChecker(
                self.cluster, topic, partition, elr_enabled=self.elr_enabled
            )
        return c

    def route(self, c: PartitionChecker, replicas: Iterable[int]) -> None:
        """Broker events of these replicas reach `c` from now on (a partition's records
        set its replicas: at creation, and a reassignment's)."""
        for b in replicas:
            key = (b, c.topic, c.partition)
            if key not in self._routed:
                self._routed.add(key)
                self.by_broker.setdefault(b, []).append(c)

    def join_topic(self, c: PartitionChecker) -> None:
        """Topic events (ClearElr, RemoveTopic) reach `c` from now on (at its PartitionRecord)."""
        tp = (c.topic, c.partition)
        if tp not in self._in_topic:
            self._in_topic.add(tp)
            self.by_topic.setdefault(c.topic, []).append(c)

    def feed(self, base_offset: int, timestamp_ms: int, records: Iterable[MetadataRecord]) -> None:
        """The records of one stored batch (offsets base_offset, base_offset + 1, ...).

        Partition records go to their partition's checker (`checker`, `route`,
        `join_topic`); the other events through the methods below, which readers of rows
        call too (`audit.invariant_rows.feed_rows` does exactly this from Arrow columns).
        """
        ts = timestamp_ms
        checkers = self.checkers
        for i, r in enumerate(records):
            self.records += 1
            if isinstance(r, PartitionChangeRecord):
                c = checkers.get((r.topic, r.partition)) or self.checker(r.topic, r.partition)
                if c is None:
                    continue
                if r.replicas is not None:
                    self.route(c, r.replicas)
                c.on_change(
                    base_offset + i,
                    ts,
                    reason=r.reason,
                    leader=r.leader,
                    isr=r.isr,
                    elr=r.elr,
                    last_known_elr=r.last_known_elr,
                    leader_epoch=r.leader_epoch,
                    partition_epoch=r.partition_epoch,
                    election=r.election,
                    replicas=r.replicas,
                    adding=r.adding_replicas,
                    removing=r.removing_replicas,
                    min_isr=r.min_isr,
                )
            elif isinstance(r, PartitionRecord):
                c = self.checker(r.topic, r.partition)
                if c is None:
                    continue
                self.route(c, r.replicas)
                self.join_topic(c)
                c.on_partition(
                    base_offset + i,
                    ts,
                    isr=r.isr,
                    elr=r.elr,
                    last_known_elr=r.last_known_elr,
                    leader=r.leader,
                    leader_epoch=r.leader_epoch,
                    partition_epoch=r.partition_epoch,
                    min_isr=r.min_isr,
                    replicas=r.replicas,
                    adding=r.adding_replicas,
                    removing=r.removing_replicas,
                )
            elif isinstance(r, UncleanRecoveryRecord):
                self.recovery(base_offset + i, ts, r.topic, r.partition, r.chosen)
            elif isinstance(r, RegisterBrokerRecord):
                self.registration(base_offset + i, ts, r.broker_id, r.clean)
            elif isinstance(r, ClearElrRecord):
                self.clear_elr(
                    base_offset + i, ts, r.topic, min_isr=r.min_isr, first=r.first, end=r.end
                )
            elif isinstance(r, UnregisterBrokerRecord):
                self.unregistration(base_offset + i, ts, r.broker_id)
            elif isinstance(r, RemoveTopicRecord):
                self.removal(base_offset + i, ts, r.name)
            elif isinstance(r, FeatureLevelRecord):
                self.feature(base_offset + i, ts, r.name, r.level)

    # The other events, in offset order.

    def recovery(self, offset: int, ts: int, topic: str, partition: int, chosen: int) -> None:
        """An UncleanRecoveryRecord."""
        c = self.checker(topic, partition)
        if c is not None:
            c.on_recovery(offset, ts, chosen=chosen)

    def registration(self, offset: int, ts: int, broker: int, clean: bool) -> None:
        """A RegisterBrokerRecord: an unclean one taints the broker's replicas."""
        if not clean:
            for c in self.by_broker.get(broker, ()):
                c.on_unclean_registration(offset, ts, broker=broker)

    def clear_elr(
        self,
        offset: int,
        ts: int,
        topic: str,
        *,
        min_isr: int | None,
        first: int | None,
        end: int | None,
    ) -> None:
        """A ClearElrRecord."""
        for c in self.by_topic.get(topic, ()):
            c.on_clear_elr(offset, ts, min_isr=min_isr, first=first, end=end)

    def unregistration(self, offset: int, ts: int, broker: int) -> None:
        """An UnregisterBrokerRecord."""
        for c in self.by_broker.get(broker, ()):
            c.on_unregister(offset, ts, broker=broker)

    def removal(self, offset: int, ts: int, topic: str) -> None:
        """A RemoveTopicRecord."""
        for c in self.by_topic.get(topic, ()):
            c.on_remove(offset, ts)

    def feature(self, offset: int, ts: int, name: str, level: int) -> None:
        """A FeatureLevelRecord (only eligible.leader.replicas.version matters here)."""
        if name != ELR_FEATURE:
            return
        self.elr_enabled = level >= 1
        for c in self.checkers.values():
            c.on_feature(offset, ts, level=level)

    def finish(self) -> list[PartitionChecker]:
        """Every checker, finished (their ``out`` lists hold the violations)."""
        for c in self.checkers.values():
            c.finish()
        return list(self.checkers.values())
