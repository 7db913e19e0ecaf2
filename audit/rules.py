"""The invariant checker: one partition's history, replayed in offset order, against the rules.

Shared by the Spark ``invariants`` job (one checker per partition, inside ``mapInArrow``)
and the single-process baseline (`audit.plain`), so both flag exactly the same things.
The checker keeps only what it needs of the partition (leader, ISR, ELR, LastKnownELR,
MinISR, epochs) and, per replica, whether its broker's last registration was unclean and
the replica has not yet proven itself. Events, in offset order:

* ``Partition`` / ``PartitionChange`` records of the partition (state);
* ``UncleanRecovery`` records of the partition (the recovery the next change carries out);
* ``ClearElr`` of its topic whose range [first, end) holds the partition (ELR and
  LastKnownELR cleared, the effective MinISR set to min(the new configured one, its
  replication factor), partition epoch + 1 when anything changed, as replay);
* unclean ``RegisterBroker`` records of a broker hosting a replica (the taint);
* ``UnregisterBroker`` of a broker hosting a replica (it must leave the ISR, ELR and
  LastKnownELR in the changes of the same transaction);
* ``RemoveTopic`` of its topic: the partition's state ends there. A topic created again
  under the same name is a new topic (a new id): its partitions start a new generation
  with nothing of the old one's state (epochs, taints, pending checks), so the invariants
  never mix the two;
* ``FeatureLevel`` of eligible.leader.replicas.version (every partition: KIP-966 ELR
  tracking on at level 1, off at 0).

``Config`` records hold no partition state: a min.insync.replicas change reaches the
partitions through the ClearElr records written with it.

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
    way, when it is still in the ISR once its registration's changes are done (checked at
    the partition's next record that is not an ``unclean_registration`` change, at its
    deletion and at the end of the log), or when it is elected leader with the ELR on
    other than by a recorded recovery (an ISR the classic rules left it in before an
    upgrade is no clean leadership). Under the classic rules (ELR off) an unclean
    registration keeps its ISR membership, as in Kafka: not flagged there.
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
``member_outside_replicas``
    The leader or a member of the ISR, ELR or LastKnownELR is not one of the partition's
    replicas: a replica a reassignment removed (KIP-455) kept its membership.
``adding_replica_in_isr``
    A reassignment's new replica entered the ISR other than by AlterPartition (it must
    catch up first, under the leader's in-sync rule), or the ELR or LastKnownELR before
    it ever joined the ISR.
``adding_replica_elected``
    A reassignment's new replica was elected leader before it joined the ISR, other than
    by a recorded unclean recovery (an operator's manual election is one).
``unregistered_broker_kept``
    An unregistered broker is still the leader or in the ISR, ELR or LastKnownELR once
    the changes of its unregistration are done (checked at the partition's next record
    that is not an ``unregister`` change, at its deletion and at the end of the log;
    flagged at the UnregisterBroker record). Under the classic rules (ELR tracking off)
    the last ISR member stays, as in Kafka, which never empties an ISR there.
``elr_while_disabled``
    After eligible.leader.replicas.version went to 0, the partition's ELR or
    LastKnownELR is not empty: a change put a member back after the downgrade's
    ClearElr, or the ClearElr never came (flagged at the downgrade, once the next feature
    change, the deletion or the end of the log shows it).

Records of a partition before its PartitionRecord (a log that starts after a snapshot)
cannot be checked: they are counted as skipped, never flagged.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Final, NamedTuple

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

NO_LEADER: Final = -1
ALTER_PARTITION: Final = "alter_partition"
UNCLEAN_RECOVERY: Final = "unclean_recovery"
UNREGISTER: Final = "unregister"
UNCLEAN_REGISTRATION: Final = "unclean_registration"
MANUAL: Final = "manual"
EMPTY: Final[frozenset[int]] = frozenset()

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
    "member_outside_replicas": (
        "a leader, ISR, ELR or LastKnownELR member that is not a replica (a removed replica)"
    ),
    "adding_replica_in_isr": (
        "a reassignment's new replica in the ISR (or ELR) without catching up by AlterPartition"
    ),
    "adding_replica_elected": (
        "a reassignment's new replica elected before joining the ISR, outside a recovery"
    ),
    "unregistered_broker_kept": (
        "an unregistered broker still in an ISR, ELR or LastKnownELR after its unregistration"
    ),
    "elr_while_disabled": "an ELR or LastKnownELR left while eligible.leader.replicas.version is 0",
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
        "adding",
        "cluster",
        "created",
        "disabled",
        "elr",
        "elr_enabled",
        "excluding",
        "flagged_elr",
        "generation",
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
        "removing",
        "replica_set",
        "replicas",
        "skipped",
        "tainted",
        "topic",
        "unproven",
        "unregistered",
    )

    def __init__(self, cluster: str, topic: str, partition: int, *, elr_enabled: bool = True):
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.records = 0
        self.skipped = 0
        self.out: list[Violation] = []
        # eligible.leader.replicas.version >= 1 (a cluster setting: kept across generations)
        self.elr_enabled = elr_enabled
        self.generation = 0  # the topic's incarnation: RemoveTopic records seen
        self._reset()

    def _reset(self) -> None:
        """No partition (before its PartitionRecord, or after its topic was deleted)."""
        self.created = False
        self.leader = NO_LEADER
        self.isr: frozenset[int] = EMPTY
        self.elr: frozenset[int] = EMPTY
        self.lkelr: frozenset[int] = EMPTY
        self.min_isr = 1
        self.leader_epoch = -1
        self.partition_epoch = -1
        self.replicas: tuple[int, ...] = ()
        self.replica_set: frozenset[int] = EMPTY  # the same, for membership tests
        self.adding: frozenset[int] = EMPTY
        # The replicas a reassignment removes: the effective MinISR caps at the target's
        # size (replicas minus these), as the controller's does.
        self.removing: frozenset[int] = EMPTY
        # broker -> (offset, timestamp) of the unclean registration it has not recovered from
        self.tainted: dict[int, tuple[int, int]] = {}
        self.flagged_elr: set[int] = set()
        self.recovery: int | None = None  # chosen replica of the recovery record just seen
        # a reassignment's new replicas that have not joined the ISR by AlterPartition yet
        self.unproven: set[int] = set()
        # broker -> (offset, timestamp) of an unregistration whose changes may still come
        self.unregistered: dict[int, tuple[int, int]] = {}
        # (offset, timestamp) of an ELR downgrade whose ClearElr has not reached it yet
        self.disabled: tuple[int, int] | None = None
        # broker -> (offset, timestamp) of an unclean registration, with the ELR on, of a
        # broker in the ISR: its changes, which may still come, must take it out
        self.excluding: dict[int, tuple[int, int]] = {}

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
        replicas: Iterable[int] | None = None,
        adding: Iterable[int] | None = None,
        removing: Iterable[int] | None = None,
    ) -> None:
        self.records += 1
        if self.unregistered:
            self._settle_unregistered()
        if self.excluding:
            self._settle_excluding()
        before = self.isr if self.created else EMPTY
        self.created = True
        self.recovery = None
        self.isr = frozenset(isr)
        self.elr = frozenset(elr or ())
        self.lkelr = frozenset(last_known_elr or ())
        self.leader = leader
        self.leader_epoch = leader_epoch
        self.partition_epoch = partition_epoch
        self.min_isr = min_isr if min_isr is not None else 1
        if replicas is not None:
            self.replicas = tuple(replicas)
            self.replica_set = frozenset(self.replicas)
        self.adding = frozenset(adding or ())
        self.removing = frozenset(removing or ())
        self.unproven = set(self.adding - self.isr)
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
        election: str | None = None,
        replicas: Iterable[int] | None = None,
        adding: Iterable[int] | None = None,
        min_isr: int | None = None,
        removing: Iterable[int] | None = None,
    ) -> None:
        if not self.created:
            self.skipped += 1
            return
        self.records += 1
        if self.unregistered and reason != UNREGISTER:
            self._settle_unregistered()
        if self.excluding and reason != UNCLEAN_REGISTRATION:
            self._settle_excluding()
        chosen, self.recovery = self.recovery, None
        before = self.isr
        # What `_check_adding` compares with (only called when a replica is or becomes
        # unproven: never for most partitions, so not computed for them).
        unproven_before = frozenset(self.unproven) if self.unproven else EMPTY
        elr_before = self.elr | self.lkelr if unproven_before or adding is not None else EMPTY
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
        elected = new_leader not in (self.leader, NO_LEADER)
        self.leader = new_leader
        if isr is not None:
            self.isr = frozenset(isr)
        if elr is not None:
            self.elr = frozenset(elr)
        if last_known_elr is not None:
            self.lkelr = frozenset(last_known_elr)
        if min_isr is not None:
            self.min_isr = min_isr
        if replicas is not None:
            self.replicas = tuple(replicas)
            self.replica_set = frozenset(self.replicas)
        if removing is not None:
            self.removing = frozenset(removing)
        if adding is not None:
            new = frozenset(adding)
            # A replica the reassignment starts adding has to prove itself; one still being
            # added stays as it was; one no longer added (completed, cancelled) is a replica
            # like any other.
            self.unproven = {b for b in new if b in self.unproven or b not in self.adding}
            self.adding = new
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
        if unproven_before or self.unproven:
            self._check_adding(
                offset,
                ts,
                before,
                elr_before,
                unproven_before,
                reason=reason or "",
                elected=elected,
                allowed=recorded or election == MANUAL,
            )
        if (
            elected
            and self.elr_enabled
            and new_leader in self.tainted
            and not recorded
            and election != MANUAL
        ):
            at, _ = self.tainted[new_leader]
            self._flag(
                offset,
                ts,
                "unclean_replica_in_isr",
                new_leader,
                f"broker {new_leader}, registered uncleanly at offset {at}, elected "
                f"leader ({election or reason}) without a recorded unclean recovery",
            )
        elif elected and not self.elr_enabled:
            # The classic rules elected it (their documented loss, if its log lost
            # records): its log is the partition's from here on.
            self.tainted.pop(new_leader, None)
        self._check_state(offset, ts, before, reason=reason or "", recorded=recorded)
        if not self.elr_enabled and self.disabled is None and (self.elr or self.lkelr):
            self._flag(
                offset,
                ts,
                "elr_while_disabled",
                None,
                f"ELR {_fmt(self.elr)} and LastKnownELR {_fmt(self.lkelr)} while "
                f"eligible.leader.replicas.version is 0 (reason {reason})",
            )

    def on_recovery(self, offset: int, ts: int, *, chosen: int) -> None:
        if not self.created:
            self.skipped += 1
            return
        self.records += 1
        self._settle_unregistered()
        self._settle_excluding()
        self.recovery = chosen

    def on_clear_elr(
        self,
        offset: int,
        ts: int,
        *,
        min_isr: int | None = None,
        first: int | None = 0,
        end: int | None = None,
    ) -> None:
        """ClearElr of the topic: for partitions in [first, end) (end None: all), the ELR
        and LastKnownELR are cleared and the effective MinISR becomes min(`min_isr`,
        replication factor) (None: unchanged). The epoch moves where the ELR or the
        LastKnownELR was cleared (a version-3 record, as Kafka); an older record also moved
        it where only the MinISR changed, which this check, that epochs only grow, allows."""
        if not self.created:
            return
        if self.partition < (first or 0) or (end is not None and self.partition >= end):
            return
        self.records += 1
        self._settle_unregistered()
        self._settle_excluding()
        self.recovery = None
        target = len(self.replicas) - len(self.removing)
        new_min = self.min_isr if min_isr is None else min(min_isr, target)
        if self.elr or self.lkelr:
            self.partition_epoch += 1
        self.elr = self.lkelr = EMPTY
        self.min_isr = new_min
        self.disabled = None  # a downgrade's clear has reached it
        self._check_taint_in_elr(offset, ts)

    def on_unclean_registration(self, offset: int, ts: int, *, broker: int) -> None:
        if not self.created or broker not in self.replicas:
            return
        self.records += 1
        self._settle_unregistered()
        self._settle_excluding()
        self.recovery = None
        if broker in self.isr and self.elr_enabled:
            self.excluding[broker] = (offset, ts)  # its changes come next
        self.tainted[broker] = (offset, ts)
        self.flagged_elr.discard(broker)

    def on_unregister(self, offset: int, ts: int, *, broker: int) -> None:
        """The broker's registration is removed: the changes of the same transaction must
        take it out of this partition's ISR, ELR and LastKnownELR."""
        if not self.created or broker not in self.replicas:
            return
        self.records += 1
        self._settle_unregistered()
        self._settle_excluding()
        self.recovery = None
        self.unregistered[broker] = (offset, ts)

    def on_feature(self, offset: int, ts: int, *, level: int) -> None:
        """eligible.leader.replicas.version finalized at `level` (every partition)."""
        enabled = level >= 1
        if self.created:
            self.records += 1
            self._settle_unregistered()
            self._settle_excluding()
            self._settle_disabled()
            if self.elr_enabled and not enabled:
                self.disabled = (offset, ts)  # owed a ClearElr
        self.elr_enabled = enabled

    def on_remove(self, offset: int, ts: int) -> None:
        """The topic is deleted: this generation of the partition ends here."""
        if not self.created:
            return
        self.records += 1
        self._end_generation()
        self._reset()
        self.generation += 1

    def finish(self) -> list[Violation]:
        """Violations found; what only the end of the log shows is flagged here."""
        if self.created:
            self._end_generation()
        return self.out

    def _end_generation(self) -> None:
        """What is owed when the partition's state ends (deletion, the end of the log):
        unregistrations and an ELR downgrade done, no unclean replica left in the ELR."""
        self._settle_unregistered()
        self._settle_excluding()
        self._settle_disabled()
        for b in sorted(self.elr):
            if b in self.tainted and b not in self.flagged_elr:
                offset, ts = self.tainted[b]
                self._flag(
                    offset,
                    ts,
                    "unclean_replica_in_elr",
                    b,
                    f"broker {b} registered uncleanly at offset {offset} and is still in the "
                    f"ELR {_fmt(self.elr)} at the end of the partition's history",
                )
                self.flagged_elr.add(b)

    def _settle_excluding(self) -> None:
        """The unclean registrations seen (ELR on) are done: none may have left its broker
        in the ISR."""
        if not self.excluding:
            return
        for b, (at, at_ts) in sorted(self.excluding.items()):
            if b in self.isr:
                self._flag(
                    at,
                    at_ts,
                    "unclean_replica_in_isr",
                    b,
                    f"broker {b} registered uncleanly at offset {at} and stayed in the ISR "
                    f"{_fmt(self.isr)}",
                )
        self.excluding.clear()

    def _settle_unregistered(self) -> None:
        """The unregistrations seen are done (their transaction's changes came before
        whatever else reaches the partition): none may have left its broker in place."""
        if not self.unregistered:
            return
        # The classic rules (ELR tracking off) never empty an ISR: its last member stays,
        # unregistered or not, as in Kafka.
        classic_last = not self.elr_enabled and len(self.isr) == 1
        for b, (at, at_ts) in sorted(self.unregistered.items()):
            where = [
                name
                for name, members in (
                    ("ISR", EMPTY if classic_last else self.isr),
                    ("ELR", self.elr),
                    ("LastKnownELR", self.lkelr),
                )
                if b in members
            ]
            if self.leader == b:
                where.insert(0, "leadership")
            if where:
                self._flag(
                    at,
                    at_ts,
                    "unregistered_broker_kept",
                    b,
                    f"broker {b} was unregistered at offset {at} and kept its "
                    f"{', '.join(where)} (ISR {_fmt(self.isr)}, ELR {_fmt(self.elr)}, "
                    f"LastKnownELR {_fmt(self.lkelr)})",
                )
        self.unregistered.clear()

    def _settle_disabled(self) -> None:
        """An ELR downgrade whose ClearElr never came, leaving an ELR behind."""
        if self.disabled is None:
            return
        at, at_ts = self.disabled
        self.disabled = None
        if self.elr or self.lkelr:
            self._flag(
                at,
                at_ts,
                "elr_while_disabled",
                None,
                f"eligible.leader.replicas.version went to 0 at offset {at} and the ELR "
                f"{_fmt(self.elr)} / LastKnownELR {_fmt(self.lkelr)} was never cleared",
            )

    # --- checks ----------------------------------------------------------------------

    def _check_adding(
        self,
        offset: int,
        ts: int,
        before: frozenset[int],
        elr_before: frozenset[int],
        unproven_before: frozenset[int],
        *,
        reason: str,
        elected: bool,
        allowed: bool,
    ) -> None:
        """A reassignment's new replicas: into the ISR only by AlterPartition, never into
        the ELR/LastKnownELR or leadership before that (but by a recorded recovery)."""
        leader = self.leader
        if elected and leader in unproven_before and not allowed:
            self._flag(
                offset,
                ts,
                "adding_replica_elected",
                leader,
                f"broker {leader}, being added by a reassignment, was elected (reason "
                f"{reason}) before joining the ISR",
            )
        for b in sorted((self.isr - before) & (unproven_before | self.unproven)):
            self.unproven.discard(b)
            if reason == ALTER_PARTITION or (allowed and b == leader):
                continue
            self._flag(
                offset,
                ts,
                "adding_replica_in_isr",
                b,
                f"broker {b}, being added by a reassignment, entered the ISR {_fmt(self.isr)} "
                f"by {reason or 'an unknown reason'} without catching up",
            )
        for b in sorted(((self.elr | self.lkelr) - elr_before) & self.unproven):
            self._flag(
                offset,
                ts,
                "adding_replica_in_isr",
                b,
                f"broker {b}, being added by a reassignment, entered the ELR {_fmt(self.elr)} "
                f"/ LastKnownELR {_fmt(self.lkelr)} before ever joining the ISR",
            )

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
        if elr:
            both = isr & elr
            if both:
                self._flag(
                    offset,
                    ts,
                    "isr_elr_overlap",
                    min(both),
                    f"{_fmt(both)} in ISR {_fmt(isr)} and ELR {_fmt(elr)}",
                )
            if len(isr) >= self.min_isr:
                self._flag(
                    offset,
                    ts,
                    "elr_at_or_above_min_isr",
                    None,
                    f"ELR {_fmt(elr)} with ISR {_fmt(isr)} and MinISR {self.min_isr}",
                )
        rs, lkelr = self.replica_set, self.lkelr
        if rs and not (
            isr <= rs
            and (not elr or elr <= rs)
            and (not lkelr or lkelr <= rs)
            and (leader == NO_LEADER or leader in rs)
        ):
            outside = (isr | elr | lkelr).difference(rs)
            if leader != NO_LEADER and leader not in rs:
                outside |= {leader}
            self._flag(
                offset,
                ts,
                "member_outside_replicas",
                min(outside),
                f"{_fmt(outside)} not among the replicas {list(self.replicas)}: leader "
                f"{leader}, ISR {_fmt(isr)}, ELR {_fmt(elr)}, LastKnownELR "
                f"{_fmt(lkelr)} (reason {reason})",
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
        call too (`audit.jobs.invariants.feed_rows` does exactly this from Arrow columns).
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
