"""The invariant checker: one partition's history, replayed in offset order, against the rules.

Shared by the Spark ``invariants`` job (one checker per partition, inside ``mapInArrow``)
and the single-process baseline (`audit.plain`), so both flag exactly the same things.
The checker keeps only what it needs of the partition (leader, ISR, ELR, LastKnownELR,
MinISR, epochs) and, per replica, whether its broker's last registration was unclean and
the replica has not yet proven itself. Events, in offset order:

* ``Partition`` / ``PartitionChange`` records of the partition (state);
* ``UncleanRecovery`` records of the partition (the recovery the next change carries out);
* ``ClearElr`` of its topic (ELR and LastKnownELR cleared, partition epoch + 1, as replay);
* unclean ``RegisterBroker`` records of a broker hosting a replica (the taint).

Rules (`RULES` holds the one-line descriptions the reports print):

``leader_not_in_isr_or_elr``
    A leader outside ISR ∪ ELR, unless the change carries out a recorded unclean
    recovery that chose that leader.
``isr_elr_overlap``
    ISR ∩ ELR is not empty.
``elr_at_or_above_min_isr``
    The ELR is not empty while |ISR| >= MinISR (rule 1 clears it there).
``unclean_replica_in_isr``
    After an unclean registration, the replica may rejoin the ISR only by AlterPartition
    (or by being chosen by a recorded unclean recovery); flagged when it enters any other
    way, or is still in the ISR when it registers.
``unclean_replica_in_elr``
    After an unclean registration, and before rejoining the ISR, the replica is in the
    ELR (it was not moved to the LastKnownELR, or entered a new ELR). Flagged at the
    first record of the partition that shows it, or at the registration when the log ends
    with it still there.
``unrecorded_unclean_recovery``
    A change with reason ``unclean_recovery`` not directly preceded by an
    UncleanRecoveryRecord choosing its leader: a data-loss event nobody reported.
``epoch_regression``
    The partition epoch does not increase, the leader epoch decreases, or the leader
    changes without a new leader epoch.

Records of a partition before its PartitionRecord (a log that starts after a snapshot)
cannot be checked: they are counted as skipped, never flagged.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Final, NamedTuple

from metadata_log.records import (
    ClearElrRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    UncleanRecoveryRecord,
)

NO_LEADER: Final = -1
ALTER_PARTITION: Final = "alter_partition"
UNCLEAN_RECOVERY: Final = "unclean_recovery"

RULES: Final[dict[str, str]] = {
    "leader_not_in_isr_or_elr": "leader outside ISR ∪ ELR outside an unclean recovery",
    "isr_elr_overlap": "a replica is in both the ISR and the ELR",
    "elr_at_or_above_min_isr": "ELR not empty while |ISR| >= MinISR",
    "unclean_replica_in_isr": (
        "an uncleanly registered replica in the ISR without an AlterPartition"
    ),
    "unclean_replica_in_elr": (
        "an uncleanly registered replica in the ELR before rejoining the ISR"
    ),
    "unrecorded_unclean_recovery": "an unclean-recovery change without its UncleanRecoveryRecord",
    "epoch_regression": "partition or leader epoch did not advance as it must",
}


class Violation(NamedTuple):
    cluster: str
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    rule: str
    broker: int | None
    detail: str


def _fmt(s: Iterable[int]) -> str:
    return "[" + ",".join(str(b) for b in sorted(s)) + "]"


class PartitionChecker:
    """Replays one partition's events and collects violations (see the module doc)."""

    __slots__ = (
        "cluster",
        "created",
        "elr",
        "flagged_elr",
        "isr",
        "leader",
        "leader_epoch",
        "lkelr",
        "min_isr",
        "out",
        "partition",
        "partition_epoch",
        "records",
        "recovery",
        "skipped",
        "tainted",
        "topic",
    )

    def __init__(self, cluster: str, topic: str, partition: int) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.created = False
        self.leader = NO_LEADER
        self.isr: frozenset[int] = frozenset()
        self.elr: frozenset[int] = frozenset()
        self.lkelr: frozenset[int] = frozenset()
        self.min_isr = 1
        self.leader_epoch = -1
        self.partition_epoch = -1
        # broker -> (offset, timestamp) of the unclean registration it has not recovered from
        self.tainted: dict[int, tuple[int, int]] = {}
        self.flagged_elr: set[int] = set()
        self.recovery: int | None = None  # chosen replica of the recovery record just seen
        self.records = 0
        self.skipped = 0
        self.out: list[Violation] = []

    def _flag(self, offset: int, ts: int, rule: str, broker: int | None, detail: str) -> None:
        self.out.append(
            Violation(self.cluster, self.topic, self.partition, offset, ts, rule, broker, detail)
        )

    # --- events ----------------------------------------------------------------------

    def on_partition(
        self,
        offset: int,
        ts: int,
        *,
        isr: Iterable[int],
        elr: Iterable[int] | None,
        last_known_elr: Iterable[int] | None,
        leader: int,
        leader_epoch: int,
        partition_epoch: int,
        min_isr: int | None,
    ) -> None:
        self.records += 1
        before = self.isr if self.created else frozenset[int]()
        self.created = True
        self.recovery = None
        self.isr = frozenset(isr)
        self.elr = frozenset(elr or ())
        self.lkelr = frozenset(last_known_elr or ())
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.min_isr = min_isr if min_isr is not None else 1
        self._check_state(offset, ts, before, reason="create", recorded=False)

    def on_change(
        self,
        offset: int,
        ts: int,
        *,
        reason: str | None,
        leader: int | None,
        isr: Iterable[int] | None,
        elr: Iterable[int] | None,
        last_known_elr: Iterable[int] | None,
        leader_epoch: int | None,
        partition_epoch: int | None,
    ) -> None:
        if not self.created:
            self.skipped += 1
            return
        self.records += 1
        chosen, self.recovery = self.recovery, None
        before = self.isr
        new_leader = self.leader if leader is None else leader
        if partition_epoch is not None and partition_epoch <= self.partition_epoch:
            self._flag(
                offset,
                ts,
                "epoch_regression",
                None,
                f"partition epoch {partition_epoch} after {self.partition_epoch}",
            )
        if leader_epoch is not None:
            if leader_epoch < self.leader_epoch:
                self._flag(
                    offset,
                    ts,
                    "epoch_regression",
                    None,
                    f"leader epoch {leader_epoch} after {self.leader_epoch}",
                )
            elif new_leader != self.leader and leader_epoch == self.leader_epoch:
                self._flag(
                    offset,
                    ts,
                    "epoch_regression",
                    new_leader,
                    f"leader {self.leader} -> {new_leader} kept leader epoch {leader_epoch}",
                )
            self.leader_epoch = leader_epoch
        if partition_epoch is not None:
            self.partition_epoch = partition_epoch
        self.leader = new_leader
        if isr is not None:
            self.isr = frozenset(isr)
        if elr is not None:
            self.elr = frozenset(elr)
        if last_known_elr is not None:
            self.lkelr = frozenset(last_known_elr)
        recorded = False
        if reason == UNCLEAN_RECOVERY:
            recorded = chosen is not None and chosen == new_leader
            if not recorded:
                what = (
                    "no UncleanRecoveryRecord" if chosen is None else f"the record chose {chosen}"
                )
                self._flag(
                    offset,
                    ts,
                    "unrecorded_unclean_recovery",
                    new_leader,
                    f"unclean recovery elected {new_leader}; {what}",
                )
        self._check_state(offset, ts, before, reason=reason or "", recorded=recorded)

    def on_recovery(self, offset: int, ts: int, *, chosen: int) -> None:
        if not self.created:
            self.skipped += 1
            return
        self.records += 1
        self.recovery = chosen

    def on_clear_elr(self, offset: int, ts: int) -> None:
        if not self.created:
            return
        self.records += 1
        self.recovery = None
        if self.elr or self.lkelr:
            self.elr = self.lkelr = frozenset()
            self.partition_epoch += 1
        self._check_taint_in_elr(offset, ts)

    def on_unclean_registration(self, offset: int, ts: int, *, broker: int) -> None:
        if not self.created:
            return
        self.records += 1
        self.recovery = None
        if broker in self.isr:
            self._flag(
                offset,
                ts,
                "unclean_replica_in_isr",
                broker,
                f"broker {broker} registered uncleanly while in the ISR {_fmt(self.isr)}",
            )
        self.tainted[broker] = (offset, ts)
        self.flagged_elr.discard(broker)

    def finish(self) -> list[Violation]:
        """Violations found; an unclean replica still in the ELR is flagged here."""
        for b in sorted(self.elr):
            if b in self.tainted and b not in self.flagged_elr:
                offset, ts = self.tainted[b]
                self._flag(
                    offset,
                    ts,
                    "unclean_replica_in_elr",
                    b,
                    f"broker {b} registered uncleanly at offset {offset} and is still in the "
                    f"ELR {_fmt(self.elr)} at the end of the log",
                )
                self.flagged_elr.add(b)
        return self.out

    # --- checks ----------------------------------------------------------------------

    def _check_state(
        self, offset: int, ts: int, before: frozenset[int], *, reason: str, recorded: bool
    ) -> None:
        isr, elr, leader = self.isr, self.elr, self.leader
        if leader != NO_LEADER and leader not in isr and leader not in elr and not recorded:
            self._flag(
                offset,
                ts,
                "leader_not_in_isr_or_elr",
                leader,
                f"leader {leader} with ISR {_fmt(isr)} and ELR {_fmt(elr)} (reason {reason})",
            )
        both = isr & elr
        if both:
            self._flag(
                offset,
                ts,
                "isr_elr_overlap",
                min(both),
                f"{_fmt(both)} in ISR {_fmt(isr)} and ELR {_fmt(elr)}",
            )
        if elr and len(isr) >= self.min_isr:
            self._flag(
                offset,
                ts,
                "elr_at_or_above_min_isr",
                None,
                f"ELR {_fmt(elr)} with ISR {_fmt(isr)} and MinISR {self.min_isr}",
            )
        if self.tainted:
            for b in sorted((isr - before) & self.tainted.keys()):
                reg_offset = self.tainted.pop(b)[0]
                self.flagged_elr.discard(b)
                if reason == ALTER_PARTITION or (recorded and b == leader):
                    continue
                self._flag(
                    offset,
                    ts,
                    "unclean_replica_in_isr",
                    b,
                    f"broker {b}, registered uncleanly at offset {reg_offset}, entered the "
                    f"ISR {_fmt(isr)} by {reason or 'an unknown reason'}",
                )
            self._check_taint_in_elr(offset, ts)

    def _check_taint_in_elr(self, offset: int, ts: int) -> None:
        for b in sorted(self.elr & self.tainted.keys()):
            if b in self.flagged_elr:
                continue
            self.flagged_elr.add(b)
            reg_offset = self.tainted[b][0]
            self._flag(
                offset,
                ts,
                "unclean_replica_in_elr",
                b,
                f"broker {b}, registered uncleanly at offset {reg_offset}, is in the ELR "
                f"{_fmt(self.elr)}",
            )


def bucket_of(topic: str, partition: int, buckets: int) -> int:
    """A stable bucket for a partition (the same in every process, unlike ``hash``)."""
    if buckets <= 1:
        return 0
    return zlib.crc32(f"{topic}\x00{partition}".encode()) % buckets


class LogChecker:
    """Runs a `PartitionChecker` per partition over decoded records in offset order.

    Routes each record to the checkers that must see it: partition records to their
    partition's, an unclean RegisterBroker to every partition with a replica on that
    broker, a ClearElr to every partition of its topic. With ``buckets > 1`` it keeps only
    the partitions of ``bucket`` (see `bucket_of`), so that several checkers can share one
    log, each reading all of it.
    """

    def __init__(self, cluster: str, bucket: int = 0, buckets: int = 1) -> None:
        self.cluster = cluster
        self.bucket = bucket
        self.buckets = buckets
        self.checkers: dict[tuple[str, int], PartitionChecker] = {}
        self.by_broker: dict[int, list[PartitionChecker]] = {}
        self.by_topic: dict[str, list[PartitionChecker]] = {}
        self.records = 0

    def _checker(self, topic: str, partition: int) -> PartitionChecker | None:
        tp = (topic, partition)
        c = self.checkers.get(tp)
        if c is None:
            if self.buckets > 1 and bucket_of(topic, partition, self.buckets) != self.bucket:
                return None
            c = self.checkers[tp] = PartitionChecker(self.cluster, topic, partition)
        return c

    def feed(self, base_offset: int, timestamp_ms: int, records: Iterable[MetadataRecord]) -> None:
        """The records of one stored batch (offsets base_offset, base_offset + 1, ...)."""
        ts = timestamp_ms
        for i, r in enumerate(records):
            self.records += 1
            if isinstance(r, PartitionChangeRecord):
                c = self._checker(r.topic, r.partition)
                if c is not None:
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
                    )
            elif isinstance(r, PartitionRecord):
                c = self._checker(r.topic, r.partition)
                if c is None:
                    continue
                if not c.created:
                    for b in dict.fromkeys(r.replicas):
                        self.by_broker.setdefault(b, []).append(c)
                    self.by_topic.setdefault(r.topic, []).append(c)
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
                )
            elif isinstance(r, UncleanRecoveryRecord):
                c = self._checker(r.topic, r.partition)
                if c is not None:
                    c.on_recovery(base_offset + i, ts, chosen=r.chosen)
            elif isinstance(r, RegisterBrokerRecord):
                if not r.clean:
                    for c in self.by_broker.get(r.broker_id, ()):
                        c.on_unclean_registration(base_offset + i, ts, broker=r.broker_id)
            elif isinstance(r, ClearElrRecord):
                for c in self.by_topic.get(r.topic, ()):
                    c.on_clear_elr(base_offset + i, ts)

    def finish(self) -> list[PartitionChecker]:
        """Every checker, finished (their ``out`` lists hold the violations)."""
        for c in self.checkers.values():
            c.finish()
        return list(self.checkers.values())
