"""Property tests of the pure controller core.

The centrepiece is `ControllerMachine`, a Hypothesis state machine that drives random
sequences of every controller action through the one event step
(`controller.core.step.step`, which evaluates unclean recoveries after every event, as the
driver does; virtual-time ticks are `Tick` events through the same step), the metadata
lifecycle's included (issue 19: min.insync.replicas changes of a topic or of the cluster
default, the ELR feature level, topic deletion and re-creation, added partitions, KIP-455
reassignment with its completion and cancel, broker unregistration, the bootstrap records).
Beside the image it keeps an independent model of the rules, written from the rule text
rather than from the code, and checks after every step that

* the image equals the model (brokers, topics with their ids and configs, the finalized
  features and cluster configs, and every partition's replicas, adding and removing
  replicas, MinISR, leader, ISR, ELR, LastKnownELR, epochs and recovery state), and every
  response and error code is the one the model predicts, in the documented validation
  order;
* the invariants hold: ISR ∩ ELR = ∅; |ISR| >= MinISR ⇒ ELR = LastKnownELR = ∅; the
  leader is an active ISR member or there is none; only assigned replicas are in the
  ISR, ELR or LastKnownELR, and only registered brokers in the ELR or LastKnownELR; no
  fenced broker is in an ISR; Unclean Exclusion; MinISR Recovery Quorum; a reassignment's
  shape (KIP-455: replicas = target + removing, adding ⊆ target); and 0 silent losses
  through a reassignment: a replica being added is in no ISR, ELR or LastKnownELR until an
  AlterPartition names it, and only an operator's election ever made one leader; and
* replaying the whole log from scratch, or from a msgpack snapshot plus the records after
  it, gives the same image.

Unclean Exclusion, as checked: a replica whose broker registered uncleanly is in no ISR or
ELR of a partition that existed at that registration, until a successful AlterPartition
names it in the ISR, or an unclean recovery (rule 7) or operator election elects it. The
last two are the documented exception of section 5.1.2 (log inspection elects a replica
the controller cannot vouch for), so the property is restricted to that premise.

MinISR Recovery Quorum, as checked: if a partition's ISR has had at least MinISR members
since its creation, its last unclean recovery (or operator election), its last
ClearElrRecord, the last ELR upgrade, or the last time a replica in its ISR, ELR or
LastKnownELR left the assignment or unregistered, then whenever its ISR and ELR are both
empty its LastKnownELR has at least MinISR members. (An unclean recovery starts a new
history with an ISR of one; a ClearElrRecord, written when min.insync.replicas changes or
ELR is downgraded, voids the ELR by design; a replica that leaves takes its guarantee.)

The machine's controller settings are its class attribute `CONFIG`, and the model follows
them: `test_properties_classic.py` runs the same machine under Kafka's classic rules
(`eligible_leader_replicas=False`, with and without `unclean_leader_election`), which the
model restates on its own (`Model.classic_change`, `elects_on_unfence`, `strategy_of`);
there Unclean Exclusion and "no fenced broker is in an ISR" do not hold by design, and
the classic machines check the classic invariants instead. The ELR feature level switches
either machine between the two sets of rules at run time; a partition whose state the
other rules made is checked by the current rules' invariants once they hold for it
(`Model.legacy`).

`KNOWN_CORE_BUGS` names what the core does against a rule the model states; each has a
strict xfail test at the end, and `test_lifecycle_planted.py` shows the machine catching a
planted bug in each lifecycle rule.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import ClassVar

import msgspec
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from controller.core.broker_handlers import register_broker, unfence_broker
from controller.core.config import ControllerConfig
from controller.core.handler_result import HandlerResult
from controller.core.lifecycle import Bootstrap
from controller.core.partition_change import build_change, next_elr, remove_from_isrs
from controller.core.recovery.policy import best_candidate
from controller.core.recovery.tracker import RecoveryTracker
from controller.core.step import ControllerState, Event, Rules, StepResult, Tick, settle
from controller.core.topic_handlers import create_topic
from controller.core.work import EVERYTHING, WORK_BUDGET
from metactl.errors import MetactlError
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.snapshot import (
    ImageSnapshot,
    from_snapshot,
    image_from_records,
    image_to_records,
    to_snapshot,
)
from metadata_image.state import EMPTY, PartitionState, TopicPartition
from metadata_log.records import (
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    NO_LEADER,
    BeginTransactionRecord,
    ChangeReason,
    ClearElrRecord,
    ElectionKind,
    LeaderRecoveryState,
    MetadataRecord,
    PartitionChangeRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    UncleanRecoveryRecord,
)
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreatePartitions,
    CreateTopic,
    DeleteTopic,
    DeleteTopicResponse,
    ElectLeader,
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.broker_controller import (
    AlterPartition,
    IsrMember,
    PartitionView,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import (
    Ack,
    ControlledShutdown,
    ControlledShutdownResponse,
    CreateTopicResponse,
    FenceBroker,
    ReplicaLogInfo,
    UnfenceBroker,
)

from .testkit import KNOWN_STRATEGIES, POLICIES, Cluster

CONTROLLER = settings.get_profile("metactl-controller")
WINDOW = 1000
BROKERS = (1, 2, 3, 4, 5)
RACKS = {1: "a", 2: "b", 3: "a", 4: "b", 5: None}
UNKNOWN_BROKER = 9
MAX_TOPICS = 6
STRATEGIES = (None, "balanced", "proactive", "manual")
CONFIG = ControllerConfig(unclean_recovery_window_ms=WINDOW, unclean_recovery_strategy="balanced")

# What the core does against a rule the model states (each found by this machine). While
# a name is here the model follows the core on that point only, so that the machine keeps
# checking everything else; each has a strict xfail test at the end
# that starts passing once the core is fixed: then drop the name here.
KNOWN_CORE_BUGS: frozenset[str] = frozenset(
    # None open. Fixed after this machine found them: a feature-level change re-evaluated
    # no recovery; an explicit add-partitions answer was padded with the existing
    # partitions; under the classic rules a reassignment could leave unassigned replicas
    # in the ISR; the ClearElr MinISR cap used the whole replica list; a removal-only
    # reassignment never completed.
)


def note(text: str) -> None:
    """`hypothesis.event` (statistics of what the examples reached), also callable when a
    test drives the machine by hand."""
    with contextlib.suppress(InvalidArgument):
        event(text)


# --- the model: the rules restated, independently of controller.core.partition_change -------------


@dataclass
class MBroker:
    epoch: int
    incarnation: str
    fenced: bool = True
    cs: bool = False
    clean: bool = True

    @property
    def active(self) -> bool:
        return not self.fenced and not self.cs


@dataclass
class MTopic:
    topic_id: str
    partitions: int
    min_isr: int | None  # the topic's own min.insync.replicas; None: the cluster's
    strategy: str | None  # as created; None: the controller's default


@dataclass
class MPartition:
    topic: str
    partition: int
    # During a reassignment (KIP-455): the target first, then the replicas being removed.
    replicas: tuple[int, ...]
    min_isr: int
    isr: frozenset[int]
    leader: int
    elr: frozenset[int] = EMPTY
    lkelr: frozenset[int] = EMPTY
    le: int = 0
    pe: int = 0
    recovering: bool = False
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def target(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def original(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.adding)


@dataclass
class MPending:
    since: int
    window_start: int
    answers: dict[int, RecoveryCandidate] = field(default_factory=dict)
    asked: dict[int, int] = field(default_factory=dict)  # broker -> epoch asked at


# The classic unclean election's name in the log (`--unclean-leader-election`).
CLASSIC_UNCLEAN_ELECTION = "unclean_leader_election"


class Model:
    """The rules restated. `classic` says whether Kafka's pre-KIP-966 rules apply: the
    finalized eligible.leader.replicas.version if there is one (`feature`), else the
    controller's `--eligible-leader-replicas`; `unclean` is its unclean leader election."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.unclean = config.unclean_leader_election
        self.feature: int | None = None  # the finalized eligible.leader.replicas.version
        self.cluster_min: int | None = None  # the dynamic cluster-default min.insync.replicas
        self.brokers: dict[int, MBroker] = {}
        self.topics: dict[str, MTopic] = {}
        self.parts: dict[TopicPartition, MPartition] = {}
        self.pending: dict[TopicPartition, MPending] = {}
        # Leaderless partitions: when they lost their last leader.
        self.offline_since: dict[TopicPartition, int] = {}
        # Invariant bookkeeping.
        self.tainted: dict[TopicPartition, set[int]] = {}
        # The tainted brokers that registered uncleanly while KIP-966's rules applied:
        # Unclean Exclusion holds for them even where the partition's state was made
        # under the classic rules (`legacy`), such as an ISR they were left in.
        self.excluded: dict[TopicPartition, set[int]] = {}
        self.reached_min: dict[TopicPartition, bool] = {}
        # Replicas an AlterPartition named in the ISR (or an operator elected) since they
        # joined the assignment: only these may be in the ISR, ELR or LastKnownELR while
        # a reassignment is adding them.
        self.vouched: dict[TopicPartition, set[int]] = {}
        # Partitions whose state was made under the other mode (ELR on/off): the mode's
        # own invariants wait until the state satisfies them (`partition_invariants`).
        self.legacy: set[TopicPartition] = set()
        self.ids_seen: set[str] = set()  # every topic id ever given

    @property
    def classic(self) -> bool:
        if self.feature is not None:
            return self.feature == 0
        return not self.config.eligible_leader_replicas

    def active(self, b: int) -> bool:
        m = self.brokers.get(b)
        return m is not None and m.active

    def hosted_by(self, b: int) -> list[MPartition]:
        return [p for p in self.parts.values() if b in p.replicas]

    def of_topic(self, name: str) -> list[MPartition]:
        return [self.parts[(name, i)] for i in range(self.topics[name].partitions)]

    def configured_default(self) -> int:
        """The cluster-default min.insync.replicas: the dynamic one, else the static one."""
        if self.cluster_min is not None:
            return self.cluster_min
        return self.config.default_min_insync_replicas

    def configured_min(self, topic: str) -> int:
        """The topic's min.insync.replicas: its own, else the cluster default."""
        own = self.topics[topic].min_isr
        return own if own is not None else self.configured_default()

    def add_partition(self, topic: str, i: int, a: list[int], configured: int) -> None:
        """A new partition (create, add partitions): every active replica in the ISR, the
        first active one leads, MinISR capped at the replication factor."""
        isr = frozenset(r for r in a if self.active(r))
        leader = next(r for r in a if self.active(r))
        p = MPartition(topic, i, tuple(a), min(configured, len(a)), isr, leader)
        self.parts[p.tp] = p
        self.tainted[p.tp] = set()
        self.excluded[p.tp] = set()
        self.reached_min[p.tp] = False
        self.vouched[p.tp] = set()
        self.note_isr(p)

    def drop_topic(self, name: str) -> None:
        for p in self.of_topic(name):
            for book in (
                self.parts,
                self.pending,
                self.offline_since,
                self.tainted,
                self.excluded,
            ):
                book.pop(p.tp, None)
            self.reached_min.pop(p.tp, None)
            self.vouched.pop(p.tp, None)
            self.legacy.discard(p.tp)
        del self.topics[name]

    # Rule 1 and rule 2, as the issue states them.
    def change(
        self,
        p: MPartition,
        new_isr: frozenset[int],
        *,
        excluded: frozenset[int] = EMPTY,
        recovered: bool = False,
        leaving: frozenset[int] = EMPTY,
        force: bool = False,
    ) -> bool:
        """The ISR becomes `new_isr` (rule 1) and a valid leader is kept or elected (rule
        2). `excluded` registered uncleanly (their ELR membership moves to the
        LastKnownELR); `leaving` leave the partition's ISR, ELR, LastKnownELR and
        leadership altogether (a reassignment drops them, or the broker unregistered)."""
        if self.classic:
            return self.classic_change(p, new_isr, recovered=recovered, force=force)
        old = p.isr
        elr = p.elr - excluded - leaving
        lkelr = (p.lkelr | (p.elr & excluded)) - leaving

        def rule1(n: frozenset[int]) -> tuple[frozenset[int], frozenset[int]]:
            if len(n) >= p.min_isr:
                return EMPTY, EMPTY
            # Those leaving the ISR join the ELR, but one that registered uncleanly goes
            # to the LastKnownELR instead (Unclean Exclusion, whatever put it in the ISR).
            joined = (elr | (old - n)) - n - leaving
            return frozenset(joined - excluded), frozenset((lkelr | (joined & excluded)) - n)

        isr = new_isr
        new_elr, new_lkelr = rule1(isr)
        if p.leader in isr and self.active(p.leader):
            leader = p.leader
        else:
            leader = next((r for r in p.replicas if r in isr and self.active(r)), NO_LEADER)
            if leader == NO_LEADER and not isr:
                leader = next((r for r in p.replicas if r in new_elr and self.active(r)), NO_LEADER)
                if leader != NO_LEADER:  # case B: from the ELR to the ISR, then rule 1
                    isr = frozenset({leader})
                    new_elr, new_lkelr = rule1(isr)
        return self.apply(p, leader, isr, new_elr, new_lkelr, recovered=recovered, force=force)

    def classic_change(
        self, p: MPartition, new_isr: frozenset[int], *, recovered: bool, force: bool = False
    ) -> bool:
        """Kafka's classic rules: no ELR or LastKnownELR; an ISR that would become empty
        keeps its members (the last one stays, inactive, and the partition has no leader);
        a valid leader stays, else the first active ISR member in assignment order."""
        isr = new_isr or frozenset(r for r in p.isr if r in p.replicas)
        if p.leader in isr and p.leader in p.replicas and self.active(p.leader):
            leader = p.leader
        else:
            leader = next((r for r in p.replicas if r in isr and self.active(r)), NO_LEADER)
        return self.apply(p, leader, isr, EMPTY, EMPTY, recovered=recovered, force=force)

    def apply(
        self,
        p: MPartition,
        leader: int,
        isr: frozenset[int],
        elr: frozenset[int],
        lkelr: frozenset[int],
        *,
        recovered: bool,
        force: bool = False,
    ) -> bool:
        """Write the change (if anything changes, or `force`: something else about the
        partition did), bumping the epochs as a record does."""
        recovering = p.recovering and not recovered
        if not force and (leader, isr, elr, lkelr, recovering) == (
            p.leader,
            p.isr,
            p.elr,
            p.lkelr,
            p.recovering,
        ):
            return False
        if leader != p.leader:
            p.le += 1
        p.pe += 1
        p.leader, p.isr, p.elr, p.lkelr, p.recovering = leader, isr, elr, lkelr, recovering
        self.note_isr(p)
        return True

    def note_isr(self, p: MPartition) -> None:
        if len(p.isr) >= p.min_isr:
            self.reached_min[p.tp] = True

    def recover(self, p: MPartition, chosen: int) -> None:
        """Rule 7's outcome: chosen leads alone, ELR and LastKnownELR empty, recovering."""
        p.leader, p.isr, p.elr, p.lkelr, p.recovering = (
            chosen,
            frozenset({chosen}),
            EMPTY,
            EMPTY,
            True,
        )
        p.le += 1
        p.pe += 1
        self.reached_min[p.tp] = len(p.isr) >= p.min_isr  # a new history starts
        self.tainted[p.tp].discard(chosen)
        self.excluded[p.tp].discard(chosen)
        self.offline_since.pop(p.tp, None)  # the outage ends: a later loss starts a new one

    def fence_changes(self, b: int) -> int:
        return sum(self.change(p, p.isr - {b}) for p in self.hosted_by(b) if b in p.isr)

    def elects_on_unfence(self, p: MPartition, b: int) -> bool:
        """Rule 4: an unfenced broker is elected where it is in the ELR of a leaderless
        partition (classic rules: in its ISR, where the last member stays; after an
        upgrade to ELR, a last ISR member kept by the classic rules is elected too)."""
        return p.leader == NO_LEADER and b in (p.isr if self.classic else p.isr | p.elr)

    def strategy_of(self, p: MPartition) -> str | None:
        """The recovery strategy that applies to `p`: the topic's (KIP-966), the classic
        unclean election, or none (classic rules without it)."""
        if self.classic:
            return CLASSIC_UNCLEAN_ELECTION if self.unclean else None
        return self.topics[p.topic].strategy or self.config.unclean_recovery_strategy

    # Rule 7's triggers.
    def trigger(self, p: MPartition) -> bool:
        strategy = self.strategy_of(p)
        if strategy == CLASSIC_UNCLEAN_ELECTION:
            # Kafka's unclean leader election: no leader and no live ISR member.
            return p.leader == NO_LEADER and not any(self.active(r) for r in p.isr)
        if p.leader != NO_LEADER or p.isr:
            return False
        if strategy == "balanced":
            return not p.elr
        if strategy == "proactive":
            return not any(self.active(r) for r in p.elr)
        return False

    def candidates(self, p: MPartition) -> frozenset[int]:
        """Whose log a recovery of `p` asks for (the classic election asks nobody). A
        replica a reassignment is adding is never one (it may not hold the acknowledged
        records); the LastKnownELR holds only replicas that were in the ISR."""
        strategy = self.strategy_of(p)
        if strategy is None or strategy == CLASSIC_UNCLEAN_ELECTION:
            return EMPTY
        if strategy == "balanced":
            return p.lkelr
        return frozenset(p.replicas) - frozenset(p.adding)

    def valid_answers(self, tp: TopicPartition) -> dict[int, RecoveryCandidate]:
        return {
            b: a
            for b, a in self.pending[tp].answers.items()
            if b in self.brokers and self.brokers[b].epoch == a.broker_epoch
        }

    # --- the lifecycle -----------------------------------------------------------------

    def clear(self, p: MPartition, configured: int | None) -> None:
        """KIP-966's clearing: the ELR and LastKnownELR go; with `configured` (a
        min.insync.replicas change), the effective MinISR becomes it capped at the target
        replication factor. The completeness history restarts (MinISR Recovery Quorum)."""
        min_isr = p.min_isr if configured is None else min(configured, len(p.target))
        if p.elr or p.lkelr:  # Kafka: only a partition whose ELR or LastKnownELR goes
            p.pe += 1
        p.elr, p.lkelr, p.min_isr = EMPTY, EMPTY, min_isr
        self.reached_min[p.tp] = len(p.isr) >= p.min_isr

    def switch_mode(self) -> None:
        """ELR tracking stopped or started: every partition's state was made under the
        other rules, and tracking starts afresh from the current ISRs."""
        self.legacy = set(self.parts)
        for p in self.parts.values():
            self.reached_min[p.tp] = len(p.isr) >= p.min_isr

    def move(
        self,
        p: MPartition,
        target: tuple[int, ...],
        adding: tuple[int, ...],
        removing: tuple[int, ...],
    ) -> bool:
        """KIP-455: `p` reassigned to `target` (its replicas become the target, then the
        replicas being removed); complete at once when every target replica is in the
        ISR. A replica that leaves the assignment leaves the ISR, ELR, LastKnownELR and
        leadership; the effective MinISR follows the target's replication factor."""
        replicas = target + removing
        if frozenset(target) <= p.isr:
            replicas, adding, removing = target, (), ()
        leaving = frozenset(p.replicas) - frozenset(replicas)
        voided = leaving & (p.isr | p.elr | p.lkelr)
        min_isr = min(self.configured_min(p.topic), len(target))
        moved = (replicas, adding, removing, min_isr) != (
            p.replicas,
            p.adding,
            p.removing,
            p.min_isr,
        )
        # A lower MinISR keeps what a higher one guaranteed; a higher one starts afresh.
        kept = self.reached_min[p.tp] and min_isr <= p.min_isr
        leader = p.leader
        p.replicas, p.adding, p.removing, p.min_isr = replicas, adding, removing, min_isr
        self.reached_min[p.tp] = kept
        changed = self.change(p, p.isr - leaving, leaving=leaving, force=moved)
        if changed and leaving and p.leader == leader != NO_LEADER:
            p.le += 1  # Kafka: the replicas lost a member, so the leader epoch moves too
        if voided:  # MinISR Recovery Quorum: the history restarts without them
            self.reached_min[p.tp] = False
        self.note_isr(p)
        self.vouched[p.tp] &= set(replicas)
        self.tainted[p.tp] &= set(replicas)
        self.excluded[p.tp] &= set(replicas)
        return changed

    def strands_isr(self, topic: str, number: int, target: list[int] | None) -> bool:
        """Whether reassigning the partition to `target` (None: cancelling) takes every
        replica that may hold its acknowledged records out of the assignment: every ISR
        member, or with the ISR empty every ELR member, or with both empty every
        LastKnownELR member (refused, in both modes)."""
        p = self.parts.get((topic, number))
        holders = p.isr or p.elr or p.lkelr if p is not None else EMPTY
        if p is None or not holders:
            return False
        if target is None:
            leaving = frozenset(p.adding)
        elif frozenset(target) <= p.isr:
            return False
        else:
            leaving = frozenset(p.replicas) - frozenset(target) - frozenset(p.original)
        return holders <= leaving

    def unregister(self, b: int) -> None:
        """KIP-966: an unregistered broker leaves every ISR, ELR and LastKnownELR (its
        replicas stay assigned); every partition that names it gets a record."""
        del self.brokers[b]
        for p in self.hosted_by(b):
            if b in p.isr | p.elr | p.lkelr:
                self.change(p, p.isr - {b}, leaving=frozenset({b}), force=True)
                # A recovery candidate is gone: MinISR Recovery Quorum's history restarts.
                self.reached_min[p.tp] = len(p.isr) >= p.min_isr


def model_best(p: MPartition, answers: list[RecoveryCandidate]) -> int | None:
    """Highest (last leader epoch, log end offset); ties to the earlier assigned replica."""
    if not answers:
        return None
    top = max((a.last_leader_epoch, a.log_end_offset) for a in answers)
    tied = {a.broker_id for a in answers if (a.last_leader_epoch, a.log_end_offset) == top}
    return next(r for r in p.replicas if r in tied)


def placement_order(image: ClusterImage) -> list[int]:
    """The active brokers in the order placement stripes over: by id, and with more than
    one rack, the racks alternating (their columns in rack-name order)."""
    active = sorted(b.broker_id for b in image.brokers.values() if b.active)
    columns: dict[str, list[int]] = {}
    for b in active:
        columns.setdefault(image.brokers[b].rack or "", []).append(b)
    if len(columns) <= 1:
        return active
    order: list[int] = []
    for row in itertools.zip_longest(*(columns[r] for r in sorted(columns))):
        order.extend(b for b in row if b is not None)
    return order


def placement_ok(image: ClusterImage, assignments: list[list[int]], rf: int) -> None:
    """Rule 9's default placement: striped round-robin over active brokers, rack-aware."""
    active = {b.broker_id for b in image.brokers.values() if b.active}
    for a in assignments:
        assert len(a) == rf == len(set(a)) and set(a) <= active
    for prev, nxt in itertools.pairwise(assignments):
        assert nxt[:-1] == prev[1:]  # striped: each partition shifts the previous by one
    leaders = [a[0] for a in assignments[: len(active)]]
    assert len(set(leaders)) == len(leaders)  # round robin over the active brokers
    racks: dict[str | None, int] = {}
    for b in active:
        racks[image.brokers[b].rack] = racks.get(image.brokers[b].rack, 0) + 1
    if len(set(racks.values())) == 1:  # evenly sized racks: each partition spans them
        for a in assignments:
            assert len({image.brokers[b].rack for b in a}) == min(rf, len(racks))


# --- the machine -------------------------------------------------------------------------


class ControllerMachine(RuleBasedStateMachine):
    # The controller's settings; the classic-mode machines (test_properties_classic.py)
    # override them, and the model follows.
    CONFIG = CONFIG
    # Partitions per event step (controller.core.work); the sliced machine below makes
    # every broker operation and creation a transaction of many slices.
    WORK_BUDGET: int | None = WORK_BUDGET
    # Transactions seen, by the kind of event that opened them (see `commit`).
    SLICED: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.step_rules = Rules(self.CONFIG, POLICIES, work_budget=self.WORK_BUDGET)
        # A fresh controller: its backlog is everything, so its first step looks at every
        # leaderless partition.
        self.state = ControllerState(ClusterImage())
        self.log: list[MetadataRecord] = []
        self.now = 0
        self.model = Model(self.CONFIG)
        self.snapshots: list[tuple[int, bytes]] = []
        self.incarnations = itertools.count(1)
        self.last: StepResult | None = None  # the last successful step, checked by evaluate
        # Elections of a replica a reassignment is adding, from outside the ISR, ELR and
        # LastKnownELR: (partition, replica, how); only an operator's may exist.
        self.adding_elections: list[tuple[TopicPartition, int, ElectionKind | None]] = []
        self.ids = (str(uuid.UUID(int=(7 << 64) + i)) for i in itertools.count(1))

    @property
    def image(self) -> ClusterImage:
        return self.state.image

    @property
    def tracker(self) -> RecoveryTracker:
        return self.state.tracker

    # --- plumbing -----------------------------------------------------------------------

    def commit(self, records: list[MetadataRecord], state: ControllerState) -> None:
        """Accept `state`, reached from the current one by `records`, checking every
        partition change's epochs on the way and that one batch replays the same."""
        image = self.image
        for r in records:
            before = (
                image.partitions.get((r.topic, r.partition))
                if isinstance(r, PartitionChangeRecord)
                else None
            )
            image = replay(image, (r,))
            if isinstance(r, PartitionChangeRecord):
                assert before is not None
                after = image.partitions[(r.topic, r.partition)]
                assert after.partition_epoch == before.partition_epoch + 1
                # Kafka's rule: the leader epoch moves with the leader, and when the
                # replicas lose a member (a reassignment completed or cancelled).
                shrunk = after.leader != NO_LEADER and not frozenset(after.replicas) >= frozenset(
                    before.replicas
                )
                bump = 1 if after.leader != before.leader or shrunk else 0
                assert after.leader_epoch == before.leader_epoch + bump
                assert (r.leader is not None) == (after.leader != before.leader)
                known = before.isr | before.elr | before.last_known_elr
                if after.leader in before.adding and after.leader not in known:
                    self.adding_elections.append((after.tp, after.leader, r.election))
            elif isinstance(r, BeginTransactionRecord):
                # Which operations ran as transactions of several slices (the sliced machine
                # must reach each lifecycle continuation).
                type(self).SLICED[r.name.split(" ")[0]] += 1
        assert image.same_state(replay(self.image, records))  # batching does not matter
        assert image.same_state(state.image)
        assert image.end_offset == state.image.end_offset
        self.state = state
        self.log.extend(records)

    def attempt(self, event: Event, expected: str | None) -> HandlerResult | None:
        """Submit `event` through the one step; it must fail with exactly `expected` (a
        code), changing nothing, or succeed. Returns the event's own records (the step's
        recovery records follow them, and `evaluate` checks those) and the response."""
        assert self.last is None, "the previous step's recovery part was not checked"
        state = self.state
        before = image_to_records(self.image), self.image.end_offset, self.tracker
        try:
            # The event, its continuations and the Ticks that drain the recovery backlog.
            result = settle(state, event, self.now, self.step_rules)
        except MetactlError as e:
            assert expected == e.code, f"expected {expected}, got {e!r}"
            assert self.state is state
            assert (image_to_records(self.image), self.image.end_offset, self.tracker) == before
            return None
        assert expected is None, f"expected {expected}, got success {result.response!r}"
        assert 0 <= result.recovery_records <= len(result.records)
        self.commit(result.records, result.state)
        self.last = result
        own = result.records[: len(result.records) - result.recovery_records]
        return HandlerResult(own, result.response)

    def after_action(self) -> None:
        """Check the recovery evaluation of the step just taken against the model, once
        the model has applied the event itself."""
        assert self.last is not None
        self.evaluate(self.last)
        self.last = None

    def broker_ids(self) -> list[int]:
        return sorted(self.model.brokers)

    def pick_partition(self, i: int) -> MPartition:
        parts = sorted(self.model.parts)
        return self.model.parts[parts[i % len(parts)]]

    # --- set-up ---------------------------------------------------------------------------

    @initialize(n=st.integers(3, 5))
    def start_cluster(self, n: int) -> None:
        for b in BROKERS[:n]:
            self.do_register(b, "unclean")
            self.do_unfence(b, stale=False)
        for name, strategy in (("bal", "balanced"), ("pro", "proactive"), ("man", "manual")):
            self.do_create(name, partitions=None, rf=3, min_isr=2, strategy=strategy, explicit=None)
        self.take_snapshot()

    # --- brokers --------------------------------------------------------------------------

    @rule(
        b=st.sampled_from(BROKERS),
        how=st.sampled_from(["clean", "unclean", "stale", "retry", "bogus"]),
    )
    def register(self, b: int, how: str) -> None:
        self.do_register(b, how)

    def do_register(self, b: int, how: str) -> None:
        m = self.model
        existing = m.brokers.get(b)
        incarnation = f"b{b}-{next(self.incarnations)}"
        previous: int | None = None
        if existing is not None:
            previous = {
                "clean": existing.epoch,
                "unclean": None,
                "stale": existing.epoch - 1,
                "retry": existing.epoch,
                "bogus": 10**9,
            }[how]
            if how == "retry":
                incarnation = existing.incarnation
        elif how in ("stale", "bogus", "clean"):
            previous = 7
        request = RegisterBroker(
            broker_id=b, incarnation_id=incarnation, previous_epoch=previous, rack=RACKS[b]
        )
        base = self.image.end_offset
        # The model's expectation.
        if existing is not None and existing.incarnation == incarnation:
            result = self.attempt(request, None)
            assert result is not None
            assert result.records == []
            assert result.response == RegisterBrokerResponse(
                broker_epoch=existing.epoch, clean=existing.clean
            )
            self.after_action()
            return
        if existing is not None and existing.active:
            self.attempt(request, "DUPLICATE_BROKER_REGISTRATION")
            return
        result = self.attempt(request, None)
        assert result is not None
        extra = 0
        if existing is not None and not existing.fenced:  # in controlled shutdown
            existing.fenced = True
            extra = 1 + m.fence_changes(b)
        clean = (
            previous is not None and previous == existing.epoch
            if existing is not None
            else not m.hosted_by(b)
        )
        hosted = sum(1 for p in m.parts.values() if b in p.replicas)
        if not clean and self.WORK_BUDGET is not None and hosted > self.WORK_BUDGET:
            # Its ELR work is larger than one event's budget: a transaction, whose begin
            # marker comes first (the epoch is the registration record's offset).
            extra += 1
        epoch = base + extra
        assert result.response == RegisterBrokerResponse(broker_epoch=epoch, clean=clean)
        record = self.log[epoch]
        assert isinstance(record, RegisterBrokerRecord) and record.broker_epoch == epoch
        m.brokers[b] = MBroker(epoch=epoch, incarnation=incarnation, clean=clean)
        if not clean:
            for p in m.hosted_by(b):
                m.tainted[p.tp].add(b)
                if not m.classic:
                    # KIP-966 (KAFKA-18106): out of every ISR and ELR, whatever put it
                    # there (an ISR the classic rules left it in before an upgrade too).
                    m.excluded[p.tp].add(b)
                    if b in p.elr | p.isr:
                        m.change(p, p.isr - {b}, excluded=frozenset({b}))
        self.after_action()

    @rule(b=st.sampled_from(BROKERS), clean=st.booleans(), unfence=st.booleans())
    def restart(self, b: int, clean: bool, unfence: bool) -> None:
        """A broker process restarts: its session expires (fence), it registers a new
        incarnation (presenting its epoch only after a clean shutdown) and may unfence."""
        if b in self.model.brokers:
            self.fence(b)
        self.do_register(b, "clean" if clean else "unclean")
        if unfence:
            self.do_unfence(b, stale=False)

    @rule(
        fence_order=st.permutations(BROKERS),
        restart_order=st.permutations(BROKERS),
        clean=st.lists(st.booleans(), min_size=len(BROKERS), max_size=len(BROKERS)),
    )
    def outage(self, fence_order: list[int], restart_order: list[int], clean: list[bool]) -> None:
        """Every broker goes down (fenced one by one, as in 5.3.3) and comes back."""
        registered = set(self.model.brokers)
        for b in fence_order:
            if b in registered:
                self.fence(b)
        for b in restart_order:
            if b in registered:
                self.do_register(b, "clean" if clean[b - 1] else "unclean")
                self.do_unfence(b, stale=False)

    @rule(b=st.sampled_from((*BROKERS, UNKNOWN_BROKER)))
    def fence(self, b: int) -> None:
        m = self.model
        request = FenceBroker(broker_id=b)
        if b not in m.brokers:
            self.attempt(request, "BROKER_ID_NOT_REGISTERED")
            return
        result = self.attempt(request, None)
        assert result is not None
        if m.brokers[b].fenced:
            assert result.records == []
        else:
            m.brokers[b].fenced = True
            m.fence_changes(b)
        self.after_action()

    @rule(b=st.sampled_from((*BROKERS, UNKNOWN_BROKER)), stale=st.booleans())
    def unfence(self, b: int, stale: bool) -> None:
        self.do_unfence(b, stale)

    def do_unfence(self, b: int, stale: bool) -> None:
        m = self.model
        epoch = m.brokers[b].epoch if b in m.brokers else 0
        request = UnfenceBroker(broker_id=b, broker_epoch=epoch - 1 if stale else epoch)
        if b not in m.brokers:
            self.attempt(request, "BROKER_ID_NOT_REGISTERED")
            return
        if stale:
            self.attempt(request, "STALE_BROKER_EPOCH")
            return
        result = self.attempt(request, None)
        assert result is not None
        if not m.brokers[b].fenced:
            assert result.records == []
        else:
            m.brokers[b].fenced = False
            for p in m.hosted_by(b):
                unclean = not m.classic and not m.brokers[b].clean
                if m.elects_on_unfence(p, b) and unclean and b in p.isr:
                    # A classic ISR and a classic unclean registration before the ELR
                    # upgrade: no clean leader under KIP-966's rules (Unclean Exclusion).
                    m.excluded[p.tp].add(b)
                    m.change(p, p.isr - {b}, excluded=frozenset({b}))
                    continue
                if m.elects_on_unfence(p, b):
                    m.change(p, p.isr)
        self.after_action()

    @rule(b=st.sampled_from((*BROKERS, UNKNOWN_BROKER)), stale=st.booleans())
    def shutdown(self, b: int, stale: bool) -> None:
        m = self.model
        epoch = m.brokers[b].epoch if b in m.brokers else 0
        request = ControlledShutdown(broker_id=b, broker_epoch=epoch - 1 if stale else epoch)
        if b not in m.brokers:
            self.attempt(request, "BROKER_ID_NOT_REGISTERED")
            return
        if stale:
            self.attempt(request, "STALE_BROKER_EPOCH")
            return
        result = self.attempt(request, None)
        assert result is not None
        if m.brokers[b].cs:
            assert result.records == []
        else:
            m.brokers[b].cs = True
            m.fence_changes(b)
        can_stop = not any(p.leader == b for p in m.parts.values())
        assert result.response == ControlledShutdownResponse(can_stop=can_stop)
        self.after_action()

    # --- partitions -----------------------------------------------------------------------

    @precondition(lambda self: len(self.model.topics) < MAX_TOPICS)
    @rule(
        name=st.sampled_from(["t1", "t2", "t3", "bal", "pro", "bad name"]),
        partitions=st.one_of(st.none(), st.integers(0, 3)),
        rf=st.integers(0, 5),
        min_isr=st.one_of(st.none(), st.integers(0, 4)),
        strategy=st.sampled_from((*STRATEGIES, "yolo")),
        explicit=st.one_of(
            st.none(),
            st.lists(
                st.lists(st.sampled_from((*BROKERS, UNKNOWN_BROKER)), min_size=0, max_size=4),
                min_size=0,
                max_size=3,
            ),
        ),
        topic_id=st.sampled_from(["drawn", "drawn", "none", "taken"]),
    )
    def create(
        self,
        *,
        name: str,
        partitions: int | None,
        rf: int,
        min_isr: int | None,
        strategy: str | None,
        explicit: list[list[int]] | None,
        topic_id: str,
    ) -> None:
        self.do_create(
            name,
            partitions=partitions,
            rf=rf,
            min_isr=min_isr,
            strategy=strategy,
            explicit=explicit,
            topic_id=topic_id,
        )

    def do_create(
        self,
        name: str,
        *,
        partitions: int | None,
        rf: int,
        min_isr: int | None,
        strategy: str | None,
        explicit: list[list[int]] | None,
        topic_id: str = "drawn",
    ) -> None:
        """Rule 9. The topic id is drawn by the driver (here: a fresh one, or one already
        taken), or derived when the caller has no randomness (None)."""
        m = self.model
        taken = sorted(t.topic_id for t in m.topics.values())
        tid = {"drawn": next(self.ids), "none": None, "taken": taken[0] if taken else None}[
            topic_id
        ]
        request = CreateTopic(
            name=name,
            partitions=partitions,
            replication_factor=rf,
            assignments=explicit,
            min_isr=min_isr,
            recovery_strategy=strategy,
            topic_id=tid,
        )
        n_active = sum(1 for b in m.brokers.values() if b.active)
        configured = min_isr if min_isr is not None else m.configured_default()
        expected: str | None = None
        if name == "bad name":
            expected = "INVALID_TOPIC_EXCEPTION"
        elif name in m.topics:
            expected = "TOPIC_ALREADY_EXISTS"
        elif strategy is not None and strategy not in KNOWN_STRATEGIES:
            expected = "UNKNOWN_RECOVERY_POLICY"
        elif configured < 1:
            expected = "INVALID_CONFIG"
        elif explicit is not None:
            if not explicit:
                expected = "INVALID_REPLICA_ASSIGNMENT"
            elif partitions is not None and partitions != len(explicit):
                expected = "INVALID_REQUEST"
            else:
                for a in explicit:
                    if (
                        not a
                        or len(set(a)) != len(a)
                        or any(r not in m.brokers for r in a)
                        or not any(m.active(r) for r in a)
                    ):
                        expected = "INVALID_REPLICA_ASSIGNMENT"
                        break
        elif partitions is not None and partitions < 1:
            expected = "INVALID_PARTITIONS"
        elif rf < 1 or rf > n_active:
            expected = "INVALID_REPLICATION_FACTOR"
        if expected is None and tid is not None and tid in taken:
            expected = "TOPIC_ALREADY_EXISTS"  # the id is taken: the driver draws again
        # A min ISR above the RF is accepted, as in Kafka (effective: capped at the RF).
        result = self.attempt(request, expected)
        if result is None:
            return
        response = result.response
        assert isinstance(response, CreateTopicResponse)
        if tid is not None:
            assert response.topic_id == tid
        else:  # derived: still never an id any topic had before
            assert response.topic_id not in m.ids_seen
        m.ids_seen.add(response.topic_id)
        if explicit is not None:
            assert response.assignments == explicit
        else:
            assert len(response.assignments) == (partitions or self.CONFIG.default_partitions)
            placement_ok(self.image, response.assignments, rf)
            order = placement_order(self.image)
            assert response.assignments == [
                [order[(i + j) % len(order)] for j in range(rf)]
                for i in range(len(response.assignments))
            ]
        m.topics[name] = MTopic(response.topic_id, len(response.assignments), min_isr, strategy)
        for i, a in enumerate(response.assignments):
            m.add_partition(name, i, a, configured)
        self.after_action()

    @precondition(lambda self: self.model.parts)
    @rule(
        i=st.integers(0, 100),
        shape=st.sampled_from(["shrink", "expand", "any"]),
        pick=st.lists(st.sampled_from((*BROKERS, UNKNOWN_BROKER)), max_size=4),
        sender=st.sampled_from(["leader", "leader", "other", "unknown"]),
        faults=st.one_of(
            st.just(frozenset()),
            st.frozensets(
                st.sampled_from(
                    ["sender_epoch", "leader_epoch", "partition_epoch", "member_epoch", "partition"]
                ),
                max_size=2,
            ),
        ),
        with_leader_epoch=st.booleans(),
        recovered=st.booleans(),
    )
    def alter(
        self,
        *,
        i: int,
        shape: str,
        pick: list[int],
        sender: str,
        faults: frozenset[str],
        with_leader_epoch: bool,
        recovered: bool,
    ) -> None:
        m = self.model
        led = sorted(tp for tp, x in m.parts.items() if x.leader != NO_LEADER)
        p = m.parts[led[i % len(led)]] if led and sender == "leader" else self.pick_partition(i)
        registered = self.broker_ids()
        if sender == "leader" and p.leader != NO_LEADER:
            src = p.leader
        elif sender == "unknown" or not registered:
            src = UNKNOWN_BROKER
        else:
            src = registered[(i + len(pick)) % len(registered)]
        if shape == "shrink":
            members = [r for r in p.replicas if r in p.isr and (r in pick or r == src)]
        elif shape == "expand":  # the leader adds caught-up (active) replicas
            members = sorted(p.isr | {r for r in pick if r in p.replicas and m.active(r)} | {src})
        else:
            members = list(pick)
        epoch_of = {b: m.brokers[b].epoch for b in registered}
        isr = [IsrMember(broker_id=r, broker_epoch=epoch_of.get(r, -1)) for r in members]
        if "member_epoch" in faults and isr:
            isr[-1] = IsrMember(broker_id=isr[-1].broker_id, broker_epoch=isr[-1].broker_epoch + 1)
        request = AlterPartition(
            topic=p.topic,
            partition=p.partition + (10 if "partition" in faults else 0),
            leader=src,
            broker_epoch=epoch_of.get(src, -1) - (1 if "sender_epoch" in faults else 0),
            partition_epoch=p.pe - (1 if "partition_epoch" in faults else 0),
            isr=isr,
            leader_epoch=(p.le + (1 if "leader_epoch" in faults else 0))
            if with_leader_epoch
            else None,
            recovered=recovered,
        )
        # The documented validation order.
        target = {x.broker_id for x in isr}
        expected: str | None = None
        if len(target) < len(isr):
            # A replica named twice (the "any" shape's picks may repeat): Kafka's
            # INVALID_REQUEST, from the field checks, before anything else is looked at.
            expected = "INVALID_REQUEST"
        elif "partition" in faults:
            expected = "UNKNOWN_TOPIC_OR_PARTITION"
        elif src not in m.brokers:
            expected = "BROKER_ID_NOT_REGISTERED"
        elif request.broker_epoch != m.brokers[src].epoch:
            expected = "STALE_BROKER_EPOCH"
        elif p.leader != src:
            expected = "NOT_LEADER_OR_FOLLOWER"
        elif request.leader_epoch is not None and request.leader_epoch != p.le:
            expected = "FENCED_LEADER_EPOCH"
        elif request.partition_epoch != p.pe:
            expected = "INVALID_UPDATE_VERSION"
        elif any(
            x.broker_id not in p.replicas
            or not m.active(x.broker_id)
            or m.brokers[x.broker_id].epoch != x.broker_epoch
            for x in isr
        ):
            expected = "INELIGIBLE_REPLICA"
        elif src not in target or (len(target) > 1 and not recovered and p.recovering):
            expected = "INVALID_REQUEST"
        result = self.attempt(request, expected)
        if result is None:
            return
        changed = m.change(p, frozenset(target), recovered=recovered)
        for r in target:
            m.tainted[p.tp].discard(r)
            m.excluded[p.tp].discard(r)
        m.vouched[p.tp] |= target
        if changed and (p.adding or p.removing) and frozenset(p.target) <= p.isr:
            # KIP-455: every target replica is in the ISR: the reassignment completes, in a
            # second record.
            assert len(result.records) == 2, result.records
            m.move(p, p.target, (), ())
            note("reassignment completed by an AlterPartition")
        else:
            assert len(result.records) == int(changed)
        assert result.response == model_view(p)
        self.after_action()

    @precondition(lambda self: self.model.parts)
    @rule(
        i=st.integers(0, 100),
        shape=st.sampled_from(["shrink", "expand"]),
        pick=st.lists(st.sampled_from(BROKERS), max_size=4),
        recovered=st.booleans(),
    )
    def isr_change(self, i: int, shape: str, pick: list[int], recovered: bool) -> None:
        """A well-formed AlterPartition from the current leader (shrink or catch-up)."""
        self.alter(
            i=i,
            shape=shape,
            pick=pick,
            sender="leader",
            faults=frozenset(),
            with_leader_epoch=True,
            recovered=recovered,
        )

    @precondition(lambda self: self.model.parts)
    @rule(i=st.integers(0, 100), unknown=st.booleans())
    def elect_preferred(self, i: int, unknown: bool) -> None:
        p = self.pick_partition(i)
        request = ElectLeader(
            topic=p.topic, partition=p.partition + (10 if unknown else 0), election_type="preferred"
        )
        preferred = p.replicas[0]
        expected: str | None = None
        if unknown:
            expected = "UNKNOWN_TOPIC_OR_PARTITION"
        elif p.leader == preferred:
            expected = "ELECTION_NOT_NEEDED"
        elif preferred not in p.isr or not self.model.active(preferred):
            expected = "PREFERRED_LEADER_NOT_AVAILABLE"
        result = self.attempt(request, expected)
        if result is None:
            return
        p.leader = preferred
        p.le += 1
        p.pe += 1
        assert result.response == model_view(p)
        self.after_action()

    @precondition(lambda self: self.model.parts)
    @rule(i=st.integers(0, 100), replica=st.one_of(st.none(), st.sampled_from((*BROKERS, 9))))
    def elect_unclean(self, i: int, replica: int | None) -> None:
        m = self.model
        p = self.pick_partition(i)
        request = ElectLeader(
            topic=p.topic, partition=p.partition, election_type="unclean", replica=replica
        )
        expected: str | None = None
        if p.leader != NO_LEADER:
            expected = "ELECTION_NOT_NEEDED"
        elif replica is None:
            expected = "INVALID_REQUEST"
        elif replica not in p.replicas or not m.active(replica):
            expected = "INELIGIBLE_REPLICA"
        result = self.attempt(request, expected)
        if result is None:
            return
        assert replica is not None
        audit, change = result.records
        assert isinstance(audit, UncleanRecoveryRecord)
        assert isinstance(change, PartitionChangeRecord)
        assert (audit.strategy, audit.trigger, audit.chosen) == ("manual", "operator", replica)
        assert (change.leader, change.isr) == (replica, [replica])
        assert change.recovery_state is LeaderRecoveryState.RECOVERING
        mp = m.pending.get(p.tp)
        assert audit.offline_since_ms == m.offline_since[p.tp]
        assert {c.broker_id for c in audit.candidates} == (
            set(m.valid_answers(p.tp)) if mp is not None else set()
        )
        assert p.tp not in self.tracker.pending
        m.pending.pop(p.tp, None)
        m.recover(p, replica)
        m.vouched[p.tp].add(replica)  # the operator's choice, logged as a potential loss
        self.after_action()

    @precondition(lambda self: self.model.topics)
    @rule(
        i=st.integers(0, 100), tick=st.booleans(), first=st.integers(0, 3), span=st.integers(0, 4)
    )
    def clear_elr(self, i: int, tick: bool, first: int, span: int) -> None:
        """A ClearElrRecord no event produced (a range of one topic's partitions, MinISR
        unchanged): the state absorbs it, and the next step (a tick now, or whatever event
        comes next) evaluates what it changed. The controller writes the same record for
        a min.insync.replicas change or an ELR downgrade (`alter_configs`,
        `update_feature`)."""
        m = self.model
        topic = sorted(m.topics)[i % len(m.topics)]
        end = None if span == 0 else first + span
        records: list[MetadataRecord] = [ClearElrRecord(topic=topic, first=first, end=end)]
        was_queued = self.state.backlog
        state, _ = self.state.absorb(records)
        self.commit(records, state)
        changed = set()
        for p in m.of_topic(topic):
            if p.partition >= first and (end is None or p.partition < end):
                if p.elr or p.lkelr:
                    changed.add(p.tp)
                m.clear(p, None)
        # What the next step must look at: every changed partition that is leaderless or
        # known to the recovery tracker (a led one without either has nothing to end).
        assert state.backlog.everything == was_queued.everything
        if not was_queued.everything:
            t = self.tracker
            known = {
                tp
                for tp in changed
                if m.parts[tp].leader == NO_LEADER
                or tp in t.offline
                or tp in t.pending
                or tp in t.wake_of
            }
            assert set(state.backlog) == set(was_queued) | known
        if tick:
            self.attempt(Tick(), None)
            self.after_action()

    # --- the lifecycle: configs, features, delete, add partitions, reassignment, unregister ----

    @rule(
        where=st.sampled_from(
            [
                "topic",
                "topic",
                "topic",
                "cluster",
                "cluster",
                "cluster",
                "unknown",
                "bad",
                "broker",
                "other",
            ]
        ),
        i=st.integers(0, 100),
        op=st.sampled_from(["set", "set", "set", "delete", "both", "foreign", "none"]),
        value=st.sampled_from(["same", "same", "1", "2", "3", "4", " 2", "0", "-1", "x"]),
    )
    def alter_configs(self, where: str, i: int, op: str, value: str) -> None:
        """kafka-configs --alter of min.insync.replicas, of a topic or of the cluster
        default. KIP-966: a topic's change clears that topic's ELRs and LastKnownELRs, a
        cluster-default change (even to the same value) every topic's; each cleared
        partition's MinISR becomes the new configured value capped at its target
        replication factor."""
        m = self.model
        topics = sorted(m.topics)
        resource_type, name = {
            "topic": ("topic", topics[i % len(topics)] if topics else "zz"),
            "cluster": ("broker", ""),
            "unknown": ("topic", "zz"),
            "bad": ("topic", "bad name"),
            "broker": ("broker", "1"),
            "other": ("cluster", ""),
        }[where]
        if value == "same":  # the value in force (for a topic: its own, else the default's)
            if resource_type == "topic" and name in m.topics:
                value = str(m.configured_min(name))
            else:
                value = str(m.configured_default())
        set_configs: dict[str, str] = {}
        delete_configs: list[str] = []
        if op in ("set", "both"):
            set_configs[MIN_ISR_CONFIG] = value
        if op in ("delete", "both"):
            delete_configs.append(MIN_ISR_CONFIG)
        if op == "foreign":
            set_configs["retention.ms"] = "1000"
        request = AlterConfigs(
            resource_type=resource_type,
            resource_name=name,
            set_configs=set_configs,
            delete_configs=delete_configs,
        )
        number = value.strip().lstrip("-")
        expected: str | None = None
        if resource_type not in ("topic", "broker"):
            expected = "INVALID_REQUEST"
        elif name == "bad name":
            expected = "INVALID_TOPIC_EXCEPTION"
        elif op == "both":
            expected = "INVALID_REQUEST"
        elif op == "foreign":
            expected = "INVALID_CONFIG"
        elif op == "none":
            expected = "INVALID_REQUEST"
        elif op == "set" and (not number.isdigit() or int(value) < 1):
            expected = "INVALID_CONFIG"
        elif resource_type == "topic" and name not in m.topics:
            expected = "UNKNOWN_TOPIC_OR_PARTITION"
        elif resource_type == "broker" and name != "":
            expected = "INVALID_CONFIG"  # as Kafka under ELR (metactl keeps none at 0)
        elif resource_type == "broker" and op == "delete":
            expected = "INVALID_CONFIG"  # the cluster default cannot be deleted
        result = self.attempt(request, expected)
        if result is None:
            return
        new = int(value) if op == "set" else None
        if resource_type == "topic" and m.topics[name].min_isr == new:
            # Kafka writes no ConfigRecord for a value that does not change, so nothing
            # is cleared (only the cluster default clears "even to the same value").
            assert result.records == []
            cleared = []
        elif resource_type == "topic":
            m.topics[name].min_isr = new
            cleared = [name]
        else:
            assert new is not None
            m.cluster_min = new
            cleared = topics
        for t in cleared:
            configured = m.configured_min(t)
            for p in m.of_topic(t):
                m.clear(p, configured)
        assert result.response == AlterConfigsResponse(
            resource_type=resource_type, resource_name=name, cleared_topics=len(cleared)
        )
        self.after_action()

    @rule()
    def reapply_cluster_default(self) -> None:
        """The cluster default set to the value it has: KIP-966 still clears every
        topic's ELR and LastKnownELR (an operator's way to void them all)."""
        self.alter_configs(where="cluster", i=0, op="set", value="same")

    @rule(
        name=st.sampled_from([ELR_FEATURE, ELR_FEATURE, ELR_FEATURE, "metadata.version"]),
        level=st.sampled_from([0, 1, 0, 1, 2, -1]),
        upgrade_type=st.sampled_from(["upgrade", "downgrade"]),
    )
    def update_feature(self, name: str, level: int, upgrade_type: str) -> None:
        """kafka-features: a downgrade of eligible.leader.replicas.version to 0 switches
        to the classic rules and clears every ELR and LastKnownELR; an upgrade to 1
        resumes KIP-966's rules from the current ISRs, changing nothing else."""
        m = self.model
        current = 0 if m.classic else 1
        request = UpdateFeature(name=name, level=level, upgrade_type=upgrade_type)  # type: ignore[arg-type]
        expected: str | None = None
        if (
            name != ELR_FEATURE
            or not 0 <= level <= 1
            or (upgrade_type == "upgrade" and level < current)
            or (upgrade_type == "downgrade" and level > current)
            or (level == 1 and m.unclean)
        ):
            expected = "INVALID_REQUEST"
        result = self.attempt(request, expected)
        if result is None:
            return
        cleared = 0
        if m.feature == level:
            assert result.records == []
        else:
            m.feature = level
            if level != current:
                if level == 0:
                    for p in m.parts.values():
                        m.clear(p, None)
                    cleared = len(m.topics)
                m.switch_mode()
                note(f"ELR feature switched to {level}")
                if "feature_change_evaluates_nothing" in KNOWN_CORE_BUGS:
                    self.look_at_everything()
        assert result.response == UpdateFeatureResponse(
            name=name, level=level, cleared_topics=cleared
        )
        self.after_action()

    def look_at_everything(self) -> None:
        """Evaluate every leaderless partition and every recovery the tracker knows, at
        once, as part of the step just taken (what the core should do when the rules
        change under them; see KNOWN_CORE_BUGS)."""
        first = self.last
        assert first is not None
        state = msgspec.structs.replace(self.state, backlog=EVERYTHING)
        again = settle(state, Tick(), self.now, self.step_rules)
        self.commit(again.records, again.state)
        self.last = msgspec.structs.replace(
            again,
            records=first.records + again.records,
            inspections=first.inspections + again.inspections,
            recovery_records=first.recovery_records + len(again.records),
        )

    @rule()
    def bootstrap(self) -> None:
        """What a controller becoming active writes when the log holds neither: the ELR
        level and the cluster-default min.insync.replicas from its static settings (they
        change no rule's outcome)."""
        m = self.model
        result = self.attempt(Bootstrap(), None)
        assert result is not None and result.response == Ack()
        assert len(result.records) == (m.feature is None) + (m.cluster_min is None)
        if m.feature is None:
            m.feature = 0 if m.classic else 1
        if m.cluster_min is None:
            m.cluster_min = self.CONFIG.default_min_insync_replicas
        self.after_action()

    @rule(i=st.integers(0, 100), which=st.sampled_from(["known", "known", "unknown", "bad"]))
    def delete_topic(self, i: int, which: str) -> None:
        """kafka-topics --delete: the topic, its partitions, their pending recoveries and
        everything the tracker noted go; a topic created again under the name is new."""
        m = self.model
        topics = sorted(m.topics)
        name = {"known": topics[i % len(topics)] if topics else "zz", "unknown": "zz"}.get(
            which, "bad name"
        )
        expected: str | None = None
        if name == "bad name":
            expected = "INVALID_TOPIC_EXCEPTION"
        elif name not in m.topics:
            expected = "UNKNOWN_TOPIC_OR_PARTITION"
        result = self.attempt(DeleteTopic(name=name), expected)
        if result is None:
            return
        assert result.response == DeleteTopicResponse(name=name, topic_id=m.topics[name].topic_id)
        m.drop_topic(name)
        self.after_action()

    @precondition(lambda self: self.model.topics)
    @rule(i=st.integers(0, 100), derived=st.booleans())
    def recreate(self, i: int, derived: bool) -> None:
        """A topic deleted and created again under its name is a different topic: a new
        id (drawn by the driver, or derived without randomness) and no old state."""
        name = sorted(self.model.topics)[i % len(self.model.topics)]
        old = self.model.topics[name].topic_id
        self.delete_topic(i, "known")
        active = sum(1 for b in self.model.brokers.values() if b.active)
        self.do_create(
            name,
            partitions=2,
            rf=min(2, max(1, active)),
            min_isr=None,
            strategy=None,
            explicit=None,
            topic_id="none" if derived else "drawn",
        )
        if name in self.model.topics:
            assert self.model.topics[name].topic_id != old

    @rule(
        i=st.integers(0, 100),
        which=st.sampled_from(["known", "known", "known", "unknown", "bad"]),
        more=st.sampled_from([1, 1, 2, 3, 0, -1, -5]),
        explicit=st.one_of(
            st.none(),
            st.none(),
            st.lists(
                st.lists(st.sampled_from((*BROKERS, UNKNOWN_BROKER)), min_size=0, max_size=4),
                min_size=0,
                max_size=3,
            ),
        ),
    )
    def create_partitions(
        self, i: int, which: str, more: int, explicit: list[list[int]] | None
    ) -> None:
        """kafka-topics --alter --partitions: the topic grows, its new partitions placed
        as at create (striped over the active brokers from the new partition's index,
        with the replication factor of its partition 0's target); a count that is not
        larger is INVALID_PARTITIONS."""
        m = self.model
        topics = sorted(m.topics)
        name = {"known": topics[i % len(topics)] if topics else "zz", "unknown": "zz"}.get(
            which, "bad name"
        )
        t = m.topics.get(name)
        current = t.partitions if t is not None else 1
        count = current + more
        if explicit is not None and more > 0 and len(explicit) < 3:  # (3: a count mismatch)
            explicit = (explicit * more)[:more]
        request = CreatePartitions(topic=name, count=count, assignments=explicit)
        n_active = sum(1 for b in m.brokers.values() if b.active)
        expected: str | None = None
        rf = 0
        if name == "bad name":
            expected = "INVALID_TOPIC_EXCEPTION"
        elif count < 1:
            expected = "INVALID_PARTITIONS"
        elif t is None:
            expected = "UNKNOWN_TOPIC_OR_PARTITION"
        elif count <= current:
            expected = "INVALID_PARTITIONS"
        elif explicit is not None:
            if len(explicit) != more:
                expected = "INVALID_REPLICA_ASSIGNMENT"
            for a in explicit:
                if (
                    not a
                    or len(set(a)) != len(a)
                    or any(r not in m.brokers for r in a)
                    or not any(m.active(r) for r in a)
                ):
                    expected = "INVALID_REPLICA_ASSIGNMENT"
        else:
            rf = len(m.parts[(name, 0)].target)
            if rf > n_active:
                expected = "INVALID_REPLICATION_FACTOR"
        order = placement_order(self.image)
        result = self.attempt(request, expected)
        if result is None:
            return
        assert t is not None
        if explicit is not None:
            placed = explicit
        else:
            placed = [
                [order[(k + j) % len(order)] for j in range(rf)] for k in range(current, count)
            ]
        response = result.response
        assert isinstance(response, CreateTopicResponse)
        assert (response.name, response.topic_id) == (name, t.topic_id)
        answer = placed
        if explicit is not None and "explicit_create_partitions_response_pads" in KNOWN_CORE_BUGS:
            answer = [[] for _ in range(current)] + placed
        assert response.assignments == answer, (response.assignments, answer)
        if explicit is None:
            placement_ok(self.image, placed, rf)
        configured = m.configured_min(name)
        for k, a in enumerate(placed, current):
            m.add_partition(name, k, a, configured)
        t.partitions = count
        self.after_action()

    @precondition(lambda self: self.model.parts)
    @rule(
        moves=st.lists(
            st.tuples(
                st.integers(0, 100),
                st.one_of(
                    st.none(),  # cancel
                    st.lists(st.sampled_from(BROKERS), min_size=1, max_size=4, unique=True),
                    st.lists(st.sampled_from(BROKERS), min_size=1, max_size=4, unique=True),
                    st.lists(st.sampled_from((*BROKERS, UNKNOWN_BROKER)), max_size=3),
                ),
                st.booleans(),  # an unknown partition
            ),
            min_size=0,
            max_size=3,
        ),
    )
    def reassign(self, moves: list[tuple[int, list[int] | None, bool]]) -> None:
        """kafka-reassign-partitions --execute / --cancel (KIP-455), each partition alone:
        the replicas become the target then the original replicas not in it; the targets'
        new ones are adding, the leaving ones removing. Complete at once if the target is
        in the ISR; a cancel restores the original replicas."""
        m = self.model
        parts = sorted(m.parts)
        named = [
            (parts[i % len(parts)][0], parts[i % len(parts)][1] + (10 if unknown else 0), target)
            for i, target, unknown in moves
        ]
        request = AlterPartitionReassignments(
            reassignments=[Reassignment(topic=t, partition=n, replicas=r) for t, n, r in named]
        )
        if not named or len({(t, n) for t, n, _ in named}) < len(named):
            self.attempt(request, "INVALID_REQUEST")
            return
        result = self.attempt(request, None)
        assert result is not None
        response = result.response
        assert isinstance(response, AlterPartitionReassignmentsResponse)
        outcomes: list[tuple[str, int, str | None]] = []
        written = 0
        for topic, number, target in named:
            p = m.parts.get((topic, number))
            code: str | None = None
            if p is None:
                code = "UNKNOWN_TOPIC_OR_PARTITION"
            elif target is None:
                if (p.adding or p.removing) and m.strands_isr(topic, number, None):
                    code = "INVALID_REPLICA_ASSIGNMENT"  # it would strand the data
                elif p.adding or p.removing:
                    written += m.move(p, p.original, (), ())
                    note("reassignment cancelled")
                else:
                    code = "NO_REASSIGNMENT_IN_PROGRESS"
            elif (
                not target
                or len(set(target)) != len(target)
                or any(r not in m.brokers for r in target)
            ):
                code = "INVALID_REPLICA_ASSIGNMENT"
            elif (tuple(target) != p.replicas or p.adding or p.removing) and m.strands_isr(
                topic, number, target
            ):
                code = "INVALID_REPLICA_ASSIGNMENT"  # it would strand the data
            elif tuple(target) != p.replicas or p.adding or p.removing:
                original = p.original
                adding = tuple(r for r in target if r not in original)
                removing = tuple(r for r in original if r not in target)
                written += m.move(p, tuple(target), adding, removing)
                if p.adding or p.removing:
                    note("reassignment in progress")
            outcomes.append((topic, number, code))
        assert [(r.topic, r.partition, r.error_code) for r in response.results] == outcomes
        assert len(result.records) == written + (
            len([r for r in result.records if isinstance(r, BeginTransactionRecord)]) * 2
        )
        self.after_action()

    def reassigning(self) -> list[MPartition]:
        return [p for _, p in sorted(self.model.parts.items()) if p.adding or p.removing]

    @precondition(lambda self: any(p.leader != NO_LEADER for p in self.reassigning()))
    @rule(i=st.integers(0, 100), recovered=st.booleans(), first_only=st.booleans())
    def catch_up(self, i: int, recovered: bool, first_only: bool) -> None:
        """The replicas a reassignment adds have copied the log: the leader names the
        active ones (or the first of them) in the ISR, which completes the reassignment
        if that covers the target."""
        led = [p for p in self.reassigning() if p.leader != NO_LEADER]
        p = led[i % len(led)]
        everyone_led = sorted(tp for tp, x in self.model.parts.items() if x.leader != NO_LEADER)
        self.alter(
            i=everyone_led.index(p.tp),
            shape="expand",
            pick=list(p.adding[:1] if first_only else p.adding),
            sender="leader",
            faults=frozenset(),
            with_leader_epoch=True,
            recovered=recovered,
        )

    @precondition(lambda self: self.reassigning())
    @rule(i=st.integers(0, 100))
    def cancel(self, i: int) -> None:
        """kafka-reassign-partitions --cancel of a reassignment in progress."""
        p = self.reassigning()[i % len(self.reassigning())]
        self.reassign([(sorted(self.model.parts).index(p.tp), None, False)])

    @rule(b=st.sampled_from((*BROKERS, UNKNOWN_BROKER)))
    def unregister(self, b: int) -> None:
        """kafka-cluster unregister: a fenced broker's registration goes and it leaves
        every ISR, ELR and LastKnownELR; its replicas stay assigned, and registering the
        id again is a first registration of a broker that hosts replicas (unclean)."""
        m = self.model
        request = UnregisterBroker(broker_id=b)
        if b not in m.brokers:
            self.attempt(request, "BROKER_ID_NOT_REGISTERED")
            return
        if not m.brokers[b].fenced:
            self.attempt(request, "INVALID_REQUEST")
            return
        result = self.attempt(request, None)
        assert result is not None and result.response == Ack()
        m.unregister(b)
        self.after_action()

    @rule(b=st.sampled_from(BROKERS))
    def retire(self, b: int) -> None:
        """An operator retires a broker: moves every partition off it, stops it (its
        session expires) and unregisters it."""
        m = self.model
        for p in sorted(m.hosted_by(b), key=lambda p: p.tp):
            target = [r for r in p.target if r != b]
            spare = [r for r in BROKERS if m.active(r) and r not in p.replicas]
            if spare:
                target.append(spare[0])
            if target:
                self.reassign([(sorted(m.parts).index(p.tp), target, False)])
        if b in m.brokers:
            self.fence(b)
        self.unregister(b)

    # --- unclean recovery: answers and time ------------------------------------------------

    @precondition(lambda self: any(p.asked for p in self.model.pending.values()))
    @rule(
        i=st.integers(0, 100),
        last_leader_epoch=st.integers(0, 6),
        log_end_offset=st.integers(0, 30),
    )
    def answer_inspection(self, i: int, last_leader_epoch: int, log_end_offset: int) -> None:
        asked = sorted(
            (tp, b, epoch) for tp, pr in self.model.pending.items() for b, epoch in pr.asked.items()
        )
        tp, b, epoch = asked[i % len(asked)]
        self.do_answer(tp, b, epoch, last_leader_epoch, log_end_offset)

    @precondition(lambda self: any(p.asked for p in self.model.pending.values()))
    @rule(logs=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9)), min_size=6, max_size=6))
    def answer_every_inspection(self, logs: list[tuple[int, int]]) -> None:
        """Every broker asked answers (one log per broker, the same for all partitions)."""
        asked = sorted(
            (tp, b, epoch) for tp, pr in self.model.pending.items() for b, epoch in pr.asked.items()
        )
        for tp, b, epoch in asked:
            if tp in self.model.pending:  # an earlier answer may have ended its recovery
                self.do_answer(tp, b, epoch, *logs[b % len(logs)])

    @precondition(lambda self: self.model.parts)
    @rule(
        i=st.integers(0, 100),
        b=st.sampled_from((*BROKERS, UNKNOWN_BROKER)),
        stale=st.booleans(),
        last_leader_epoch=st.integers(0, 6),
        log_end_offset=st.integers(0, 30),
    )
    def answer_unasked(
        self, i: int, b: int, stale: bool, last_leader_epoch: int, log_end_offset: int
    ) -> None:
        """An answer nobody asked for, from any broker (a non-replica, a stale incarnation),
        for a partition under recovery if there is one, else for any (a late answer)."""
        pending = sorted(self.model.pending)
        p = self.model.parts[pending[i % len(pending)]] if pending else self.pick_partition(i)
        epoch = self.model.brokers[b].epoch if b in self.model.brokers else 0
        self.do_answer(p.tp, b, epoch - stale, last_leader_epoch, log_end_offset)

    def do_answer(
        self, tp: TopicPartition, b: int, epoch: int, last_leader_epoch: int, log_end_offset: int
    ) -> None:
        m = self.model
        reply = ReplicaLogInfo(
            broker_id=b,
            broker_epoch=epoch,
            topic=tp[0],
            partition=tp[1],
            last_leader_epoch=last_leader_epoch,
            log_end_offset=log_end_offset,
        )
        current = b in m.brokers and m.brokers[b].epoch == epoch
        tracker = self.tracker
        result = self.attempt(reply, None if current else "STALE_BROKER_EPOCH")
        if result is None:
            return
        assert result.records == []
        if tp not in m.pending:
            # A late answer changes nothing: the step right after an evaluation at the
            # same time has nothing left to decide or ask.
            assert self.tracker == tracker
            assert self.last is not None
            assert (self.last.records, self.last.inspections) == ([], [])
        else:
            m.pending[tp].answers[b] = RecoveryCandidate(
                broker_id=b,
                last_leader_epoch=last_leader_epoch,
                log_end_offset=log_end_offset,
                broker_epoch=epoch,
            )
        self.after_action()

    @rule(ms=st.sampled_from([0, 1, WINDOW // 2, WINDOW - 1, WINDOW, 3 * WINDOW]))
    def tick(self, ms: int) -> None:
        self.now += ms
        result = self.attempt(Tick(), None)
        assert result is not None and result.records == []
        self.after_action()

    def evaluate(self, result: StepResult) -> None:
        """The recovery part of the step `result` against the model, which has applied
        the event itself."""
        m = self.model
        # The model: an outage starts when the last leader is lost.
        for p in m.parts.values():
            if p.leader == NO_LEADER:
                m.offline_since.setdefault(p.tp, self.now)
            else:
                m.offline_since.pop(p.tp, None)
        # Drop what no longer needs recovery, start what does.
        for tp in list(m.pending):
            if not m.trigger(m.parts[tp]):
                del m.pending[tp]
        for p in m.parts.values():
            if p.leader == NO_LEADER and p.tp not in m.pending and m.trigger(p):
                m.pending[p.tp] = MPending(since=m.offline_since[p.tp], window_start=self.now)
        # Every decided recovery is one the rules call for, choosing what the rules choose.
        decided: dict[TopicPartition, int] = {}
        records = result.records[len(result.records) - result.recovery_records :]
        assert len(records) % 2 == 0
        for audit, change in zip(records[::2], records[1::2], strict=True):
            assert isinstance(audit, UncleanRecoveryRecord)
            assert isinstance(change, PartitionChangeRecord)
            tp = (audit.topic, audit.partition)
            assert (change.topic, change.partition) == tp and change.leader == audit.chosen
            assert change.isr == [audit.chosen]
            assert change.recovery_state is LeaderRecoveryState.RECOVERING
            assert audit.potential_data_loss
            decided[tp] = audit.chosen
        for tp, pr in m.pending.items():
            p = m.parts[tp]
            strategy = m.strategy_of(p)
            valid = m.valid_answers(tp)
            due: int | None = None
            if strategy == CLASSIC_UNCLEAN_ELECTION:
                # At once, without inspection: the first active replica in assignment order
                # that a reassignment is not adding.
                due = next((r for r in p.replicas if m.active(r) and r not in p.adding), None)
            elif strategy == "balanced":
                members = p.lkelr
                if members and members <= set(valid):
                    best = model_best(p, [valid[b] for b in members])
                    if best is not None and m.active(best):
                        due = best
            else:
                assert strategy == "proactive"
                if self.now >= pr.window_start + WINDOW:
                    usable = [a for b, a in valid.items() if b in m.candidates(p) and m.active(b)]
                    due = model_best(p, usable)
                    if due is None:
                        pr.window_start = self.now
                        pr.asked.clear()
            assert decided.get(tp) == due, (tp, strategy, decided.get(tp), due, valid)
        for tp, chosen in decided.items():
            audit = next(
                r
                for r in records
                if isinstance(r, UncleanRecoveryRecord) and (r.topic, r.partition) == tp
            )
            p = m.parts[tp]
            assert audit.strategy == m.strategy_of(p)
            if audit.strategy == CLASSIC_UNCLEAN_ELECTION:
                assert (audit.trigger, audit.candidates) == ("no_live_isr_member", [])
            assert audit.offline_since_ms == m.pending[tp].since
            cands = m.candidates(p)
            assert {c.broker_id for c in audit.candidates} == set(m.valid_answers(tp)) & cands
            del m.pending[tp]
            m.recover(p, chosen)
        assert result.state is self.state
        assert set(self.tracker.pending) == set(m.pending)
        for tp, pr in m.pending.items():
            tracked = self.tracker.pending[tp]
            assert tracked.since_ms == pr.since
            if m.strategy_of(m.parts[tp]) == "proactive":
                assert tracked.deadline_ms == pr.window_start + WINDOW
            else:
                assert tracked.deadline_ms is None
        deadlines = [
            pr.window_start + WINDOW
            for tp, pr in m.pending.items()
            if m.strategy_of(m.parts[tp]) == "proactive"
        ]
        assert result.next_deadline_ms == (min(deadlines) if deadlines else None)
        # Inspections: only to active candidates not yet answered, once per incarnation.
        for insp in result.inspections:
            tp = (insp.topic, insp.partition)
            pr = m.pending[tp]
            assert insp.broker_id in m.candidates(m.parts[tp])
            assert m.active(insp.broker_id)
            assert insp.broker_epoch == m.brokers[insp.broker_id].epoch
            assert insp.broker_id not in m.valid_answers(tp)
            assert pr.asked.get(insp.broker_id) != insp.broker_epoch
            pr.asked[insp.broker_id] = insp.broker_epoch
        # ... and every active candidate still awaited has been asked at its epoch.
        for tp, pr in m.pending.items():
            valid = m.valid_answers(tp)
            for r in m.candidates(m.parts[tp]):
                if m.active(r) and r not in valid:
                    assert pr.asked.get(r) == m.brokers[r].epoch, (tp, r)
            awaited = self.tracker.awaited(self.image, tp, POLICIES)
            assert awaited == [
                r for r in m.parts[tp].replicas if r in m.candidates(m.parts[tp]) and r not in valid
            ]

    @rule()
    def controller_failover(self) -> None:
        """A new controller loads the newest snapshot and the log after it; pending
        recoveries are soft state and start over, every leaderless partition is looked at
        (and counts as offline from this look: when it lost its leader is soft state too)."""
        offset, payload = self.snapshots[-1]
        restored = from_snapshot(msgspec.msgpack.decode(payload, type=ImageSnapshot))
        self.state = ControllerState(replay(restored, self.log[offset:]))
        assert self.state.backlog.everything  # look at every leaderless partition
        self.model.pending.clear()
        self.model.offline_since.clear()
        self.tick(0)

    # --- snapshots ---------------------------------------------------------------------------

    @rule()
    def take_snapshot(self) -> None:
        payload = msgspec.msgpack.encode(to_snapshot(self.image))
        self.snapshots = [*self.snapshots[-2:], (self.image.end_offset, payload)]

    # --- invariants -----------------------------------------------------------------------------

    @invariant()
    def image_equals_the_model(self) -> None:
        m = self.model
        assert set(self.image.brokers) == set(m.brokers)
        for b, mb in m.brokers.items():
            ib = self.image.brokers[b]
            assert (ib.epoch, ib.incarnation_id, ib.fenced, ib.in_controlled_shutdown) == (
                mb.epoch,
                mb.incarnation,
                mb.fenced,
                mb.cs,
            )
            assert ib.last_registration_clean == mb.clean
        image = self.image
        assert {
            n: (t.topic_id, t.partitions, t.min_isr, t.recovery_strategy)
            for n, t in image.topics.items()
        } == {n: (t.topic_id, t.partitions, t.min_isr, t.strategy) for n, t in m.topics.items()}
        assert dict(image.topic_ids) == {t.topic_id: n for n, t in m.topics.items()}
        assert dict(image.features) == ({} if m.feature is None else {ELR_FEATURE: m.feature})
        assert dict(image.cluster_configs) == (
            {} if m.cluster_min is None else {MIN_ISR_CONFIG: str(m.cluster_min)}
        )
        assert image.elr_enabled(self.CONFIG.eligible_leader_replicas) == (not m.classic)
        assert set(image.reassigning) == {tp for tp, p in m.parts.items() if p.adding or p.removing}
        assert set(self.image.partitions) == set(m.parts)
        for tp, mp in m.parts.items():
            p = self.image.partitions[tp]
            assert (p.replicas, p.min_isr) == (mp.replicas, mp.min_isr), tp
            assert (p.adding, p.removing) == (mp.adding, mp.removing), tp
            assert (p.leader, p.isr, p.elr, p.last_known_elr) == (
                mp.leader,
                mp.isr,
                mp.elr,
                mp.lkelr,
            ), tp
            assert (p.leader_epoch, p.partition_epoch) == (mp.le, mp.pe), tp
            assert p.recovery_state.value == mp.recovering

    @invariant()
    def partition_invariants(self) -> None:
        """The invariants common to both modes, and KIP-966's own unless the machine runs
        the classic rules (whose machines check theirs instead)."""
        image = self.image
        m = self.model
        kip966 = not m.classic
        for tp, p in image.partitions.items():
            assert not p.isr & p.elr
            assert not p.isr & p.last_known_elr
            assert not p.elr & p.last_known_elr
            if len(p.isr) >= p.min_isr:
                assert not p.elr and not p.last_known_elr
            if p.leader != NO_LEADER:
                assert p.leader in p.isr and image.is_active(p.leader)
            assert (tp in image.offline) == (p.leader == NO_LEADER)
            # Only assigned replicas are in the ISR, ELR or LastKnownELR (a replica a
            # reassignment removed, or an unregistered broker, is in none).
            assert p.isr | p.elr | p.last_known_elr <= set(p.replicas), (tp, view_of(p))
            assert not (p.elr | p.last_known_elr) - set(image.brokers), (tp, view_of(p))
            tainted = m.tainted[tp]
            inactive = {r for r in p.isr if not image.is_active(r)}
            if kip966 and tp in m.legacy and not inactive and not tainted & (p.isr | p.elr):
                # Made under the classic rules, now as KIP-966's rules keep it.
                m.legacy.discard(tp)
            if kip966:
                # Unclean Exclusion of a registration under KIP-966's rules holds at once,
                # whatever state the classic rules left (the ELR upgrade's silent loss).
                assert not m.excluded[tp] & (p.isr | p.elr), (tp, m.excluded[tp], view_of(p))
            if kip966 and tp not in m.legacy:
                # Unclean Exclusion (see the module docstring for the premise).
                assert not tainted & (p.isr | p.elr), (tp, tainted)
                # No inactive broker is in an ISR (rule 2).
                assert not inactive, (tp, inactive)
            if kip966 and m.reached_min[tp] and not p.isr and not p.elr:
                # MinISR Recovery Quorum.
                assert len(p.last_known_elr) >= p.min_isr, (tp, view_of(p))
        for bid, index in image.replicas_by_broker.items():
            assert set(index) == {tp for tp, p in image.partitions.items() if bid in p.replicas}
            assert len(index) == len(set(index))
        assert image.active == {b.broker_id for b in image.brokers.values() if b.active}

    @invariant()
    def bulk_isr_removal_equals_one_change_per_partition(self) -> None:
        # `remove_from_isrs` plans once per partition shape and restamps; it must give
        # exactly what `build_change` gives partition by partition, for every broker.
        image = self.image
        elr = image.elr_enabled(self.CONFIG.eligible_leader_replicas)
        for bid in image.brokers:
            expected = [
                build_change(
                    image,
                    p,
                    reason=ChangeReason.FENCE,
                    target_isr=p.isr - {bid},
                    broker=bid,
                    elr_enabled=elr,
                )
                for p in image.partitions_of(bid)
                if bid in p.isr
            ]
            bulk = remove_from_isrs(image, bid, reason=ChangeReason.FENCE, elr_enabled=elr)
            assert bulk == [c for c in expected if c is not None]

    @invariant()
    def reassignments_are_consistent(self) -> None:
        """KIP-455's shape: the replicas are the target then the removing replicas; the
        adding ones are the target's new ones; a reassignment is in progress only while
        some target replica is not in the ISR (or no AlterPartition completed it yet)."""
        for tp, p in self.image.partitions.items():
            assert p.replicas and len(set(p.replicas)) == len(p.replicas), tp
            assert not set(p.adding) & set(p.removing), tp
            assert set(p.adding) <= set(p.target), tp
            assert p.replicas == p.target + p.removing, tp
            assert p.original == tuple(r for r in p.replicas if r not in p.adding), tp
            assert len(p.target) >= 1 and p.min_isr <= len(p.target), tp
            if p.reassigning:
                assert p.target != p.original, tp
            assert (tp in self.image.reassigning) == p.reassigning

    @invariant()
    def adding_replicas_are_never_silently_elected(self) -> None:
        """0 silent losses: a replica a reassignment is adding holds none of the
        acknowledged records until an AlterPartition names it in the ISR. Until then it
        is in no ISR, ELR or LastKnownELR (so no clean election and no recovery policy
        picks it), and only an operator's unclean election (logged as a potential loss)
        ever made one leader."""
        for tp, p in self.image.partitions.items():
            named = (p.isr | p.elr | p.last_known_elr | {p.leader}) & set(p.adding)
            assert named <= self.model.vouched[tp], (tp, named, self.model.vouched[tp])
        for tp, replica, how in self.adding_elections:
            assert how is ElectionKind.MANUAL, (tp, replica, how)

    @invariant()
    def replay_from_scratch_and_from_snapshots(self) -> None:
        assert self.image.end_offset == len(self.log)
        assert replay(ClusterImage(), self.log).same_state(self.image)
        rebuilt = image_from_records(image_to_records(self.image), self.image.end_offset)
        assert rebuilt.same_state(self.image)
        for offset, payload in self.snapshots:
            restored = from_snapshot(msgspec.msgpack.decode(payload, type=ImageSnapshot))
            assert restored.end_offset == offset
            assert replay(restored, self.log[offset:]).same_state(self.image)


def model_view(p: MPartition) -> PartitionView:
    return PartitionView(
        topic=p.topic,
        partition=p.partition,
        leader=p.leader,
        leader_epoch=p.le,
        partition_epoch=p.pe,
        isr=sorted(p.isr),
    )


def view_of(p: PartitionState) -> tuple[int, list[int], list[int], list[int]]:
    return p.leader, sorted(p.isr), sorted(p.elr), sorted(p.last_known_elr)


ControllerMachine.TestCase.settings = settings(CONTROLLER)
# CPU-bound and long: 286 s of the suite's 300 s per-test bound when the suite ran beside
# busy processes on every core (4 per core, issue 33); the bound guards against hangs,
# not against a slow machine, so this test gets more.
TestController = pytest.mark.timeout(900)(ControllerMachine.TestCase)


class SlicedMachine(ControllerMachine):
    """The same rules with a work budget of one partition per event: every fence,
    unfence, controlled shutdown, unclean registration and creation of more than one
    partition is a transaction of many slices, and recovery evaluation drains a backlog
    a partition at a time. The model knows nothing of slices, so any rule the slicing
    broke (a partition skipped or changed twice, a slice that saw a stale image, an
    answer that missed a slice) fails against it."""

    WORK_BUDGET = 1
    SLICED: ClassVar[Counter[str]] = Counter()


SlicedMachine.TestCase.settings = settings(
    CONTROLLER, max_examples=max(10, CONTROLLER.max_examples // 4)
)
TestSlicedController = SlicedMachine.TestCase


# --- smaller properties ------------------------------------------------------------------------

brokers_set = st.frozensets(st.integers(1, 6), max_size=6)


@settings(CONTROLLER, max_examples=200)
@given(
    old=brokers_set, new=brokers_set, elr=brokers_set, lkelr=brokers_set, min_isr=st.integers(1, 4)
)
def test_rule_1_laws(
    old: frozenset[int],
    new: frozenset[int],
    elr: frozenset[int],
    lkelr: frozenset[int],
    min_isr: int,
) -> None:
    # Start from a state the invariants allow: ISR, ELR and LastKnownELR disjoint.
    elr = elr - old
    lkelr = lkelr - old - elr
    out_elr, out_lkelr = next_elr(old, new, elr, lkelr, min_isr)
    assert not out_elr & new and not out_lkelr & new and not out_elr & out_lkelr
    if len(new) >= min_isr:
        assert out_elr == out_lkelr == EMPTY
    else:
        # Nobody leaves the candidate pool except into the ISR: the union never shrinks.
        assert old | elr | lkelr <= new | out_elr | out_lkelr
        assert old - new <= out_elr
        assert out_lkelr <= lkelr
    # Applying the same ISR again changes nothing.
    assert next_elr(new, new, out_elr, out_lkelr, min_isr) == (out_elr, out_lkelr)


@settings(CONTROLLER, max_examples=200)
@given(
    replicas=st.lists(st.integers(1, 8), min_size=1, max_size=6, unique=True),
    raw=st.lists(st.tuples(st.integers(1, 9), st.integers(0, 3), st.integers(0, 3)), max_size=8),
    data=st.data(),
)
def test_best_candidate_is_the_maximum_and_independent_of_order(
    replicas: list[int], raw: list[tuple[int, int, int]], data: st.DataObject
) -> None:
    p = PartitionState(topic="t", partition=0, tp=("t", 0), replicas=tuple(replicas), isr=EMPTY)
    answers = list(
        {
            b: RecoveryCandidate(broker_id=b, last_leader_epoch=e, log_end_offset=o)
            for b, e, o in raw
        }.values()
    )
    best = best_candidate(p, answers)
    if not answers:
        assert best is None
        return
    assert best is not None
    top = max((a.last_leader_epoch, a.log_end_offset) for a in answers)
    assert (best.last_leader_epoch, best.log_end_offset) == top
    tied = [a.broker_id for a in answers if (a.last_leader_epoch, a.log_end_offset) == top]
    assigned = [r for r in replicas if r in tied]
    if assigned:
        assert best.broker_id == assigned[0]
    shuffled = data.draw(st.permutations(answers))
    again = best_candidate(p, shuffled)
    assert again is not None
    if assigned or len(tied) == 1:
        assert again == best


@settings(CONTROLLER, max_examples=100)
@given(
    racks=st.lists(st.sampled_from([None, "a", "b", "c"]), min_size=1, max_size=7),
    partitions=st.integers(1, 8),
    data=st.data(),
)
def test_default_placement(racks: list[str | None], partitions: int, data: st.DataObject) -> None:
    image = ClusterImage()
    for b, rack in enumerate(racks, start=1):
        result = register_broker(
            image, RegisterBroker(broker_id=b, incarnation_id=f"i{b}", rack=rack), 0, CONFIG
        )
        image = replay(image, result.records)
        image = replay(
            image,
            unfence_broker(
                image, UnfenceBroker(broker_id=b, broker_epoch=image.brokers[b].epoch), 0, CONFIG
            ).records,
        )
    rf = data.draw(st.integers(1, len(racks)))
    result = create_topic(
        image, CreateTopic(name="t", partitions=partitions, replication_factor=rf), 0, CONFIG
    )
    response = result.response
    assert isinstance(response, CreateTopicResponse)
    assert len(response.assignments) == partitions
    placement_ok(image, response.assignments, rf)
    after = replay(image, result.records)
    for i, a in enumerate(response.assignments):
        p = after.partitions[("t", i)]
        assert (p.leader, p.isr, p.replicas) == (a[0], frozenset(a), tuple(a))


# --- the core bugs this machine found (see KNOWN_CORE_BUGS) ------------------------------------


def known_bug(name: str) -> pytest.MarkDecorator:
    """Expected to fail while `name` is in KNOWN_CORE_BUGS (strictly: a fix makes the test
    pass, and the mark fails it until the name goes, with the model's workaround)."""
    return pytest.mark.xfail(name in KNOWN_CORE_BUGS, reason=f"core bug {name}", strict=True)


def lifecycle_cluster(config: ControllerConfig = CONFIG, brokers: int = 3) -> Cluster:
    """Brokers 1..`brokers` and topic t: one partition on [1, 2, 3], MinISR 2."""
    c = Cluster(config)
    c.start(*range(1, brokers + 1))
    c.create("t", assignments=[[1, 2, 3]], min_isr=2)
    return c


def test_regression_a_downgrade_ends_the_pending_recoveries() -> None:
    """Every broker restarts uncleanly: t's balanced recovery waits for its LastKnownELR;
    a min.insync.replicas change clears that (the recovery waits for an operator); then the
    ELR downgrade (classic rules, no unclean election) must end it."""
    c = lifecycle_cluster()
    for b in (1, 2, 3):
        c.fence(b)
    for b in (1, 2, 3):
        c.register(b)
    c.submit(
        AlterConfigs(resource_type="topic", resource_name="t", set_configs={MIN_ISR_CONFIG: "2"})
    )
    assert list(c.tracker.pending) == [("t", 0)]
    c.submit(UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="downgrade"))
    assert not c.image.elr_enabled(True)
    assert list(c.tracker.pending) == []


def test_regression_an_upgrade_starts_the_recoveries_now_needed() -> None:
    """Under the classic rules t lost every ISR member it had under KIP-966's (the
    downgrade cleared its ELR); upgraded again, its balanced recovery must start."""
    c = lifecycle_cluster()
    for b in (1, 2, 3):
        c.fence(b)
    c.submit(UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="downgrade"))
    assert c.view() == (NO_LEADER, [], [], [])
    c.submit(UpdateFeature(name=ELR_FEATURE, level=1, upgrade_type="upgrade"))
    assert list(c.tracker.pending) == [("t", 0)]


def test_a_reassignment_that_only_removes_completes() -> None:
    """[1, 2, 3] -> [2, 3] while 3 is out of the ISR: in progress, removing 1; once the
    leader names 3 in the ISR again, the target is in the ISR and it must complete."""
    c = lifecycle_cluster()
    c.shutdown(3)
    c.submit(
        AlterPartitionReassignments(
            reassignments=[Reassignment(topic="t", partition=0, replicas=[2, 3])]
        )
    )
    assert (c.p().replicas, c.p().removing) == ((2, 3, 1), (1,))
    c.restart(3, clean=True)
    c.alter([1, 2, 3])
    p = c.p()
    assert (p.replicas, p.adding, p.removing, p.isr) == ((2, 3), (), (), frozenset({2, 3}))
    assert p.leader in (2, 3) and ("t", 0) not in c.image.reassigning


def test_regression_add_partitions_answers_the_new_assignments() -> None:
    """The answer lists the new partitions' assignments, explicit or placed."""
    c = lifecycle_cluster()
    explicit = c.run(CreatePartitions(topic="t", count=2, assignments=[[1]])).response
    placed = c.run(CreatePartitions(topic="t", count=3)).response
    assert isinstance(placed, CreateTopicResponse) and len(placed.assignments) == 1
    assert isinstance(explicit, CreateTopicResponse) and explicit.assignments == [[1]]


def test_classic_rules_refuse_a_move_that_would_empty_the_isr() -> None:
    """Classic rules: t moves from [1, 2, 3] to [4, 5]; 4 catches up and joins the ISR;
    1, 2 and 3 fail, so the ISR is 4 alone (the last member stays). A cancel would take 4,
    the only ISR member, out of the assignment (the machine found the core keeping it in
    the ISR of a partition it no longer belonged to): it is refused, and the partition
    keeps only assigned replicas in its ISR."""
    classic = ControllerConfig(
        unclean_recovery_window_ms=WINDOW,
        unclean_recovery_strategy="balanced",
        eligible_leader_replicas=False,
    )
    c = lifecycle_cluster(classic, brokers=5)
    move = Reassignment(topic="t", partition=0, replicas=[4, 5])
    c.submit(AlterPartitionReassignments(reassignments=[move]))
    c.alter([1, 2, 3, 4])
    for b in (1, 2, 3):
        c.fence(b)
    assert (c.p().isr, c.p().leader) == (frozenset({4}), 4)
    cancel = Reassignment(topic="t", partition=0, replicas=None)
    r = c.submit(AlterPartitionReassignments(reassignments=[cancel])).response
    assert isinstance(r, AlterPartitionReassignmentsResponse)
    assert r.results[0].error_code == "INVALID_REPLICA_ASSIGNMENT"
    p = c.p()
    assert p.isr <= set(p.replicas), sorted(p.isr)
