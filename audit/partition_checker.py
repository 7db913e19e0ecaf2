"""The invariant checker of one partition: its history, replayed in offset order.

`PartitionChecker` keeps only what it needs of the partition (leader, ISR, ELR,
LastKnownELR, MinISR, epochs) and, per replica, whether its broker's last registration
was unclean and the replica has not yet proven itself, and flags every violation of the
rules `audit.rules` describes as a `Violation`. It is fed one event at a time (its
``on_*`` methods), in offset order, by `audit.log_checker.LogChecker` or by the
``invariants`` job's rows method; it reads no log and routes nothing itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from audit.rules import (
    ALTER_PARTITION,
    EMPTY,
    MANUAL,
    NO_LEADER,
    UNCLEAN_RECOVERY,
    UNCLEAN_REGISTRATION,
    UNREGISTER,
    Violation,
)


def _fmt(s: Iterable[int]) -> str:
    return "[" + ",".join(str(b) for b in sorted(s)) + "]"


class PartitionChecker:
    """Replays one partition's events and collects violations (the rules: `audit.rules`)."""

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
