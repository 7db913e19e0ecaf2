"""Rule 7, unclean recovery: the built-in policies, the tracker, operator elections, the
policy registry, and the worked example 5.3.3 replayed step by step."""

from __future__ import annotations

import tomllib
from importlib.metadata import distribution, entry_points
from pathlib import Path
from typing import ClassVar

import immutables
import msgspec
import pytest

import controller.core.recovery.tracker as tracker_module
from controller.core.config import ControllerConfig
from controller.core.recovery import registry
from controller.core.recovery.builtin import BalancedPolicy, ManualPolicy, ProactivePolicy
from controller.core.recovery.policy import (
    Choose,
    Decision,
    PendingRecovery,
    RestartWindow,
    Wait,
    best_candidate,
)
from controller.core.recovery.tracker import (
    Inspection,
    RecoveryTracker,
    evaluate,
    evaluate_all,
    record_answer,
    recovery_records,
    strategy_for,
)
from controller.core.step import ControllerState, Rules, StepResult
from controller.core.work import EVERYTHING, Backlog
from metactl.errors import (
    ElectionNotNeededError,
    IneligibleReplicaError,
    InvalidRequestError,
    StaleBrokerEpochError,
    UnknownRecoveryPolicyError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.state import EMPTY, PartitionState
from metadata_log.records import (
    NO_LEADER,
    ChangeReason,
    ClearElrRecord,
    ElectionKind,
    LeaderRecoveryState,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RecoveryCandidate,
    UncleanRecoveryRecord,
)
from protocol.messages.internal import ReplicaLogInfo

from .testkit import POLICIES, Cluster, image_of, view

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 1000


def rc(broker: int, epoch: int, offset: int, broker_epoch: int = -1) -> RecoveryCandidate:
    return RecoveryCandidate(
        broker_id=broker, last_leader_epoch=epoch, log_end_offset=offset, broker_epoch=broker_epoch
    )


def pending_for(p: PartitionState, **kw: object) -> PendingRecovery:
    fields: dict[str, object] = {
        "topic": p.topic,
        "partition": p.partition,
        "strategy": "balanced",
        "trigger": "x",
        "since_ms": 0,
        "started_ms": 0,
    }
    fields.update(kw)
    return PendingRecovery(**fields)  # type: ignore[arg-type]


def answers(*cands: RecoveryCandidate) -> immutables.Map[int, RecoveryCandidate]:
    return immutables.Map({c.broker_id: c for c in cands})


def last(c: Cluster) -> StepResult:
    """The step of the last event submitted to `c`."""
    assert c.last is not None
    return c.last


def recovered(result: StepResult) -> list[MetadataRecord]:
    """The records a step's recovery evaluation wrote (after the event's own)."""
    return result.records[len(result.records) - result.recovery_records :]


def offline_cluster(strategy: str | None = "balanced", *, at: int = 0, **config: object) -> Cluster:
    """RF 3, MinISR 2, replicas [1,2,3]; all three fenced in order 3, 2, 1 at time `at`:
    NoLeader, ISR=[], ELR=[1,2], LastKnownELR=[]."""
    c = Cluster(ControllerConfig(unclean_recovery_window_ms=WINDOW, **config))  # type: ignore[arg-type]
    c.start(1, 2, 3)
    c.create("t", replication_factor=3, min_isr=2, recovery_strategy=strategy)
    c.now = at
    for b in (3, 2, 1):
        c.fence(b)
    assert c.view() == (NO_LEADER, [], [1, 2], [])
    return c


def lkelr_cluster(strategy: str | None = "balanced", *, at: int = 0) -> Cluster:
    """As offline_cluster, then (at time `at`) 1 and 2 restart uncleanly and 3 restarts:
    NoLeader, ISR=[], ELR=[], LastKnownELR=[1,2], all brokers active. A balanced recovery
    is pending from 2's registration on."""
    c = offline_cluster(strategy)
    c.now = at
    for b in (1, 2, 3):
        c.restart(b, clean=False)
    assert c.view() == (NO_LEADER, [], [], [1, 2])
    return c


# --- best_candidate and PendingRecovery ------------------------------------------------------


class TestBestCandidate:
    P = PartitionState(topic="t", partition=0, tp=("t", 0), replicas=(3, 1, 2), isr=EMPTY)

    def test_none_without_answers(self) -> None:
        assert best_candidate(self.P, []) is None

    def test_highest_last_leader_epoch_wins_over_offset(self) -> None:
        best = best_candidate(self.P, [rc(1, 4, 100), rc(2, 5, 3), rc(3, 4, 200)])
        assert best is not None and best.broker_id == 2

    def test_then_highest_log_end_offset(self) -> None:
        best = best_candidate(self.P, [rc(1, 4, 100), rc(2, 4, 300), rc(3, 4, 200)])
        assert best is not None and best.broker_id == 2

    def test_ties_go_to_the_earlier_assigned_replica(self) -> None:
        for order in ([rc(1, 4, 9), rc(2, 4, 9), rc(3, 4, 9)], [rc(2, 4, 9), rc(3, 4, 9)]):
            best = best_candidate(self.P, order)
            assert best is not None and best.broker_id == 3
        best = best_candidate(self.P, [rc(2, 4, 9), rc(1, 4, 9)])
        assert best is not None and best.broker_id == 1

    def test_a_non_replica_loses_ties_to_every_replica(self) -> None:
        best = best_candidate(self.P, [rc(9, 4, 9), rc(2, 4, 9)])
        assert best is not None and best.broker_id == 2


def test_valid_answers_are_those_of_the_current_incarnation() -> None:
    image = image_of(
        active=[1, 2],
        partitions=[PartitionRecord(topic="t", partition=0, replicas=[1, 2, 3], isr=[])],
    )
    p = image.partitions[("t", 0)]
    pr = pending_for(p, answers=answers(rc(1, 0, 5, 1), rc(2, 0, 5, 99), rc(3, 0, 5, 3)))
    assert pr.valid_answers(image) == [rc(1, 0, 5, 1)]


# --- the policies ----------------------------------------------------------------------------


def _leaderless(**kw: object) -> PartitionRecord:
    fields: dict[str, object] = {
        "topic": "t",
        "partition": 0,
        "replicas": [1, 2, 3],
        "isr": [],
        "min_isr": 2,
    }
    fields.update(kw)
    return PartitionRecord(**fields)  # type: ignore[arg-type]


class TestBalancedPolicy:
    policy = BalancedPolicy()

    @pytest.mark.parametrize(
        ("record", "expected"),
        [
            (_leaderless(isr=[1], leader=1), None),
            (_leaderless(isr=[1]), None),  # constructed: leaderless with an ISR
            (_leaderless(elr=[1]), None),
            (_leaderless(last_known_elr=[1, 2]), "isr_and_elr_empty"),
            (_leaderless(), "isr_and_elr_empty"),
        ],
    )
    def test_triggers_only_when_isr_and_elr_are_empty(
        self, record: PartitionRecord, expected: str | None
    ) -> None:
        image = image_of(fenced=[1, 2, 3], partitions=[record])
        assert self.policy.trigger(image, image.partitions[("t", 0)]) == expected

    def test_candidates_are_the_last_known_elr_and_there_is_no_window(self) -> None:
        image = image_of(fenced=[1, 2, 3], partitions=[_leaderless(last_known_elr=[3, 1])])
        assert self.policy.candidates(image, image.partitions[("t", 0)]) == {1, 3}
        assert self.policy.window_ms(WINDOW) is None

    def decide(self, image: ClusterImage, *cands: RecoveryCandidate) -> Decision:
        p = image.partitions[("t", 0)]
        return self.policy.decide(image, p, pending_for(p, answers=answers(*cands)), 10**9)

    def test_waits_for_every_member(self) -> None:
        image = image_of(active=[1, 2, 3], partitions=[_leaderless(last_known_elr=[1, 2])])
        assert self.decide(image) == Wait()
        assert self.decide(image, rc(1, 9, 9, 1), rc(3, 9, 99, 3)) == Wait()
        assert self.decide(image, rc(1, 9, 9, 1), rc(2, 9, 8, 2)) == Choose(1)
        # An answer from a non-member does not count and is never chosen.
        assert self.decide(image, rc(1, 9, 9, 1), rc(2, 9, 8, 2), rc(3, 9, 99, 3)) == Choose(1)

    def test_an_answer_from_a_previous_incarnation_does_not_count(self) -> None:
        image = image_of(active=[1, 2], partitions=[_leaderless(last_known_elr=[1, 2])])
        assert self.decide(image, rc(1, 9, 9, 1), rc(2, 9, 8, 77)) == Wait()

    def test_waits_while_the_best_replica_is_not_active(self) -> None:
        image = image_of(active=[2], fenced=[1], partitions=[_leaderless(last_known_elr=[1, 2])])
        assert self.decide(image, rc(1, 9, 9, 1), rc(2, 9, 8, 2)) == Wait()
        assert self.decide(image, rc(1, 9, 7, 1), rc(2, 9, 8, 2)) == Choose(2)

    def test_empty_last_known_elr_waits_for_an_operator(self) -> None:
        image = image_of(active=[1, 2, 3], partitions=[_leaderless()])
        assert self.decide(image, rc(1, 9, 9, 1)) == Wait()


class TestProactivePolicy:
    policy = ProactivePolicy()

    @pytest.mark.parametrize(
        ("record", "active", "expected"),
        [
            (_leaderless(isr=[1], leader=1), [1], None),
            (_leaderless(isr=[1]), [], None),
            (_leaderless(elr=[1, 2]), [2], None),  # a clean election is possible
            (_leaderless(elr=[1, 2]), [], "elr_all_fenced"),
            (_leaderless(elr=[1, 2]), [3], "elr_all_fenced"),
            (_leaderless(last_known_elr=[1]), [1], "isr_and_elr_empty"),
        ],
    )
    def test_trigger(
        self, record: PartitionRecord, active: list[int], expected: str | None
    ) -> None:
        image = image_of(
            active=active, fenced=[b for b in (1, 2, 3) if b not in active], partitions=[record]
        )
        assert self.policy.trigger(image, image.partitions[("t", 0)]) == expected

    def test_elr_member_in_controlled_shutdown_is_not_a_clean_candidate(self) -> None:
        c = offline_cluster("proactive")
        c.restart(2, clean=True)
        assert c.view() == (2, [2], [1], [])
        c.shutdown(2)
        assert c.view() == (NO_LEADER, [], [1, 2], [])
        assert self.policy.trigger(c.image, c.p()) == "elr_all_fenced"

    def test_candidates_are_every_replica_and_the_window_is_the_configured_one(self) -> None:
        image = image_of(partitions=[_leaderless(replicas=[3, 1])])
        assert self.policy.candidates(image, image.partitions[("t", 0)]) == {1, 3}
        assert self.policy.window_ms(1234) == 1234

    def test_decide(self) -> None:
        image = image_of(active=[1, 2], fenced=[3], partitions=[_leaderless()])
        p = image.partitions[("t", 0)]
        pr = pending_for(
            p,
            strategy="proactive",
            deadline_ms=500,
            answers=answers(rc(1, 1, 5, 1), rc(2, 1, 6, 2), rc(3, 9, 9, 3)),
        )
        assert self.policy.decide(image, p, pr, 499) == Wait(500)
        # At the deadline: the best answer among active brokers (3 is fenced).
        assert self.policy.decide(image, p, pr, 500) == Choose(2)
        not_a_replica = pending_for(
            p, deadline_ms=500, answers=answers(rc(1, 1, 5, 1), rc(7, 9, 9, 7))
        )
        image7 = image_of(active=[1, 2, 7], fenced=[3], partitions=[_leaderless()])
        assert self.policy.decide(image7, p, not_a_replica, 500) == Choose(1)
        none_active = pending_for(p, deadline_ms=500, answers=answers(rc(3, 9, 9, 3)))
        assert self.policy.decide(image, p, none_active, 500) == RestartWindow()
        no_deadline = pending_for(p, answers=answers(rc(1, 1, 5, 1)))
        assert self.policy.decide(image, p, no_deadline, 0) == Choose(1)


def test_manual_policy_never_acts() -> None:
    policy = ManualPolicy()
    image = image_of(active=[1], partitions=[_leaderless(last_known_elr=[1])])
    p = image.partitions[("t", 0)]
    assert policy.trigger(image, p) is None
    assert policy.candidates(image, p) == EMPTY
    assert policy.window_ms(WINDOW) is None
    assert policy.decide(image, p, pending_for(p, answers=answers(rc(1, 1, 1, 1))), 10**9) == Wait()


# --- the tracker: balanced -----------------------------------------------------------------


def test_worked_example_5_3_3_balanced_recovery() -> None:
    """Section 5.3.3: RF 3, MinISR 2, balanced; a power outage takes down every broker."""
    c = Cluster(ControllerConfig(unclean_recovery_strategy="balanced"))
    c.start(1, 2, 3)
    c.create("t", replication_factor=3, min_isr=2)
    # 1. Initial state. (Replica 1: LEO 15; replica 2: LEO 12; replica 3: LEO 10.)
    assert c.view() == (1, [1, 2, 3], [], [])
    # 3. Broker 1 is fenced; replica 2 is elected.
    c.fence(1)
    assert c.view() == (2, [2, 3], [], [])
    # 4. Broker 2 is fenced; replica 3 is elected; 2 joins the ELR.
    c.fence(2)
    assert c.view() == (3, [3], [2], [])
    # 5. Broker 3 is fenced: no leader. The partition is offline from here (time 5).
    c.now = 5
    c.fence(3)
    assert c.view() == (NO_LEADER, [], [2, 3], [])
    # The ELR is not empty: no unclean recovery.
    assert recovered(last(c)) == [] and last(c).inspections == []
    assert not c.tracker.pending
    assert c.evaluate(now=6).records == []
    # 6. Broker 1 restarts uncleanly; it was not in the ELR: nothing changes.
    epoch = c.p().partition_epoch
    c.restart(1, clean=False)
    assert c.view() == (NO_LEADER, [], [2, 3], [])
    assert c.p().partition_epoch == epoch
    assert not c.tracker.pending
    # 7. Broker 2 restarts uncleanly (without losing data): ELR -> LastKnownELR.
    c.now = 10
    c.register(2)
    assert recovered(last(c)) == [] and last(c).inspections == []
    c.unfence(2)
    assert recovered(last(c)) == [] and last(c).inspections == []
    assert c.view() == (NO_LEADER, [], [3], [2])
    assert not c.tracker.pending
    # 8. Broker 3 restarts uncleanly (losing data): ELR -> LastKnownELR.
    c.now = 20
    c.register(3)
    assert c.view() == (NO_LEADER, [], [], [2, 3])
    # 9. No clean election is possible: unclean recovery asks every active LastKnownELR
    # member, right away; broker 3, still fenced, is asked once it is unfenced.
    step = last(c)
    assert recovered(step) == []
    assert step.inspections == [
        Inspection(broker_id=2, broker_epoch=c.epoch(2), topic="t", partition=0),
    ]
    assert step.next_deadline_ms is None
    c.unfence(3)
    step = last(c)
    assert recovered(step) == []
    assert step.inspections == [
        Inspection(broker_id=3, broker_epoch=c.epoch(3), topic="t", partition=0),
    ]
    assert step.next_deadline_ms is None
    assert c.tracker.awaited(c.image, ("t", 0), POLICIES) == [2, 3]
    # Every log was last written in leader epoch 0 (replicas 2 and 3 led, briefly, without
    # writing). Broker 1's log is the longest, but it is not a recovery candidate.
    c.now = 30
    c.answer(1, 0, 15)
    assert last(c).records == []
    c.answer(2, 0, 12)
    assert last(c).records == []  # still waiting for replica 3
    assert c.tracker.awaited(c.image, ("t", 0), POLICIES) == [3]
    # 10. Once every LastKnownELR member has answered, replica 2 is chosen.
    c.now = 40
    c.answer(3, 0, 10)
    step = last(c)
    assert step.next_deadline_ms is None
    audit, change = step.records
    assert audit == UncleanRecoveryRecord(
        topic="t",
        partition=0,
        strategy="balanced",
        candidates=[rc(2, 0, 12, c.epoch(2)), rc(3, 0, 10, c.epoch(3))],
        chosen=2,
        potential_data_loss=True,
        trigger="isr_and_elr_empty",
        # Offline since the last leader was lost (5), not since the ELR emptied (20).
        offline_since_ms=5,
        at_ms=40,  # decided now: describe shows its age after a restart
    )
    assert isinstance(change, PartitionChangeRecord)
    assert change.reason is ChangeReason.UNCLEAN_RECOVERY
    assert change.election is ElectionKind.UNCLEAN_RECOVERY
    assert c.view() == (2, [2], [], [])
    assert c.p().recovery_state is LeaderRecoveryState.RECOVERING
    assert not c.tracker.pending
    assert c.tracker.awaited(c.image, ("t", 0), POLICIES) is None


class TestBalancedTracker:
    def test_nothing_pending_while_a_clean_election_is_possible(self) -> None:
        c = offline_cluster()
        step = c.evaluate(now=5)
        assert (step.records, step.inspections, step.next_deadline_ms) == ([], [], None)
        assert not c.tracker.pending

    def test_inspections_go_to_active_members_once_per_incarnation(self) -> None:
        c = offline_cluster()
        c.restart(1, clean=False)
        assert not c.tracker.pending
        c.register(2)  # unclean, still fenced
        assert c.view() == (NO_LEADER, [], [], [1, 2])
        # The registration that emptied the ELR asks the active member at once.
        assert [i.broker_id for i in last(c).inspections] == [1]
        assert c.tracker.pending[("t", 0)].trigger == "isr_and_elr_empty"
        assert c.evaluate(now=2).inspections == []  # already asked
        c.unfence(2)
        assert [i.broker_id for i in last(c).inspections] == [2]
        assert c.evaluate(now=3).inspections == []
        # Broker 1 restarts again: its new incarnation is asked again, once active.
        c.fence(1)
        assert last(c).inspections == []
        c.register(1)
        assert last(c).inspections == []  # fenced
        c.unfence(1)
        assert last(c).inspections == [
            Inspection(broker_id=1, broker_epoch=c.epoch(1), topic="t", partition=0)
        ]
        assert c.evaluate(now=4).inspections == []

    def test_a_restart_voids_the_answer_given_before_it(self) -> None:
        c = lkelr_cluster()
        c.evaluate(now=1)
        c.answer(1, 3, 50)
        c.fence(1)
        c.restart(1, clean=False)
        c.answer(2, 3, 40)
        assert c.evaluate(now=2).records == []
        assert c.tracker.awaited(c.image, ("t", 0), POLICIES) == [1]
        c.answer(1, 3, 30)
        c.evaluate(now=3)
        assert c.view() == (2, [2], [], [])

    def test_waits_while_the_best_answer_is_from_a_fenced_broker(self) -> None:
        c = lkelr_cluster()
        c.answer(1, 3, 50)
        c.fence(1)  # same epoch: its answer stays valid, but it is not active
        assert recovered(last(c)) == []
        c.answer(2, 3, 40)  # every member has answered; the best one is fenced
        assert last(c).records == []
        assert c.evaluate(now=2).records == []
        c.unfence(1)
        assert len(recovered(last(c))) == 2
        assert c.view() == (1, [1], [], [])

    def test_empty_last_known_elr_stays_pending_until_an_operator_elects(self) -> None:
        c = offline_cluster()
        c.commit([ClearElrRecord(topic="t")])  # min.insync.replicas changed
        c.restart(3, clean=False)
        assert c.view() == (NO_LEADER, [], [], [])
        for now in (0, 10**6, 10**9):
            step = c.evaluate(now=now)
            assert (step.records, step.inspections) == ([], [])
            assert ("t", 0) in c.tracker.pending
        assert c.tracker.awaited(c.image, ("t", 0), POLICIES) == []
        records = c.elect_unclean(3)
        audit = records[0]
        assert isinstance(audit, UncleanRecoveryRecord)
        assert (audit.strategy, audit.trigger, audit.chosen) == ("manual", "operator", 3)
        assert audit.offline_since_ms == 0
        assert not c.tracker.pending
        assert c.view() == (3, [3], [], [])

    def test_a_clean_election_cancels_a_pending_recovery(self) -> None:
        c = offline_cluster()
        c.restart(1, clean=False)
        c.register(2)  # unclean
        c.evaluate(now=1)
        assert ("t", 0) in c.tracker.pending
        c.answer(1, 9, 9)
        # The (constructed) cluster elects 1 cleanly: AlterPartition is impossible without
        # a leader, so fake it with a preferred-style change record.
        c.commit(
            [
                PartitionChangeRecord(
                    topic="t",
                    partition=0,
                    reason=ChangeReason.ELECTION,
                    partition_epoch=c.p().partition_epoch + 1,
                    leader_epoch=c.p().leader_epoch + 1,
                    leader=1,
                    isr=[1],
                    last_known_elr=[2],
                )
            ]
        )
        step = c.evaluate(now=2)
        assert step.records == [] and not c.tracker.pending

    def test_records_of_a_recovery_clear_elr_and_last_known_elr(self) -> None:
        c = lkelr_cluster()
        c.answer(2, 1, 1)
        assert last(c).records == []
        before = c.p()
        c.answer(1, 1, 1)
        audit, change = last(c).records
        assert isinstance(audit, UncleanRecoveryRecord)
        assert [x.broker_id for x in audit.candidates] == [1, 2]  # assignment order
        assert audit.chosen == 1  # tie: the earlier assigned replica
        assert change == PartitionChangeRecord(
            topic="t",
            partition=0,
            reason=ChangeReason.UNCLEAN_RECOVERY,
            partition_epoch=before.partition_epoch + 1,
            leader_epoch=before.leader_epoch + 1,
            election=ElectionKind.UNCLEAN_RECOVERY,
            leader=1,
            isr=[1],
            elr=None,
            last_known_elr=[],
            recovery_state=LeaderRecoveryState.RECOVERING,
        )

    def test_strategy_comes_from_the_topic_or_the_cluster_default(self) -> None:
        c = Cluster(ControllerConfig(unclean_recovery_strategy="proactive"))
        c.start(1)
        c.create("a", replication_factor=1)
        c.create("b", replication_factor=1, recovery_strategy="manual")
        assert strategy_for(c.image, "a", c.config) == "proactive"
        assert strategy_for(c.image, "b", c.config) == "manual"
        assert strategy_for(c.image, "gone", c.config) == "proactive"


def test_recovery_records_leave_already_empty_sets_unchanged() -> None:
    image = image_of(
        active=[1],
        fenced=[2],
        partitions=[
            PartitionRecord(
                topic="t",
                partition=0,
                replicas=[1, 2],
                isr=[],
                elr=[2],
                leader_epoch=4,
                partition_epoch=8,
            )
        ],
    )
    p = image.partitions[("t", 0)]
    records = recovery_records(
        image,
        p,
        1,
        strategy="proactive",
        candidates=[rc(2, 0, 0), rc(1, 0, 0), rc(7, 0, 0)],
        trigger="elr_all_fenced",
        since_ms=None,
        election=ElectionKind.UNCLEAN_RECOVERY,
    )
    audit, change = records
    assert isinstance(audit, UncleanRecoveryRecord) and isinstance(change, PartitionChangeRecord)
    assert [x.broker_id for x in audit.candidates] == [1, 2, 7]
    assert audit.offline_since_ms is None
    assert (change.elr, change.last_known_elr) == ([], None)
    assert (change.leader_epoch, change.partition_epoch) == (5, 9)


# --- the tracker: proactive ----------------------------------------------------------------


class TestProactiveTracker:
    def start(self) -> Cluster:
        """ELR [1, 2], both fenced; broker 3 (out of sync) restarts uncleanly."""
        c = offline_cluster("proactive", at=100)
        step = last(c)  # the fence of broker 1 left the ELR all fenced
        pr = c.tracker.pending[("t", 0)]
        assert (pr.trigger, pr.since_ms, pr.deadline_ms) == ("elr_all_fenced", 100, 1100)
        assert step.next_deadline_ms == 1100
        assert step.inspections == []  # nobody is active
        assert recovered(step) == []
        c.now = 200
        c.register(3)
        assert last(c).inspections == []  # fenced
        c.unfence(3)
        step = last(c)
        assert [i.broker_id for i in step.inspections] == [3]
        assert recovered(step) == [] and step.next_deadline_ms == 1100
        return c

    def test_window_end_chooses_the_best_active_answer(self) -> None:
        c = self.start()
        c.answer(3, 0, 5)
        assert last(c).records == [] and last(c).next_deadline_ms == 1100
        step = c.evaluate(now=1099)
        assert step.records == [] and step.next_deadline_ms == 1100
        step = c.evaluate(now=1100)
        audit, _ = step.records
        assert isinstance(audit, UncleanRecoveryRecord)
        assert (audit.strategy, audit.trigger, audit.chosen) == ("proactive", "elr_all_fenced", 3)
        assert audit.offline_since_ms == 100
        assert step.next_deadline_ms is None
        assert c.view() == (3, [3], [], [])  # the fenced ELR members are cleared too
        assert c.p().recovery_state is LeaderRecoveryState.RECOVERING

    def test_a_clean_election_during_the_window_cancels(self) -> None:
        c = self.start()
        c.answer(3, 0, 500)
        c.restart(2, clean=True)
        assert c.view() == (2, [2], [1], [])
        step = last(c)  # the unfence that elected 2 cleanly
        assert recovered(step) == [] and step.next_deadline_ms is None
        assert not c.tracker.pending
        assert c.evaluate(now=2000).records == [] and not c.tracker.pending
        assert c.view() == (2, [2], [1], [])
        # A late answer for a recovery that is over is ignored.
        tracker, image = c.tracker, c.image
        late = ReplicaLogInfo(
            broker_id=3,
            broker_epoch=c.epoch(3),
            topic="t",
            partition=0,
            last_leader_epoch=0,
            log_end_offset=600,
        )
        assert record_answer(image, tracker, late) is tracker
        c.answer(3, 0, 600)
        assert last(c).records == [] and last(c).inspections == []
        assert c.tracker == tracker and c.image is image

    def test_no_active_answer_at_the_window_end_starts_a_new_window(self) -> None:
        c = self.start()
        step = c.evaluate(now=1100)  # 3 never answered
        assert step.records == []
        assert step.next_deadline_ms == 2100
        assert [i.broker_id for i in step.inspections] == [3]  # asked again
        pr = c.tracker.pending[("t", 0)]
        assert (pr.since_ms, pr.started_ms, pr.deadline_ms) == (100, 1100, 2100)
        c.answer(3, 0, 1)
        assert c.evaluate(now=2099).records == []
        assert len(c.evaluate(now=2100).records) == 2

    def test_only_brokers_active_at_the_window_end_count(self) -> None:
        c = self.start()
        c.answer(3, 7, 7)
        c.fence(3)
        step = c.evaluate(now=1100)
        assert step.records == [] and step.next_deadline_ms == 2100
        c.unfence(3)  # the same incarnation: its answer is still valid
        audit = c.evaluate(now=2100).records[0]
        assert isinstance(audit, UncleanRecoveryRecord) and audit.chosen == 3

    def test_an_answer_from_a_broker_that_hosts_no_replica_is_never_chosen(self) -> None:
        # Found by the state machine: broker 4 (no replica of t-0) answered for t-0, had
        # the "best" log, and was made leader and sole ISR member of a partition it does
        # not host.
        c = Cluster(ControllerConfig(unclean_recovery_window_ms=WINDOW))
        c.start(1, 2, 3, 4)
        c.create("t", assignments=[[1, 2, 3]], min_isr=2, recovery_strategy="proactive")
        for b in (1, 2, 3):
            c.fence(b)
        c.evaluate(now=0)
        c.answer(4, 9, 999)
        step = c.evaluate(now=WINDOW)
        assert step.records == []  # no usable answer: a new window
        assert c.tracker.pending[("t", 0)].deadline_ms == 2 * WINDOW
        c.restart(3, clean=False)
        c.answer(3, 0, 1)
        audit = c.evaluate(now=2 * WINDOW).records[0]
        assert isinstance(audit, UncleanRecoveryRecord)
        assert audit.chosen == 3
        assert [x.broker_id for x in audit.candidates] == [3]
        assert c.view() == (3, [3], [], [])

    def test_the_earliest_deadline_is_reported(self) -> None:
        c = Cluster(ControllerConfig(unclean_recovery_window_ms=WINDOW))
        c.start(1, 2, 3)
        c.create("a", assignments=[[1, 2]], min_isr=2, recovery_strategy="proactive")
        c.create("b", assignments=[[3]], min_isr=1, recovery_strategy="proactive")
        c.create("c", assignments=[[1]], min_isr=1)  # balanced: no deadline
        c.now = 10
        c.fence(3)
        assert last(c).next_deadline_ms == 1010
        c.now = 500
        c.fence(1)
        assert last(c).next_deadline_ms == 1010
        c.fence(2)  # a-0's ELR is all fenced now: its window ends at 1500
        assert last(c).next_deadline_ms == 1010
        assert set(c.tracker.pending) == {("a", 0), ("b", 0)}
        c.register(1)  # unclean: c-0 (balanced) has an empty ISR and ELR now
        assert last(c).next_deadline_ms == 1010
        assert c.evaluate(now=500).next_deadline_ms == 1010
        assert set(c.tracker.pending) == {("a", 0), ("b", 0), ("c", 0)}
        assert c.tracker.pending[("a", 0)].deadline_ms == 1500
        assert c.tracker.pending[("c", 0)].deadline_ms is None


# --- the tracker: manual and operator elections --------------------------------------------


class TestManual:
    def test_manual_topics_never_recover_by_themselves(self) -> None:
        c = offline_cluster("manual")
        for b in (1, 2, 3):
            c.restart(b, clean=False)
        assert c.view() == (NO_LEADER, [], [], [1, 2])
        for now in (0, 10**9):
            step = c.evaluate(now=now)
            assert (step.records, step.inspections) == ([], [])
        assert not c.tracker.pending

    def test_operator_unclean_election_of_a_named_replica(self) -> None:
        c = offline_cluster("manual", at=7)  # leaderless from time 7
        c.now = 30
        c.restart(3, clean=False)
        records = c.elect_unclean(3)
        audit, change = records
        assert audit == UncleanRecoveryRecord(
            topic="t",
            partition=0,
            strategy="manual",
            candidates=[],
            chosen=3,
            trigger="operator",
            offline_since_ms=7,  # no recovery was pending, but the outage began at 7
            at_ms=30,
        )
        assert isinstance(change, PartitionChangeRecord)
        assert change.election is ElectionKind.MANUAL
        assert c.view() == (3, [3], [], [])
        assert c.p().recovery_state is LeaderRecoveryState.RECOVERING

    def test_operator_election_takes_over_a_pending_recovery(self) -> None:
        c = lkelr_cluster("balanced", at=50)
        # Pending from 50 (the ELR emptied), offline since 0 (the last leader was fenced).
        assert c.tracker.pending[("t", 0)].started_ms == 50
        assert c.tracker.pending[("t", 0)].since_ms == 0
        c.now = 55
        c.answer(1, 1, 10)
        c.answer(3, 1, 99)  # not a candidate of balanced, but reported in the audit
        records = c.elect_unclean(2)
        audit = records[0]
        assert isinstance(audit, UncleanRecoveryRecord)
        assert sorted(x.broker_id for x in audit.candidates) == [1, 3]
        assert audit.offline_since_ms == 0
        assert not c.tracker.pending
        assert c.view() == (2, [2], [], [])
        assert c.evaluate(now=60).records == []

    def test_errors(self) -> None:
        c = offline_cluster("manual")
        c.restart(3, clean=False)
        before = (c.image, c.tracker)
        with pytest.raises(UnknownTopicOrPartitionError):
            c.elect_unclean(3, partition=4)
        with pytest.raises(InvalidRequestError) as e:
            c.elect_unclean(None)
        assert e.value.code == "INVALID_REQUEST"
        with pytest.raises(IneligibleReplicaError):
            c.elect_unclean(1)  # fenced
        assert c.image is before[0] and c.tracker is before[1]
        c.start(4)
        with pytest.raises(IneligibleReplicaError):
            c.elect_unclean(4)  # not a replica
        c.elect_unclean(3)
        with pytest.raises(ElectionNotNeededError) as e2:
            c.elect_unclean(3)
        assert e2.value.code == "ELECTION_NOT_NEEDED"


# --- answers and the tracker's bookkeeping ---------------------------------------------------


class TestRecordAnswer:
    def reply(self, broker: int, epoch: int, partition: int = 0) -> ReplicaLogInfo:
        return ReplicaLogInfo(
            broker_id=broker,
            broker_epoch=epoch,
            topic="t",
            partition=partition,
            last_leader_epoch=1,
            log_end_offset=2,
        )

    def test_stale_and_unknown_brokers_are_refused(self) -> None:
        c = lkelr_cluster()
        c.evaluate(now=1)
        with pytest.raises(StaleBrokerEpochError, match="current epoch"):
            record_answer(c.image, c.tracker, self.reply(1, c.epoch(1) - 1))
        with pytest.raises(StaleBrokerEpochError, match="unregistered") as e:
            record_answer(c.image, c.tracker, self.reply(9, 0))
        assert e.value.code == "STALE_BROKER_EPOCH"

    def test_answers_are_kept_per_broker_latest_wins(self) -> None:
        c = lkelr_cluster()
        c.evaluate(now=1)
        t1 = record_answer(c.image, c.tracker, self.reply(1, c.epoch(1)))
        t2 = record_answer(
            c.image,
            t1,
            ReplicaLogInfo(
                broker_id=1,
                broker_epoch=c.epoch(1),
                topic="t",
                partition=0,
                last_leader_epoch=5,
                log_end_offset=6,
            ),
        )
        assert c.tracker.pending[("t", 0)].answers == immutables.Map()
        assert t2.pending[("t", 0)].answers[1] == rc(1, 5, 6, c.epoch(1))
        # An answer for a partition with no pending recovery changes nothing.
        assert record_answer(c.image, t2, self.reply(1, c.epoch(1), partition=3)) is t2


class TestEvaluateBookkeeping:
    def test_pending_recovery_of_a_partition_that_no_longer_exists_is_dropped(self) -> None:
        c = Cluster()
        p = PartitionState(topic="gone", partition=0, tp=("gone", 0), replicas=(1,), isr=EMPTY)
        tracker = RecoveryTracker(immutables.Map({("gone", 0): pending_for(p)}))
        # The partition's removal queued it (as a changed partition): it is looked at.
        c.state = ControllerState(c.image, tracker, Backlog().with_partitions([("gone", 0)]))
        step = c.evaluate(now=1)
        assert (step.records, step.inspections, step.next_deadline_ms) == ([], [], None)
        assert not c.tracker.pending

    def test_topics_whose_policy_is_not_loaded_are_left_alone(self) -> None:
        c = lkelr_cluster("manual")
        assert not c.tracker.pending
        c.rules = Rules(c.config, {"balanced": BalancedPolicy()})
        pr = pending_for(c.p(), strategy="manual")
        tracker = RecoveryTracker(immutables.Map({("t", 0): pr}))
        c.state = ControllerState(c.image, tracker, EVERYTHING)  # every leaderless one
        step = c.evaluate(now=1)
        assert (step.records, step.inspections) == ([], [])
        assert not c.tracker.pending

    def test_scope_limits_what_is_looked_at(self) -> None:
        config = ControllerConfig()
        image = image_of(
            active=[1, 2],
            partitions=[
                _leaderless(topic="a", replicas=[1], last_known_elr=[1], min_isr=1),
                _leaderless(topic="b", replicas=[2], last_known_elr=[2], min_isr=1),
                PartitionRecord(topic="c", partition=0, replicas=[1], isr=[1], leader=1),
            ],
            min_isr=1,
        )
        assert view(image.partitions[("a", 0)]) == (NO_LEADER, [], [], [1])
        assert view(image.partitions[("b", 0)]) == (NO_LEADER, [], [], [2])
        tracker = RecoveryTracker()

        def run(scope: list[tuple[str, int]] | None) -> set[tuple[str, int]]:
            nonlocal tracker
            if scope is None:
                step = evaluate_all(image, tracker, 5, policies=POLICIES, config=config)
            else:
                step = evaluate(image, tracker, 5, policies=POLICIES, config=config, scope=scope)
            tracker = step.tracker
            return set(step.tracker.pending)

        assert run([]) == set()
        # A partition in scope that is not leaderless (or does not exist) starts nothing.
        assert run([("a", 0), ("a", 0), ("c", 0), ("nope", 3)]) == {("a", 0)}
        # A pending recovery with a new answer is looked at, in scope or not.
        tracker = record_answer(
            image,
            tracker,
            ReplicaLogInfo(
                broker_id=1,
                broker_epoch=image.brokers[1].epoch,
                topic="a",
                partition=0,
                last_leader_epoch=0,
                log_end_offset=0,
            ),
        )
        assert tracker.answered == {("a", 0)}
        step = evaluate(image, tracker, 6, policies=POLICIES, config=config, scope=[])
        assert [r.topic for r in step.records if isinstance(r, UncleanRecoveryRecord)] == ["a"]
        image = replay(image, step.records)
        tracker = step.tracker
        assert not tracker.pending
        assert run(None) == {("b", 0)}

    def test_awaited(self) -> None:
        c = offline_cluster()  # a clean election is still possible: nothing pending
        assert c.tracker.awaited(c.image, ("t", 0), POLICIES) is None
        for b in (1, 2, 3):
            c.restart(b, clean=False)
        assert c.tracker.awaited(c.image, ("t", 0), POLICIES) == [1, 2]
        c.answer(2, 0, 0)
        assert c.tracker.awaited(c.image, ("t", 0), POLICIES) == [1]


# --- the registry --------------------------------------------------------------------------


def _declared_entry_points() -> dict[str, str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared: dict[str, str] = pyproject["project"]["entry-points"][registry.GROUP]
    return declared


def _install_distribution(tmp: Path, monkeypatch: pytest.MonkeyPatch, eps: dict[str, str]) -> None:
    """Put a `metactl` distribution with these entry points first on sys.path, so that
    importlib.metadata finds it (and not an editable install whose metadata may be older)."""
    dist = tmp / "metactl-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: metactl\nVersion: 0.1.0\n")
    lines = [f"[{registry.GROUP}]", *(f"{k} = {v}" for k, v in eps.items())]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n")
    monkeypatch.syspath_prepend(str(tmp))


class CautiousPolicy(ManualPolicy):
    name: ClassVar[str] = "cautious"


def _mark_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replace the registry's fallback built-ins by recognisable subclasses."""

    class FallbackBalanced(BalancedPolicy):
        pass

    class FallbackProactive(ProactivePolicy):
        pass

    class FallbackManual(ManualPolicy):
        pass

    monkeypatch.setattr(registry, "BalancedPolicy", FallbackBalanced)
    monkeypatch.setattr(registry, "ProactivePolicy", FallbackProactive)
    monkeypatch.setattr(registry, "ManualPolicy", FallbackManual)


class TestRegistry:
    def test_pyproject_declares_the_three_built_ins(self) -> None:
        assert _declared_entry_points() == {
            "balanced": "controller.core.recovery.builtin:BalancedPolicy",
            "proactive": "controller.core.recovery.builtin:ProactivePolicy",
            "manual": "controller.core.recovery.builtin:ManualPolicy",
        }

    def test_the_installed_distribution_registers_them(self) -> None:
        """Checks the real installation, once it is current (`make setup` reinstalls when
        pyproject.toml changes; an editable install made before the entry-point table was
        added does not have it, and load_policies then only has its fallback)."""
        installed = {
            ep.name: ep.value
            for ep in distribution("metactl").entry_points
            if ep.group == registry.GROUP
        }
        if not installed:
            pytest.skip("the installed metactl metadata predates its entry points: make setup")
        assert installed == _declared_entry_points()

    def test_load_policies_finds_the_built_ins_through_entry_points(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        _install_distribution(tmp_path, monkeypatch, _declared_entry_points())
        assert {ep.name for ep in entry_points(group=registry.GROUP)} == {
            "balanced",
            "proactive",
            "manual",
        }
        _mark_fallbacks(monkeypatch)
        policies = registry.load_policies()
        # Exactly the classes the entry points name, not the marked fallbacks.
        assert {k: type(v) for k, v in policies.items()} == {
            "balanced": BalancedPolicy,
            "proactive": ProactivePolicy,
            "manual": ManualPolicy,
        }

    def test_a_third_party_policy_is_found_beside_the_built_ins(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        eps = {"cautious": f"{__name__}:CautiousPolicy"}
        _install_distribution(tmp_path, monkeypatch, eps)
        policies = registry.load_policies()
        assert set(policies) == {"balanced", "proactive", "manual", "cautious"}
        assert isinstance(policies["cautious"], CautiousPolicy)

    def test_an_entry_point_whose_policy_has_another_name_is_refused(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        _install_distribution(
            tmp_path, monkeypatch, {"careful": "controller.core.recovery.builtin:ManualPolicy"}
        )
        with pytest.raises(UnknownRecoveryPolicyError, match="'careful' loads a policy named"):
            registry.load_policies()

    def test_without_entry_points_the_built_ins_are_still_there(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(registry, "entry_points", lambda group: [])
        _mark_fallbacks(monkeypatch)
        policies = registry.load_policies()
        assert {k: type(v).__name__ for k, v in policies.items()} == {
            "balanced": "FallbackBalanced",
            "proactive": "FallbackProactive",
            "manual": "FallbackManual",
        }

    def test_require(self) -> None:
        policies = dict(POLICIES)
        assert registry.require(policies, "proactive") is POLICIES["proactive"]
        with pytest.raises(UnknownRecoveryPolicyError) as e:
            registry.require(policies, "yolo")
        assert e.value.code == "UNKNOWN_RECOVERY_POLICY"
        assert "'yolo'" in e.value.message and "balanced, manual, proactive" in e.value.message
        assert e.value.__cause__ is None and e.value.__suppress_context__


# --- offline_since_ms: from the loss of the last leader ------------------------------------


class TestOfflineSince:
    """The UncleanRecoveryRecord's offline_since_ms is when the partition lost its last
    leader: not when the recovery became pending (the old rule), and not an earlier
    outage's start."""

    def test_a_second_outage_counts_from_its_own_leader_loss(self) -> None:
        c = offline_cluster("balanced", at=10)  # leaderless from 10, ELR [1, 2]
        assert c.tracker.offline_since(c.p()) == 10
        c.now = 20
        c.restart(2, clean=True)  # 2 is elected from the ELR: the outage ends
        assert c.view()[0] == 2
        assert c.tracker.offline_since(c.p()) is None
        c.now = 30
        c.fence(2)  # the second outage begins
        assert c.view()[0] == NO_LEADER
        assert c.tracker.offline_since(c.p()) == 30
        c.now = 40
        for b in (1, 2):  # every ELR member returns uncleanly: the ELR empties
            c.restart(b, clean=False)
        pr = c.tracker.pending[("t", 0)]
        assert (pr.started_ms, pr.since_ms) == (40, 30)
        c.now = 45
        c.answer(1, 3, 10)
        c.answer(2, 3, 20)
        audit = next(r for r in c.log if isinstance(r, UncleanRecoveryRecord))
        assert (audit.chosen, audit.offline_since_ms) == (2, 30)
        assert ("t", 0) not in c.tracker.offline  # led again: the note is gone

    def test_a_fresh_controller_counts_from_its_first_look(self) -> None:
        c = offline_cluster("balanced", at=10)
        c.now = 20
        c.restart(1, clean=True)  # led by 1 again: the step that elected it drops the note
        assert ("t", 0) not in c.tracker.offline
        c.now = 30
        c.fence(1)
        c.now = 35
        c.restart(2, clean=True)  # led again
        assert ("t", 0) not in c.tracker.offline and c.tracker.offline_since(c.p()) is None
        # A restarted controller: no soft state, a full look at the next step.
        c.state = ControllerState(c.image)
        c.now = 50
        c.fence(2)
        c.fence(3)
        c.evaluate(now=60)
        assert c.tracker.offline_since(c.p()) == 50
        # A note left behind (a reverted controller keeps its soft state, and a record
        # absorbed from outside the step may elect) goes at the next look at it.
        c.restart(2, clean=True)
        assert c.view()[0] == 2 and ("t", 0) not in c.tracker.offline
        stale = msgspec.structs.replace(c.tracker, offline=c.tracker.offline.set(("t", 0), (0, 1)))
        c.state = ControllerState(c.image, stale)
        c.evaluate(now=70)
        assert ("t", 0) not in c.tracker.offline


class TestTrackerMemory:
    """A recovery of many partitions at once keeps its per-partition state small: the
    notes of one pass share their (leader epoch, time) tuples, the pending recoveries that
    asked the same broker at the same epoch share one map, under each partition's own
    (topic, partition) tuple."""

    def test_recoveries_share_their_notes_and_request_maps(self) -> None:
        c = Cluster()
        c.start(1, 2)
        c.create("t", assignments=[[1]] * 6, min_isr=1)
        c.fence(1)
        c.restart(1, clean=False)
        pending = c.tracker.pending
        assert len(pending) == 6
        maps = {id(pr.requested) for pr in pending.values()}
        assert len(maps) == 1 and dict(next(iter(pending.values())).requested) == {1: c.epoch(1)}
        notes = {id(note) for note in c.tracker.offline.values()}
        assert len(notes) == 1
        for tp in pending:
            assert tp is c.p(*tp).tp

    def test_the_shared_maps_are_bounded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        table: dict[object, object] = {}
        monkeypatch.setattr(tracker_module, "_REQUESTED", table)
        monkeypatch.setattr(tracker_module, "_REQUESTED_LIMIT", 1)
        a = tracker_module._shared(immutables.Map({1: 5}))
        assert tracker_module._shared(immutables.Map({1: 5})) is a
        b = tracker_module._shared(immutables.Map({2: 5}))
        assert b == immutables.Map({2: 5}) and len(table) == 1
