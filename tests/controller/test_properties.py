"""Property tests of the pure controller core.

The centrepiece is `ControllerMachine`, a Hypothesis state machine that drives random
sequences of every controller action through the one event step
(`controller.core.step.step`, which evaluates unclean recoveries after every event, as the
driver does; virtual-time ticks are `Tick` events through the same step).
Beside the image it keeps an independent model of the rules, written from the rule text
rather than from the code, and checks after every step that

* the image equals the model (brokers, and every partition's leader, ISR, ELR,
  LastKnownELR, epochs and recovery state), and every response and error code is the one
  the model predicts, in the documented validation order;
* the invariants hold: ISR ∩ ELR = ∅; |ISR| >= MinISR ⇒ ELR = LastKnownELR = ∅; the
  leader is an active ISR member or there is none; no fenced broker is in an ISR;
  Unclean Exclusion; MinISR Recovery Quorum; and
* replaying the whole log from scratch, or from a msgpack snapshot plus the records after
  it, gives the same image.

Unclean Exclusion, as checked: a replica whose broker registered uncleanly is in no ISR or
ELR of a partition that existed at that registration, until a successful AlterPartition
names it in the ISR, or an unclean recovery (rule 7) or operator election elects it. The
last two are the documented exception of section 5.1.2 (log inspection elects a replica
the controller cannot vouch for), so the property is restricted to that premise.

MinISR Recovery Quorum, as checked: if a partition's ISR has had at least MinISR members
since its creation, its last unclean recovery (or operator election) or its last
ClearElrRecord, then whenever its ISR and ELR are both empty its LastKnownELR has at
least MinISR members. (An unclean recovery starts a new history with an ISR of one; a
ClearElrRecord, written when min.insync.replicas changes, voids the ELR by design.)

The machine's controller settings are its class attribute `CONFIG`, and the model follows
them: `test_properties_classic.py` runs the same machine under Kafka's classic rules
(`eligible_leader_replicas=False`, with and without `unclean_leader_election`), which the
model restates on its own (`Model.classic_change`, `elects_on_unfence`, `strategy_of`);
there Unclean Exclusion and "no fenced broker is in an ISR" do not hold by design, and
the classic machines check the classic invariants instead.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from controller.core.config import ControllerConfig
from controller.core.handlers import (
    HandlerResult,
    create_topic,
    register_broker,
    unfence_broker,
)
from controller.core.partition_change import build_change, next_elr, remove_from_isrs
from controller.core.recovery.policy import best_candidate
from controller.core.recovery.tracker import RecoveryTracker
from controller.core.step import ControllerState, Event, Rules, StepResult, Tick, settle
from controller.core.work import WORK_BUDGET
from metactl.errors import MetactlError
from metadata_image.image import EMPTY, ClusterImage, PartitionState, TopicPartition
from metadata_image.replay import image_from_records, image_to_records, replay
from metadata_image.snapshot import ImageSnapshot, from_snapshot, to_snapshot
from metadata_log.records import (
    NO_LEADER,
    ChangeReason,
    ClearElrRecord,
    LeaderRecoveryState,
    MetadataRecord,
    PartitionChangeRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    UncleanRecoveryRecord,
)
from protocol.messages import (
    AlterPartition,
    ControlledShutdown,
    ControlledShutdownResponse,
    CreateTopic,
    CreateTopicResponse,
    ElectLeader,
    FenceBroker,
    IsrMember,
    PartitionView,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaLogInfo,
    UnfenceBroker,
)

from .testkit import KNOWN_STRATEGIES, POLICIES

CONTROLLER = settings.get_profile("metactl-controller")
WINDOW = 1000
BROKERS = (1, 2, 3, 4, 5)
RACKS = {1: "a", 2: "b", 3: "a", 4: "b", 5: None}
UNKNOWN_BROKER = 9
MAX_TOPICS = 6
STRATEGIES = (None, "balanced", "proactive", "manual")
CONFIG = ControllerConfig(unclean_recovery_window_ms=WINDOW, unclean_recovery_strategy="balanced")


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
class MPartition:
    topic: str
    partition: int
    replicas: tuple[int, ...]
    min_isr: int
    isr: frozenset[int]
    leader: int
    elr: frozenset[int] = EMPTY
    lkelr: frozenset[int] = EMPTY
    le: int = 0
    pe: int = 0
    recovering: bool = False

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass
class MPending:
    since: int
    window_start: int
    answers: dict[int, RecoveryCandidate] = field(default_factory=dict)
    asked: dict[int, int] = field(default_factory=dict)  # broker -> epoch asked at


# The classic unclean election's name in the log (`--unclean-leader-election`).
CLASSIC_UNCLEAN_ELECTION = "unclean_leader_election"


class Model:
    """The rules restated. `classic` selects Kafka's pre-KIP-966 rules
    (`eligible_leader_replicas=False`), `unclean` its unclean leader election."""

    def __init__(self, *, classic: bool = False, unclean: bool = False) -> None:
        assert classic or not unclean  # the controller refuses the combination
        self.classic = classic
        self.unclean = unclean
        self.brokers: dict[int, MBroker] = {}
        self.parts: dict[TopicPartition, MPartition] = {}
        self.strategy: dict[str, str] = {}  # topic -> effective strategy
        self.pending: dict[TopicPartition, MPending] = {}
        # Leaderless partitions: when they lost their last leader.
        self.offline_since: dict[TopicPartition, int] = {}
        # Invariant bookkeeping.
        self.tainted: dict[TopicPartition, set[int]] = {}
        self.reached_min: dict[TopicPartition, bool] = {}

    def active(self, b: int) -> bool:
        m = self.brokers.get(b)
        return m is not None and m.active

    def hosted_by(self, b: int) -> list[MPartition]:
        return [p for p in self.parts.values() if b in p.replicas]

    # Rule 1 and rule 2, as the issue states them.
    def change(
        self,
        p: MPartition,
        new_isr: frozenset[int],
        *,
        excluded: frozenset[int] = EMPTY,
        recovered: bool = False,
    ) -> bool:
        if self.classic:
            return self.classic_change(p, new_isr, recovered=recovered)
        old = p.isr
        elr = p.elr - excluded
        lkelr = p.lkelr | (p.elr & excluded)

        def rule1(n: frozenset[int]) -> tuple[frozenset[int], frozenset[int]]:
            if len(n) >= p.min_isr:
                return EMPTY, EMPTY
            return frozenset((elr | (old - n)) - n), frozenset(lkelr - n)

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
        return self.apply(p, leader, isr, new_elr, new_lkelr, recovered=recovered)

    def classic_change(self, p: MPartition, new_isr: frozenset[int], *, recovered: bool) -> bool:
        """Kafka's classic rules: no ELR or LastKnownELR; an ISR that would become empty
        keeps its members (the last one stays, inactive, and the partition has no leader);
        a valid leader stays, else the first active ISR member in assignment order."""
        isr = new_isr or p.isr
        if p.leader in isr and self.active(p.leader):
            leader = p.leader
        else:
            leader = next((r for r in p.replicas if r in isr and self.active(r)), NO_LEADER)
        return self.apply(p, leader, isr, EMPTY, EMPTY, recovered=recovered)

    def apply(
        self,
        p: MPartition,
        leader: int,
        isr: frozenset[int],
        elr: frozenset[int],
        lkelr: frozenset[int],
        *,
        recovered: bool,
    ) -> bool:
        """Write the change (if anything changes), bumping the epochs as a record does."""
        recovering = p.recovering and not recovered
        if (leader, isr, elr, lkelr, recovering) == (
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
        self.offline_since.pop(p.tp, None)  # the outage ends: a later loss starts a new one

    def fence_changes(self, b: int) -> int:
        return sum(self.change(p, p.isr - {b}) for p in self.hosted_by(b) if b in p.isr)

    def elects_on_unfence(self, p: MPartition, b: int) -> bool:
        """Rule 4: an unfenced broker is elected where it is in the ELR of a leaderless
        partition (classic rules: in its ISR, where the last member stays)."""
        return p.leader == NO_LEADER and b in (p.isr if self.classic else p.elr)

    def strategy_of(self, p: MPartition) -> str | None:
        """The recovery strategy that applies to `p`: the topic's (KIP-966), the classic
        unclean election, or none (classic rules without it)."""
        if self.classic:
            return CLASSIC_UNCLEAN_ELECTION if self.unclean else None
        return self.strategy[p.topic]

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
        """Whose log a recovery of `p` asks for (the classic election asks nobody)."""
        strategy = self.strategy_of(p)
        if strategy is None or strategy == CLASSIC_UNCLEAN_ELECTION:
            return EMPTY
        if strategy == "balanced":
            return p.lkelr
        return frozenset(p.replicas)

    def valid_answers(self, tp: TopicPartition) -> dict[int, RecoveryCandidate]:
        return {
            b: a
            for b, a in self.pending[tp].answers.items()
            if b in self.brokers and self.brokers[b].epoch == a.broker_epoch
        }


def model_best(p: MPartition, answers: list[RecoveryCandidate]) -> int | None:
    """Highest (last leader epoch, log end offset); ties to the earlier assigned replica."""
    if not answers:
        return None
    top = max((a.last_leader_epoch, a.log_end_offset) for a in answers)
    tied = {a.broker_id for a in answers if (a.last_leader_epoch, a.log_end_offset) == top}
    return next(r for r in p.replicas if r in tied)


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

    def __init__(self) -> None:
        super().__init__()
        self.step_rules = Rules(self.CONFIG, POLICIES, work_budget=self.WORK_BUDGET)
        # A fresh controller: its backlog is everything, so its first step looks at every
        # leaderless partition.
        self.state = ControllerState(ClusterImage())
        self.log: list[MetadataRecord] = []
        self.now = 0
        self.model = Model(
            classic=not self.CONFIG.eligible_leader_replicas,
            unclean=self.CONFIG.unclean_leader_election,
        )
        self.snapshots: list[tuple[int, bytes]] = []
        self.incarnations = itertools.count(1)
        self.last: StepResult | None = None  # the last successful step, checked by evaluate

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
                bump = 1 if after.leader != before.leader else 0
                assert after.leader_epoch == before.leader_epoch + bump
                assert (r.leader is not None) == (after.leader != before.leader)
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
                if b in p.elr:
                    m.change(p, p.isr, excluded=frozenset({b}))
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

    @precondition(lambda self: len(self.model.strategy) < MAX_TOPICS)
    @rule(
        name=st.sampled_from(["t1", "t2", "t3", "bal", "bad name"]),
        partitions=st.one_of(st.none(), st.integers(0, 3)),
        rf=st.integers(0, 5),
        min_isr=st.integers(0, 4),
        strategy=st.sampled_from((*STRATEGIES, "yolo")),
        explicit=st.one_of(
            st.none(),
            st.lists(
                st.lists(st.sampled_from((*BROKERS, UNKNOWN_BROKER)), min_size=0, max_size=4),
                min_size=0,
                max_size=3,
            ),
        ),
    )
    def create(
        self,
        *,
        name: str,
        partitions: int | None,
        rf: int,
        min_isr: int,
        strategy: str | None,
        explicit: list[list[int]] | None,
    ) -> None:
        self.do_create(
            name,
            partitions=partitions,
            rf=rf,
            min_isr=min_isr,
            strategy=strategy,
            explicit=explicit,
        )

    def do_create(
        self,
        name: str,
        *,
        partitions: int | None,
        rf: int,
        min_isr: int,
        strategy: str | None,
        explicit: list[list[int]] | None,
    ) -> None:
        m = self.model
        request = CreateTopic(
            name=name,
            partitions=partitions,
            replication_factor=rf,
            assignments=explicit,
            min_isr=min_isr,
            recovery_strategy=strategy,
        )
        n_active = sum(1 for b in m.brokers.values() if b.active)
        expected: str | None = None
        if name == "bad name":
            expected = "INVALID_TOPIC_EXCEPTION"
        elif name in m.strategy:
            expected = "TOPIC_ALREADY_EXISTS"
        elif strategy is not None and strategy not in KNOWN_STRATEGIES:
            expected = "UNKNOWN_RECOVERY_POLICY"
        elif min_isr < 1:
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
        # A min ISR above the RF is accepted, as in Kafka (effective: capped at the RF).
        result = self.attempt(request, expected)
        if result is None:
            return
        response = result.response
        assert isinstance(response, CreateTopicResponse)
        if explicit is not None:
            assert response.assignments == explicit
        else:
            assert len(response.assignments) == (partitions or self.CONFIG.default_partitions)
            placement_ok(self.image, response.assignments, rf)
        m.strategy[name] = strategy or self.CONFIG.unclean_recovery_strategy
        for i, a in enumerate(response.assignments):
            isr = frozenset(r for r in a if m.active(r))
            leader = next(r for r in a if m.active(r))
            p = MPartition(name, i, tuple(a), min(min_isr, len(a)), isr, leader)
            m.parts[p.tp] = p
            m.tainted[p.tp] = set()
            m.reached_min[p.tp] = False
            m.note_isr(p)
        self.after_action()

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
        if "partition" in faults:
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
        m.change(p, frozenset(target), recovered=recovered)
        for r in target:
            m.tainted[p.tp].discard(r)
        assert result.response == model_view(p)
        self.after_action()

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
        self.after_action()

    @rule(i=st.integers(0, 100), tick=st.booleans())
    def clear_elr(self, i: int, tick: bool) -> None:
        """min.insync.replicas changed: the topic's ELRs are cleared (ClearElrRecord), a
        record no event produced: the state absorbs it, and the next step (a tick now, or
        whatever event comes next) evaluates what it changed.

        This voids the completeness guarantees MinISR Recovery Quorum rests on, so the
        quorum's history restarts for the cleared partitions."""
        m = self.model
        topic = sorted(m.strategy)[i % len(m.strategy)]
        records: list[MetadataRecord] = [ClearElrRecord(topic=topic)]
        was_queued = self.state.backlog
        state, _ = self.state.absorb(records)
        self.commit(records, state)
        changed = set()
        for p in m.parts.values():
            if p.topic == topic and (p.elr or p.lkelr):
                p.elr, p.lkelr = EMPTY, EMPTY
                p.pe += 1
                m.reached_min[p.tp] = len(p.isr) >= p.min_isr
                changed.add(p.tp)
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
                # At once, without inspection: the first active replica in assignment order.
                due = next((r for r in p.replicas if m.active(r)), None)
            elif strategy == "balanced":
                members = p.lkelr
                if members and members <= set(valid):
                    best = model_best(p, [valid[b] for b in members])
                    if best is not None and m.active(best):
                        due = best
            else:
                assert strategy == "proactive"
                if self.now >= pr.window_start + WINDOW:
                    usable = [a for b, a in valid.items() if b in p.replicas and m.active(b)]
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
        assert set(self.image.partitions) == set(m.parts)
        for tp, mp in m.parts.items():
            p = self.image.partitions[tp]
            assert (p.replicas, p.min_isr) == (mp.replicas, mp.min_isr)
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
        kip966 = not self.model.classic
        for tp, p in image.partitions.items():
            assert not p.isr & p.elr
            assert not p.isr & p.last_known_elr
            assert not p.elr & p.last_known_elr
            if len(p.isr) >= p.min_isr:
                assert not p.elr and not p.last_known_elr
            if p.leader != NO_LEADER:
                assert p.leader in p.isr and image.is_active(p.leader)
            assert (tp in image.offline) == (p.leader == NO_LEADER)
            if kip966:
                # Unclean Exclusion (see the module docstring for the premise).
                tainted = self.model.tainted[tp]
                assert not tainted & (p.isr | p.elr), (tp, tainted)
                # MinISR Recovery Quorum.
                if self.model.reached_min[tp] and not p.isr and not p.elr:
                    assert len(p.last_known_elr) >= p.min_isr, (tp, view_of(p))
        for broker in image.brokers.values():
            if kip966 and not broker.active:
                assert not any(broker.broker_id in p.isr for p in image.partitions.values())
        for bid, index in image.replicas_by_broker.items():
            assert set(index) == {tp for tp, p in image.partitions.items() if bid in p.replicas}
            assert len(index) == len(set(index))
        assert image.active == {b.broker_id for b in image.brokers.values() if b.active}

    @invariant()
    def bulk_isr_removal_equals_one_change_per_partition(self) -> None:
        # `remove_from_isrs` plans once per partition shape and restamps; it must give
        # exactly what `build_change` gives partition by partition, for every broker.
        image = self.image
        elr = self.CONFIG.eligible_leader_replicas
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
TestController = ControllerMachine.TestCase


class SlicedMachine(ControllerMachine):
    """The same rules with a work budget of one partition per event: every fence,
    unfence, controlled shutdown, unclean registration and creation of more than one
    partition is a transaction of many slices, and recovery evaluation drains a backlog
    a partition at a time. The model knows nothing of slices, so any rule the slicing
    broke (a partition skipped or changed twice, a slice that saw a stale image, an
    answer that missed a slice) fails against it."""

    WORK_BUDGET = 1


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
