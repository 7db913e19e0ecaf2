"""The invariants every metadata log must keep, and what a violation of one looks like.

The rules are checked by replaying each partition's history in offset order: one
`audit.partition_checker.PartitionChecker` per partition, fed by
`audit.log_checker.LogChecker` from decoded records (the plain pass, `audit.plain`; the
``invariants`` job's logs and buckets methods; the fault simulator) or by the
``invariants`` job from rows, so every reader flags exactly the same things. A checker
sees, in offset order:

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

This module only names and describes the rules; it must not check anything.
"""

from __future__ import annotations

from typing import Final, NamedTuple

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
