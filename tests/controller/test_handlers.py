"""The pure request handlers: rules 2-6, 8 and 9, every error code, and the worked examples
5.2.2 (clean ELR-based recovery) and KIP-966's "How it works", replayed step by step."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest

from controller.core.broker_handlers import (
    controlled_shutdown,
    fence_broker,
    register_broker,
    unfence_broker,
)
from controller.core.config import ControllerConfig
from controller.core.partition_handlers import alter_partition, elect_preferred
from controller.core.topic_handlers import create_topic
from metactl.errors import (
    BrokerIdNotRegisteredError,
    DuplicateBrokerRegistrationError,
    ElectionNotNeededError,
    FencedLeaderEpochError,
    IneligibleReplicaError,
    InvalidConfigurationError,
    InvalidReplicaAssignmentError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    InvalidTopicError,
    InvalidUpdateVersionError,
    MetactlError,
    NotLeaderOrFollowerError,
    PreferredLeaderNotAvailableError,
    StaleBrokerEpochError,
    TopicAlreadyExistsError,
    UnknownRecoveryPolicyError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import (
    NO_LEADER,
    BrokerRegistrationChangeRecord,
    ChangeReason,
    ElectionKind,
    FenceBrokerRecord,
    LeaderRecoveryState,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)
from protocol.messages.admin import CreateTopic, ElectLeader
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
    FenceBroker,
    UnfenceBroker,
)

from .testkit import KNOWN_STRATEGIES, Cluster, apply, image_of

CFG = ControllerConfig()


def three_brokers(min_isr: int = 2, **topic: object) -> Cluster:
    """Brokers 1-3 active; topic t: replicas [1,2,3], Leader=1, ISR=[1,2,3]."""
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", replication_factor=3, min_isr=min_isr, **topic)
    assert c.view() == (1, [1, 2, 3], [], [])
    return c


def changes(records: Sequence[object]) -> list[PartitionChangeRecord]:
    return [r for r in records if isinstance(r, PartitionChangeRecord)]


# --- rule 3: registration ----------------------------------------------------------------


class TestRegistration:
    def test_epoch_is_the_offset_of_the_registration_record_and_strictly_increases(self) -> None:
        c = Cluster()
        epochs = []
        for b in (5, 6, 7):
            before = c.image.end_offset
            r = c.register(b)
            assert r.broker_epoch == before
            record = c.log[r.broker_epoch]
            assert isinstance(record, RegisterBrokerRecord)
            assert record.broker_epoch == r.broker_epoch
            c.unfence(b)
            epochs.append(r.broker_epoch)
        c.fence(5)
        epochs.append(c.register(5).broker_epoch)
        assert epochs == sorted(set(epochs))
        assert c.epoch(5) == epochs[-1]

    def test_a_new_registration_stays_fenced_until_unfenced(self) -> None:
        c = Cluster()
        c.register(1)
        b = c.image.brokers[1]
        assert b.fenced and not b.active
        result = c.unfence(1)
        assert result.records == [UnfenceBrokerRecord(broker_id=1, broker_epoch=b.epoch)]
        assert c.image.brokers[1].active

    def test_first_registration_of_a_broker_without_replicas_is_clean(self) -> None:
        c = Cluster()
        assert c.register(1).clean
        assert c.image.brokers[1].last_registration_clean

    def test_first_registration_presenting_an_epoch_is_clean_too(self) -> None:
        # Documented design decision: a broker hosting no replicas has nothing to lose,
        # whatever epoch its clean-shutdown file names.
        c = Cluster()
        assert c.register(1, previous_epoch=41).clean

    def test_first_registration_of_a_broker_that_hosts_replicas_is_unclean(self) -> None:
        # Only reachable from a log that names the broker before it registers.
        image = replay(
            ClusterImage(),
            [
                TopicRecord(name="t", topic_id="x", partitions=1, min_isr=1),
                PartitionRecord(topic="t", partition=0, replicas=[7], isr=[], elr=[7]),
            ],
        )
        result = register_broker(image, RegisterBroker(broker_id=7, incarnation_id="a"), 0, CFG)
        assert result.response == RegisterBrokerResponse(broker_epoch=2, clean=False)
        after = apply(image, result).partitions[("t", 0)]
        assert (after.elr, after.last_known_elr) == (frozenset(), frozenset({7}))

    def test_duplicate_registration_of_an_active_broker_is_refused(self) -> None:
        c = three_brokers()
        with pytest.raises(DuplicateBrokerRegistrationError) as e:
            register_broker(c.image, RegisterBroker(broker_id=2, incarnation_id="new"), 0, CFG)
        assert e.value.code == "DUPLICATE_BROKER_REGISTRATION"
        assert e.value.retriable

    def test_new_incarnation_of_a_fenced_broker_is_accepted(self) -> None:
        c = three_brokers()
        c.fence(2)
        old = c.epoch(2)
        r = c.register(2, clean=True)
        assert r.broker_epoch > old
        assert r.clean

    def test_retry_of_a_registration_returns_the_same_epoch_and_writes_nothing(self) -> None:
        c = Cluster()
        c.start(1)
        c.fence(1)
        prev = c.epoch(1)
        request = RegisterBroker(broker_id=1, incarnation_id="again", previous_epoch=prev)
        first = register_broker(c.image, request, 0, CFG)
        c.commit(first.records)
        assert first.response == RegisterBrokerResponse(broker_epoch=c.epoch(1), clean=True)
        # The broker is still fenced (it has not unfenced yet) when its retry arrives.
        retry = register_broker(c.image, request, 0, CFG)
        assert retry.records == []
        assert retry.response == first.response
        # ... and once unfenced, a retry is just as harmless.
        c.unfence(1)
        again = register_broker(c.image, request, 0, CFG)
        assert (again.records, again.response) == ([], first.response)

    def test_retry_of_a_clean_registration_does_not_make_it_unclean(self) -> None:
        c = three_brokers()
        c.alter([1])
        c.fence(2)
        assert c.view() == (1, [1], [2, 3], [])
        request = RegisterBroker(broker_id=2, incarnation_id="2b", previous_epoch=c.epoch(2))
        c.run(request)
        c.run(request)
        assert c.view() == (1, [1], [2, 3], [])
        assert c.image.brokers[2].last_registration_clean

    @pytest.mark.parametrize("presented", [None, "stale", "future"])
    def test_registration_is_clean_only_if_the_presented_epoch_is_the_last_one(
        self, presented: str | None
    ) -> None:
        c = three_brokers()
        c.fence(2)
        last = c.epoch(2)
        previous = {None: None, "stale": last - 1, "future": last + 1}[presented]
        assert not c.register(2, previous_epoch=previous).clean
        assert not c.image.brokers[2].last_registration_clean

    def test_unclean_registration_moves_the_broker_from_every_elr_to_last_known_elr(
        self,
    ) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("a", assignments=[[1, 2, 3], [2, 3, 1]], min_isr=2)
        c.create("b", assignments=[[1, 2]], min_isr=2)
        c.create("c", assignments=[[3, 1]], min_isr=2)
        c.alter([1], "a", 0)
        c.alter([2], "a", 1)
        c.alter([1], "b", 0)
        assert c.view("a", 0) == (1, [1], [2, 3], [])
        assert c.view("a", 1) == (2, [2], [1, 3], [])
        assert c.view("b", 0) == (1, [1], [2], [])
        assert c.view("c", 0) == (3, [1, 3], [], [])
        c.fence(3)
        c.fence(2)
        before_c = c.p("c", 0)
        r = c.register(2)
        assert not r.clean
        assert c.view("a", 0) == (1, [1], [3], [2])
        assert c.view("a", 1) == (1, [1], [3], [2])
        assert c.view("b", 0) == (1, [1], [], [2])
        assert c.p("c", 0) == before_c  # 2 hosts no replica of c
        records = changes(c.log[r.broker_epoch + 1 :])
        assert len(records) == 3
        assert all(x.reason is ChangeReason.UNCLEAN_REGISTRATION for x in records)
        assert all(x.broker == 2 and x.leader is None and x.isr is None for x in records)

    def test_clean_registration_keeps_elr_memberships(self) -> None:
        c = three_brokers()
        c.alter([1])
        c.fence(2)
        r = c.register(2, clean=True)
        assert r.clean
        assert c.view() == (1, [1], [2, 3], [])
        assert c.log[-1] == c.log[r.broker_epoch]  # no partition change

    def test_new_incarnation_of_a_broker_in_controlled_shutdown_retires_the_old_one(
        self,
    ) -> None:
        c = three_brokers()
        c.shutdown(2)
        old = c.epoch(2)
        base = c.image.end_offset
        result = c.run(
            RegisterBroker(broker_id=2, incarnation_id="2b", previous_epoch=old),
        )
        assert result.records[0] == FenceBrokerRecord(
            broker_id=2, broker_epoch=old, reason="reregistration"
        )
        assert isinstance(result.records[1], RegisterBrokerRecord)
        assert result.response == RegisterBrokerResponse(broker_epoch=base + 1, clean=True)
        b = c.image.brokers[2]
        assert (b.epoch, b.fenced, b.in_controlled_shutdown) == (base + 1, True, False)


# --- rule 2: fencing ---------------------------------------------------------------------


class TestFence:
    def test_unknown_broker(self) -> None:
        with pytest.raises(BrokerIdNotRegisteredError) as e:
            fence_broker(ClusterImage(), FenceBroker(broker_id=1), 0, CFG)
        assert e.value.code == "BROKER_ID_NOT_REGISTERED"

    def test_fencing_a_fenced_broker_writes_nothing(self) -> None:
        c = three_brokers()
        c.fence(2)
        result = c.fence(2)
        assert result.records == [] and result.response == Ack()

    def test_fence_removes_the_broker_from_every_isr(self) -> None:
        c = Cluster()
        c.start(1, 2, 3, 4)
        c.create("a", partitions=4, replication_factor=3, min_isr=1)
        c.create("b", assignments=[[4, 1]], min_isr=1)
        result = c.fence(1)
        assert result.records[0] == FenceBrokerRecord(
            broker_id=1, broker_epoch=c.epoch(1), reason="session_timeout"
        )
        for p in c.image.partitions.values():
            assert 1 not in p.isr
            assert p.leader != 1
        hosting = [p for p in c.image.partitions.values() if 1 in p.replicas]
        assert len(changes(result.records)) == len(hosting) == 4
        assert all(
            x.reason is ChangeReason.FENCE and x.broker == 1 for x in changes(result.records)
        )

    def test_fence_reason_is_recorded(self) -> None:
        c = three_brokers()
        result = c.run(FenceBroker(broker_id=3, reason="operator"))
        assert result.records[0] == FenceBrokerRecord(
            broker_id=3, broker_epoch=c.epoch(3), reason="operator"
        )

    def test_current_leader_is_kept_when_a_follower_is_fenced(self) -> None:
        c = three_brokers()
        c.fence(2)
        assert c.view() == (1, [1, 3], [], [])
        assert c.p().leader_epoch == 0
        assert c.p().partition_epoch == 1

    def test_new_leader_is_the_first_active_isr_member_in_assignment_order(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 3, 2]], min_isr=1)
        c.fence(1)
        assert c.view() == (3, [2, 3], [], [])
        change = changes(c.log)[-1]
        assert (change.election, change.leader_epoch) == (ElectionKind.ISR, 1)

    def test_fencing_the_last_isr_member_leaves_the_partition_leaderless(self) -> None:
        c = three_brokers()
        c.fence(3)
        c.fence(2)
        c.fence(1)
        assert c.view() == (NO_LEADER, [], [1, 2], [])
        assert ("t", 0) in c.image.offline

    def test_fencing_an_elr_member_changes_nothing_in_the_partition(self) -> None:
        c = three_brokers()
        c.alter([1])
        c.shutdown(2)  # 2 is unfenced but in controlled shutdown, and still in the ELR
        before = c.p()
        result = c.fence(2)
        assert changes(result.records) == []
        assert c.p() == before


# --- rule 4: unfencing -------------------------------------------------------------------


class TestUnfence:
    def test_unknown_broker(self) -> None:
        with pytest.raises(BrokerIdNotRegisteredError):
            unfence_broker(ClusterImage(), UnfenceBroker(broker_id=1, broker_epoch=0), 0, CFG)

    def test_stale_epoch(self) -> None:
        c = Cluster()
        c.register(1)
        with pytest.raises(StaleBrokerEpochError) as e:
            unfence_broker(c.image, UnfenceBroker(broker_id=1, broker_epoch=c.epoch(1) + 1), 0, CFG)
        assert e.value.code == "STALE_BROKER_EPOCH"

    def test_unfencing_an_unfenced_broker_writes_nothing(self) -> None:
        c = Cluster()
        c.start(1)
        result = c.unfence(1)
        assert result.records == [] and result.response == Ack()

    def test_unfence_elects_in_every_leaderless_partition_where_the_broker_is_in_the_elr(
        self,
    ) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("a", assignments=[[1, 2], [2, 1]], min_isr=2)
        c.create("b", assignments=[[3, 2]], min_isr=2)
        c.fence(2)
        c.fence(1)
        c.fence(3)
        assert c.view("a", 0) == (NO_LEADER, [], [1, 2], [])
        assert c.view("a", 1) == (NO_LEADER, [], [1, 2], [])
        assert c.view("b", 0) == (NO_LEADER, [], [2, 3], [])
        result = c.unfence(2)
        assert len(changes(result.records)) == 3
        assert all(x.reason is ChangeReason.UNFENCE for x in changes(result.records))
        assert c.view("a", 0) == (2, [2], [1], [])
        assert c.view("a", 1) == (2, [2], [1], [])
        assert c.view("b", 0) == (2, [2], [3], [])
        assert not c.image.offline

    def test_unfence_does_not_elect_where_the_broker_is_only_in_last_known_elr(self) -> None:
        c = three_brokers()
        for b in (3, 2, 1):
            c.fence(b)
        c.register(2)  # unclean: 2 moves to the LastKnownELR
        assert c.view() == (NO_LEADER, [], [1], [2])
        result = c.unfence(2)
        assert changes(result.records) == []
        assert c.view() == (NO_LEADER, [], [1], [2])

    def test_unfence_writes_no_change_where_no_election_is_possible(self) -> None:
        # Constructed image: a leaderless partition whose ISR names only a fenced broker
        # (handlers never leave one). Unfencing ELR member 1 cannot elect it (the ELR is
        # consulted only when the ISR is empty), so only the unfence record is written.
        image = image_of(
            active=[],
            fenced=[1, 2],
            partitions=[
                PartitionRecord(
                    topic="t", partition=0, replicas=[1, 2], isr=[2], elr=[1], min_isr=2
                )
            ],
        )
        result = unfence_broker(image, UnfenceBroker(broker_id=1, broker_epoch=1), 0, CFG)
        assert result.records == [UnfenceBrokerRecord(broker_id=1, broker_epoch=1)]

    def test_unfence_leaves_partitions_that_have_a_leader_alone(self) -> None:
        c = three_brokers()
        c.alter([1])
        c.fence(2)
        c.register(2, clean=True)
        result = c.unfence(2)
        assert changes(result.records) == []
        assert c.view() == (1, [1], [2, 3], [])


# --- rule 5: controlled shutdown ---------------------------------------------------------


class TestControlledShutdown:
    def test_unknown_broker_and_stale_epoch(self) -> None:
        with pytest.raises(BrokerIdNotRegisteredError):
            controlled_shutdown(
                ClusterImage(), ControlledShutdown(broker_id=1, broker_epoch=0), 0, CFG
            )
        c = three_brokers()
        with pytest.raises(StaleBrokerEpochError):
            controlled_shutdown(
                c.image, ControlledShutdown(broker_id=1, broker_epoch=c.epoch(1) - 1), 0, CFG
            )

    def test_moves_leadership_away_and_leaves_the_isr(self) -> None:
        c = three_brokers()
        response = c.shutdown(1)
        assert response == ControlledShutdownResponse(can_stop=True)
        assert c.view() == (2, [2, 3], [], [])
        b = c.image.brokers[1]
        assert b.in_controlled_shutdown and not b.fenced and not b.active
        record = next(r for r in c.log if isinstance(r, BrokerRegistrationChangeRecord))
        assert record == BrokerRegistrationChangeRecord(
            broker_id=1, broker_epoch=b.epoch, in_controlled_shutdown=True
        )
        assert changes(c.log)[-1].reason is ChangeReason.CONTROLLED_SHUTDOWN

    def test_stopping_replica_stays_in_the_elr_below_min_isr(self) -> None:
        c = three_brokers()
        c.alter([1, 2])
        c.shutdown(2)
        assert c.view() == (1, [1], [2], [])

    def test_last_isr_member_hands_leadership_to_an_active_elr_member(self) -> None:
        c = three_brokers()
        c.alter([1])
        assert c.shutdown(1).can_stop
        assert c.view() == (2, [2], [1, 3], [])

    def test_last_isr_member_leaves_and_the_partition_waits_in_the_elr(self) -> None:
        c = three_brokers()
        c.fence(3)
        c.fence(2)
        assert c.shutdown(1).can_stop
        assert c.view() == (NO_LEADER, [], [1, 2], [])

    def test_repeated_request_writes_nothing(self) -> None:
        c = three_brokers()
        c.shutdown(3)
        result = c.run(ControlledShutdown(broker_id=3, broker_epoch=c.epoch(3)))
        assert result.records == []
        assert result.response == ControlledShutdownResponse(can_stop=True)

    def test_can_stop_is_false_while_the_broker_still_leads(self) -> None:
        # Constructed image: broker 1 leads a partition whose ISR does not name it, so no
        # ISR change moves the leadership; the response must say it cannot stop yet.
        image = image_of(
            active=[1],
            partitions=[PartitionRecord(topic="t", partition=0, replicas=[1], isr=[], leader=1)],
        )
        result = controlled_shutdown(image, ControlledShutdown(broker_id=1, broker_epoch=1), 0, CFG)
        assert result.response == ControlledShutdownResponse(can_stop=False)

    def test_broker_in_controlled_shutdown_is_not_eligible(self) -> None:
        c = three_brokers()
        c.alter([1, 2])
        c.shutdown(2)
        c.fence(1)
        # 1 and 2 are ELR members; 2 is not fenced but in controlled shutdown: no leader.
        assert c.view() == (NO_LEADER, [], [1, 2], [])
        with pytest.raises(InvalidReplicationFactorError):
            c.create("u", replication_factor=2)  # only broker 3 is active

    def test_clean_restart_keeps_elr_membership_and_is_elected(self) -> None:
        c = three_brokers()
        c.alter([1])
        c.shutdown(1)
        assert c.view() == (2, [2], [1, 3], [])
        c.fence(2)
        assert c.view() == (3, [3], [1, 2], [])
        c.fence(3)
        assert c.view() == (NO_LEADER, [], [1, 2, 3], [])
        c.fence(1)  # the stopped broker's session expires
        r = c.register(1, clean=True)
        assert r.clean
        assert c.view() == (NO_LEADER, [], [1, 2, 3], [])
        c.unfence(1)
        assert c.view() == (1, [1], [2, 3], [])


# --- rule 6: AlterPartition ----------------------------------------------------------------


class TestAlterPartition:
    def fail(self, c: Cluster, isr: list[int], **overrides: Any) -> MetactlError:
        request = c.alter_request(isr, **overrides)
        before = c.image
        with pytest.raises(MetactlError) as e:
            alter_partition(c.image, request, 0, CFG)
        assert c.image is before
        return e.value

    def test_unknown_partition(self) -> None:
        c = three_brokers()
        request = _with(c.alter_request([1, 2, 3]), partition=1)
        with pytest.raises(UnknownTopicOrPartitionError) as info:
            alter_partition(c.image, request, 0, CFG)
        e = info.value
        assert isinstance(e, UnknownTopicOrPartitionError)
        assert e.code == "UNKNOWN_TOPIC_OR_PARTITION"

    def test_unregistered_sender(self) -> None:
        c = three_brokers()
        assert isinstance(self.fail(c, [1], leader=9), BrokerIdNotRegisteredError)

    def test_sender_with_a_stale_broker_epoch(self) -> None:
        c = three_brokers()
        e = self.fail(c, [1, 2], broker_epoch=c.epoch(1) - 1)
        assert isinstance(e, StaleBrokerEpochError) and e.code == "STALE_BROKER_EPOCH"

    def test_sender_that_is_not_the_leader(self) -> None:
        c = three_brokers()
        e = self.fail(c, [1, 2], leader=2, broker_epoch=c.epoch(2))
        assert isinstance(e, NotLeaderOrFollowerError) and e.code == "NOT_LEADER_OR_FOLLOWER"

    def test_leaderless_partition_has_no_valid_sender(self) -> None:
        c = three_brokers()
        for b in (3, 2, 1):
            c.fence(b)
        c.restart(1, clean=False)
        e = self.fail(c, [1], leader=1, broker_epoch=c.epoch(1))
        assert isinstance(e, NotLeaderOrFollowerError)

    def test_stale_leader_epoch(self) -> None:
        c = three_brokers()
        e = self.fail(c, [1, 2], leader_epoch=1)
        assert isinstance(e, FencedLeaderEpochError) and e.code == "FENCED_LEADER_EPOCH"
        assert c.alter([1, 2], leader_epoch=0).isr == [1, 2]

    def test_stale_partition_epoch(self) -> None:
        c = three_brokers()
        c.alter([1, 2])
        e = self.fail(c, [1, 2, 3], partition_epoch=0)
        assert isinstance(e, InvalidUpdateVersionError) and e.code == "INVALID_UPDATE_VERSION"

    @pytest.mark.parametrize("why", ["fenced", "controlled_shutdown", "not_a_replica", "unknown"])
    def test_proposed_member_that_is_not_an_active_replica(self, why: str) -> None:
        c = three_brokers()
        c.start(4)
        c.alter([1, 2])
        if why == "fenced":
            c.fence(3)
            member = 3
        elif why == "controlled_shutdown":
            c.shutdown(3)
            member = 3
        else:
            member = 4 if why == "not_a_replica" else 9
        e = self.fail(c, [1, 2, member])
        assert isinstance(e, IneligibleReplicaError) and e.code == "INELIGIBLE_REPLICA"

    def test_proposed_member_with_a_stale_broker_epoch(self) -> None:
        c = three_brokers()
        c.alter([1, 2])
        request = c.alter_request([1, 2, 3])
        stale = [*request.isr[:2], IsrMember(broker_id=3, broker_epoch=c.epoch(3) - 1)]
        with pytest.raises(IneligibleReplicaError) as e:
            alter_partition(c.image, _with(request, isr=stale), 0, CFG)
        assert "presented broker epoch" in e.value.message

    def test_leader_must_stay_in_the_proposed_isr(self) -> None:
        c = three_brokers()
        e = self.fail(c, [2, 3])
        assert isinstance(e, InvalidRequestError) and e.code == "INVALID_REQUEST"
        assert isinstance(self.fail(c, []), InvalidRequestError)

    def test_validation_order(self) -> None:
        """Each check wins over every later one: sender/epoch, partition epoch, members,
        leader in ISR."""
        c = three_brokers()
        c.fence(3)
        # Sent by leader 1: stale partition epoch (the fence made it 1), a fenced member 3,
        # and the leader missing from the proposal.
        request = c.alter_request([2, 3], partition_epoch=0)
        with pytest.raises(StaleBrokerEpochError):
            alter_partition(c.image, _with(request, leader=2, broker_epoch=-5), 0, CFG)
        with pytest.raises(NotLeaderOrFollowerError):
            alter_partition(c.image, _with(request, leader=2, broker_epoch=c.epoch(2)), 0, CFG)
        with pytest.raises(InvalidUpdateVersionError):
            alter_partition(c.image, request, 0, CFG)
        with pytest.raises(IneligibleReplicaError):
            alter_partition(c.image, _with(request, partition_epoch=c.p().partition_epoch), 0, CFG)
        with pytest.raises(InvalidRequestError):
            alter_partition(c.image, c.alter_request([2]), 0, CFG)

    def test_shrink_and_expand_follow_rule_1_and_return_the_new_view(self) -> None:
        c = three_brokers()
        view = c.alter([1])
        assert view == PartitionView(
            topic="t", partition=0, leader=1, leader_epoch=0, partition_epoch=1, isr=[1]
        )
        assert c.view() == (1, [1], [2, 3], [])
        view = c.alter([1, 3])
        assert c.view() == (1, [1, 3], [], [])
        assert (view.partition_epoch, view.leader_epoch) == (2, 0)
        change = changes(c.log)[-1]
        assert change.reason is ChangeReason.ALTER_PARTITION and change.broker == 1

    def test_unchanged_isr_writes_nothing(self) -> None:
        c = three_brokers()
        result = c.run(c.alter_request([3, 2, 1]))
        assert result.records == []
        assert result.response == PartitionView(
            topic="t", partition=0, leader=1, leader_epoch=0, partition_epoch=0, isr=[1, 2, 3]
        )

    def test_a_replica_named_twice_is_an_invalid_request(self) -> None:
        # As Kafka: refused, never silently de-duplicated (issue 22).
        c = three_brokers()
        e = self.fail(c, [3, 2, 1, 1])
        assert isinstance(e, InvalidRequestError) and "broker 1 more than once" in e.message

    def test_a_recovering_leader_cannot_expand_until_it_has_recovered(self) -> None:
        c = three_brokers(recovery_strategy="manual")
        for b in (3, 2, 1):
            c.fence(b)
        c.restart(2, clean=False)
        c.restart(3, clean=False)
        c.elect_unclean(2)
        assert c.p().recovery_state is LeaderRecoveryState.RECOVERING
        e = self.fail(c, [2, 3], recovered=False)
        assert isinstance(e, InvalidRequestError)
        # Not expanding while recovering is fine and keeps the state.
        result = c.run(c.alter_request([2], recovered=False))
        assert result.records == []
        c.alter([2, 3], recovered=True)
        assert c.p().recovery_state is LeaderRecoveryState.RECOVERED
        assert c.view() == (2, [2, 3], [], [])

    def test_a_recovering_leader_reports_recovery_without_expanding(self) -> None:
        c = three_brokers(recovery_strategy="manual")
        for b in (3, 2, 1):
            c.fence(b)
        c.restart(2, clean=False)
        c.elect_unclean(2)
        epoch = c.p().partition_epoch
        c.alter([2])
        assert c.p().recovery_state is LeaderRecoveryState.RECOVERED
        assert c.p().partition_epoch == epoch + 1


def _with(request: AlterPartition, **fields: object) -> AlterPartition:
    return msgspec.structs.replace(request, **fields)


# --- rule 8: preferred election ----------------------------------------------------------


class TestPreferredElection:
    def request(self, partition: int = 0) -> ElectLeader:
        return ElectLeader(topic="t", partition=partition, election_type="preferred")

    def test_unknown_partition(self) -> None:
        with pytest.raises(UnknownTopicOrPartitionError):
            elect_preferred(ClusterImage(), self.request(), 0, CFG)

    def test_preferred_replica_already_leads(self) -> None:
        c = three_brokers()
        with pytest.raises(ElectionNotNeededError) as e:
            elect_preferred(c.image, self.request(), 0, CFG)
        assert e.value.code == "ELECTION_NOT_NEEDED"

    def test_preferred_replica_not_in_the_isr(self) -> None:
        c = three_brokers()
        c.fence(1)
        c.restart(1, clean=True)  # active again, but not back in the ISR
        with pytest.raises(PreferredLeaderNotAvailableError) as e:
            elect_preferred(c.image, self.request(), 0, CFG)
        assert e.value.code == "PREFERRED_LEADER_NOT_AVAILABLE"

    def test_preferred_replica_in_the_isr_but_not_active(self) -> None:
        image = image_of(
            active=[2],
            fenced=[1],
            partitions=[
                PartitionRecord(topic="t", partition=0, replicas=[1, 2], isr=[1, 2], leader=2)
            ],
        )
        with pytest.raises(PreferredLeaderNotAvailableError):
            elect_preferred(image, self.request(), 0, CFG)

    def test_moves_leadership_back_to_the_first_assigned_replica(self) -> None:
        c = three_brokers()
        c.fence(1)
        c.restart(1, clean=True)
        c.alter([1, 2, 3])
        assert c.view() == (2, [1, 2, 3], [], [])
        epochs = (c.p().leader_epoch, c.p().partition_epoch)
        view = c.preferred()
        assert c.view() == (1, [1, 2, 3], [], [])
        assert (view.leader_epoch, view.partition_epoch) == (epochs[0] + 1, epochs[1] + 1)
        change = changes(c.log)[-1]
        assert change.election is ElectionKind.PREFERRED and change.reason is ChangeReason.ELECTION


# --- rule 9: topics ------------------------------------------------------------------------


class TestCreateTopic:
    def make(self, c: Cluster, **kw: object) -> MetactlError:
        request = CreateTopic(**{"name": "t", **kw})  # type: ignore[arg-type]
        with pytest.raises(MetactlError) as e:
            create_topic(c.image, request, 0, c.config, KNOWN_STRATEGIES)
        return e.value

    def test_striped_round_robin_over_active_brokers(self) -> None:
        c = Cluster()
        c.start(1, 2, 3, 4, 5)
        c.fence(5)
        r = c.create("t", partitions=5, replication_factor=3)
        assert r.assignments == [[1, 2, 3], [2, 3, 4], [3, 4, 1], [4, 1, 2], [1, 2, 3]]
        for i, a in enumerate(r.assignments):
            assert c.p("t", i).replicas == tuple(a)
            assert c.view("t", i) == (a[0], sorted(a), [], [])

    def test_placement_alternates_racks(self) -> None:
        c = Cluster()
        c.start(1, 2, rack="a")
        c.start(3, 4, rack="b")
        c.start(5)  # no rack: its own group, sorted first as ""
        r = c.create("t", partitions=3, replication_factor=2)
        # Broker order: "" [5], a [1, 2], b [3, 4] -> 5, 1, 3, 2, 4.
        assert r.assignments == [[5, 1], [1, 3], [3, 2]]
        racks = {1: "a", 2: "a", 3: "b", 4: "b", 5: None}
        assert all(racks[a[0]] != racks[a[1]] for a in r.assignments)

    def test_single_rack_is_plain_round_robin(self) -> None:
        c = Cluster()
        c.start(3, 1, 2, rack="a")
        assert c.create("t", partitions=2, replication_factor=2).assignments == [[1, 2], [2, 3]]

    def test_explicit_assignment_isr_is_the_active_replicas_and_first_active_leads(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.fence(3)
        c.create("t", assignments=[[3, 2, 1], [1, 3]], min_isr=2)
        assert c.view("t", 0) == (2, [1, 2], [], [])
        assert c.view("t", 1) == (1, [1], [], [])
        assert c.p("t", 0).replicas == (3, 2, 1)

    def test_records_topic_and_partitions_with_effective_min_isr(self) -> None:
        # The configured default is clamped per partition (so is a requested min ISR
        # above the RF: test_min_isr_above_the_rf_is_accepted_and_capped).
        c = Cluster(ControllerConfig(default_min_insync_replicas=3))
        c.start(1, 2)
        base = c.image.end_offset
        r = c.create("orders", assignments=[[1, 2], [2]], recovery_strategy="proactive")
        assert r.topic_id == str(
            uuid.uuid5(uuid.UUID("5f1b2a3c-0966-4e6d-8a11-6d657461637c"), f"orders@{base}")
        )
        t = c.image.topics["orders"]
        # No topic config: the cluster default (3) applies, capped per partition.
        assert (t.partitions, t.min_isr, t.recovery_strategy) == (2, None, "proactive")
        assert c.p("orders", 0).min_isr == 2  # min(3, RF 2)
        assert c.p("orders", 1).min_isr == 1  # min(3, RF 1)
        record = c.log[base + 1]
        assert isinstance(record, PartitionRecord)
        assert (record.leader_epoch, record.partition_epoch) == (0, 0)

    def test_defaults_come_from_the_config(self) -> None:
        c = Cluster(
            ControllerConfig(
                default_min_insync_replicas=2, default_replication_factor=2, default_partitions=3
            )
        )
        c.start(1, 2, 3)
        r = c.create("t")
        assert len(r.assignments) == 3 and all(len(a) == 2 for a in r.assignments)
        assert c.image.topics["t"].min_isr is None  # no topic config: the cluster's
        assert all(c.p("t", i).min_isr == 2 for i in range(3))
        assert c.image.topics["t"].recovery_strategy is None

    def test_topic_already_exists(self) -> None:
        c = three_brokers()
        e = self.make(c, replication_factor=1)
        assert isinstance(e, TopicAlreadyExistsError) and e.code == "TOPIC_ALREADY_EXISTS"

    @pytest.mark.parametrize("rf", [0, -1, 4])
    def test_invalid_replication_factor(self, rf: int) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        e = self.make(c, replication_factor=rf)
        assert isinstance(e, InvalidReplicationFactorError)
        assert e.code == "INVALID_REPLICATION_FACTOR"

    def test_replication_factor_counts_only_active_brokers(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.fence(3)
        assert isinstance(self.make(c, replication_factor=3), InvalidReplicationFactorError)

    @pytest.mark.parametrize(
        "assignments",
        [[], [[]], [[1, 1]], [[1, 9]], [[1, 2], [3, 4]], [[3]]],
        ids=["none", "empty", "duplicate", "unknown", "unknown-later", "no-active"],
    )
    def test_invalid_replica_assignment(self, assignments: list[list[int]]) -> None:
        c = Cluster()
        c.start(1, 2)
        c.register(3)  # registered but fenced
        e = self.make(c, assignments=assignments)
        assert isinstance(e, InvalidReplicaAssignmentError)
        assert e.code == "INVALID_REPLICA_ASSIGNMENT"

    def test_partitions_must_match_an_explicit_assignment(self) -> None:
        c = Cluster()
        c.start(1)
        assert isinstance(self.make(c, assignments=[[1]], partitions=2), InvalidRequestError)
        assert c.create("t", assignments=[[1]], partitions=1).assignments == [[1]]

    @pytest.mark.parametrize("partitions", [0, -3])
    def test_partition_count_must_be_positive(self, partitions: int) -> None:
        c = Cluster()
        c.start(1)
        assert isinstance(self.make(c, partitions=partitions), InvalidRequestError)

    def test_min_isr_must_be_positive(self) -> None:
        c = Cluster()
        c.start(1)
        e = self.make(c, replication_factor=1, min_isr=0)
        assert isinstance(e, InvalidConfigurationError) and e.code == "INVALID_CONFIG"

    @pytest.mark.parametrize(
        "name", ["", ".", "..", "a b", "abc\n", "x" * 250, "é", "a/b", "a\x00", "ab:c"]
    )
    def test_invalid_topic_names(self, name: str) -> None:
        c = Cluster()
        c.start(1)
        e = self.make(c, name=name, replication_factor=1)
        assert isinstance(e, InvalidTopicError) and e.code == "INVALID_TOPIC_EXCEPTION"

    @pytest.mark.parametrize(
        "name", ["a", "orders-0", "A.b_c-9-x", "x" * 249, "...", "-a", "a-", "a--b", "_"]
    )
    def test_valid_topic_names(self, name: str) -> None:
        c = Cluster()
        c.start(1)
        assert c.create(name, replication_factor=1).name == name

    def test_unknown_recovery_strategy(self) -> None:
        c = Cluster()
        c.start(1)
        e = self.make(c, replication_factor=1, recovery_strategy="yolo")
        assert isinstance(e, UnknownRecoveryPolicyError) and e.code == "UNKNOWN_RECOVERY_POLICY"
        assert "balanced, manual, proactive" in e.message


# --- worked examples, step by step ---------------------------------------------------------


def test_worked_example_5_2_2_clean_elr_based_recovery() -> None:
    """Section 5.2.2. MinISR=2. The document's step 3 shows ELR=[] after fencing the last
    ISR member 1, but by rule 1 (case C) the fenced leader joins the ELR because the new
    ISR [3] is below MinISR; its unclean re-registration in step 4 then moves it to the
    LastKnownELR, and re-adding it to the ISR clears both: the end state is the document's."""
    c = three_brokers(min_isr=2)
    # 1. Initial state.
    assert c.view() == (1, [1, 2, 3], [], [])
    # 2. The ISR shrinks to the leader.
    c.alter([1, 3])
    assert c.view() == (1, [1, 3], [], [])
    c.alter([1])
    assert c.view() == (1, [1], [3], [])
    # 3. Replica 1 has an unclean shutdown: fenced; 3 is elected from the ELR (case B).
    c.fence(1)
    assert c.view() == (3, [3], [1], [])
    assert changes(c.log)[-1].election is ElectionKind.ELR
    # 4. Replica 1 re-registers (uncleanly), catches up and is re-added to the ISR.
    c.restart(1, clean=False)
    assert c.view() == (3, [3], [], [1])
    c.alter([1, 3])
    assert c.view() == (3, [1, 3], [], [])


def test_kip_966_how_it_works() -> None:
    """The KIP-966 post's "How it works": RF 3, MinISR 2."""
    c = three_brokers(min_isr=2)
    # 1. Leader = R1, ISR = [R1, R2, R3], ELR = [].
    assert c.view() == (1, [1, 2, 3], [], [])
    # 2. R3 is fenced: the ISR stays at MinISR, so R3 does not join the ELR.
    c.fence(3)
    assert c.view() == (1, [1, 2], [], [])
    # 3. (R1 advances the high watermark with R2.) 4. R2 is removed: ELR = [R2].
    c.fence(2)
    assert c.view() == (1, [1], [2], [])
    # 5. An OS error kills R1: no leader, and R1 joins the ELR.
    c.fence(1)
    assert c.view() == (NO_LEADER, [], [1, 2], [])
    # 6. R1 restarts uncleanly: it leaves the ELR (and, in metactl, joins the LastKnownELR).
    r = c.restart(1, clean=False)
    assert not r.clean
    assert c.view() == (NO_LEADER, [], [2], [1])
    # 7. R2 becomes reachable again and is unfenced: elected from the ELR.
    c.unfence(2)
    assert c.view() == (2, [2], [], [1])
    # 8. R1 catches up and is re-added to the ISR; the ISR reaches MinISR.
    c.alter([1, 2])
    assert c.view() == (2, [1, 2], [], [])
