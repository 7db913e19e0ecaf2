"""The metadata lifecycle's rules (issue 19), through the one step: configs with KIP-966's
clearing rule, the ELR feature level, delete, add partitions, KIP-455 reassignment and
unregister, each with its refusals, its slicing under a small work budget, and replay
from scratch and from a snapshot giving the same image."""

from __future__ import annotations

import uuid

import pytest

from controller.core.config import ControllerConfig
from controller.core.handler_result import ClearElrSlice, Continue, ReassignSlice
from controller.core.lifecycle import Bootstrap, needs_bootstrap
from controller.core.step import Rules, Tick
from metactl.errors import MetactlError, ReplayError
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_image.snapshot import image_from_records, image_to_records
from metadata_log.records import (
    ELR_FEATURE,
    MIN_ISR_CONFIG,
    BeginTransactionRecord,
    ChangeReason,
    ClearElrRecord,
    ConfigRecord,
    EndTransactionRecord,
    FeatureLevelRecord,
    PartitionChangeRecord,
    RemoveTopicRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnregisterBrokerRecord,
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
    Reassignment,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.messages.internal import Ack, CreateTopicResponse
from tests.controller.testkit import POLICIES, Cluster


def refused(c: Cluster, event: object) -> str:
    before = c.image
    with pytest.raises(MetactlError) as info:
        c.submit(event)  # type: ignore[arg-type]
    assert c.image is before  # a refusal changes nothing
    return info.value.code


def consistent(c: Cluster) -> None:
    """Replay of the whole log, and a snapshot of the image, give the same image."""
    assert replay(ClusterImage(), c.log).same_state(c.image)
    again = image_from_records(image_to_records(c.image), c.image.end_offset)
    assert again.same_state(c.image)


def cfg(
    kind: str, name: str, value: str | None = None, *, delete: bool = False, key: str = ""
) -> AlterConfigs:
    key = key or MIN_ISR_CONFIG
    return AlterConfigs(
        resource_type=kind,
        resource_name=name,
        set_configs={} if value is None else {key: value},
        delete_configs=[key] if delete else [],
    )


def topic_min_isr(c: Cluster, value: str | None = None, *, delete: bool = False) -> object:
    return c.submit(
        AlterConfigs(
            resource_type="topic",
            resource_name="t",
            set_configs={} if delete else {MIN_ISR_CONFIG: value or "2"},
            delete_configs=[MIN_ISR_CONFIG] if delete else [],
        )
    ).response


def cluster_min_isr(c: Cluster, value: str) -> object:
    return c.submit(
        AlterConfigs(resource_type="broker", resource_name="", set_configs={MIN_ISR_CONFIG: value})
    ).response


def with_elr() -> Cluster:
    """t-0 on [1, 2, 3], MinISR 2, with 2 and 3 fenced: ISR [1], ELR [2]."""
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("t", assignments=[[1, 2, 3]], min_isr=2)
    c.fence(3)
    c.fence(2)
    assert c.view() == (1, [1], [2], [])
    return c


# --- configs ----------------------------------------------------------------------------


class TestConfigs:
    def test_topic_update_clears_its_elr_and_sets_the_effective_min_isr(self) -> None:
        c = with_elr()
        c.create("u", assignments=[[1, 2, 3]], min_isr=2)  # 2, 3 fenced: ISR [1]
        c.alter([1], "u")
        response = topic_min_isr(c, "5")
        assert response == AlterConfigsResponse(
            resource_type="topic", resource_name="t", cleared_topics=1
        )
        assert c.view() == (1, [1], [], [])
        assert c.p().min_isr == 3  # min(5, RF 3): MinISR above the RF is accepted
        assert c.image.topics["t"].min_isr == 5
        configs = [r for r in c.last.records if isinstance(r, ConfigRecord)]  # type: ignore[union-attr]
        assert configs == [
            ConfigRecord(resource_type="topic", resource_name="t", name=MIN_ISR_CONFIG, value="5")
        ]
        consistent(c)

    def test_deleting_the_topic_config_falls_back_to_the_cluster_default(self) -> None:
        c = with_elr()
        topic_min_isr(c, delete=True)
        assert c.image.topics["t"].min_isr is None
        assert c.p().min_isr == 1  # the static default (ControllerConfig: 1)
        assert c.view() == (1, [1], [], [])  # a topic update clears, whatever the value
        consistent(c)

    def test_cluster_update_even_to_the_same_value_clears_every_topic(self) -> None:
        c = with_elr()
        c.create("u", assignments=[[1, 2]])  # no topic config: inherits the default
        cluster_min_isr(c, "1")
        assert c.view() == (1, [1], [], [])
        assert c.image.cluster_configs[MIN_ISR_CONFIG] == "1"
        clears = [r for r in c.last.records if isinstance(r, ClearElrRecord)]  # type: ignore[union-attr]
        assert [(r.topic, r.min_isr) for r in clears] == [("t", 2), ("u", 1)]
        cluster_min_isr(c, "2")  # u follows the default; t keeps its own 2
        assert (c.p("u").min_isr, c.p().min_isr) == (2, 2)
        consistent(c)

    @pytest.mark.parametrize(
        ("request_", "code"),
        [
            (cfg("broker", "", delete=True), "INVALID_CONFIG"),  # the default stays
            (cfg("broker", "1", "2"), "INVALID_CONFIG"),  # no broker-level value (as Kafka)
            (cfg("topic", "nope", "2"), "UNKNOWN_TOPIC_OR_PARTITION"),
            (cfg("topic", "t", "two"), "INVALID_CONFIG"),
            (cfg("topic", "t", "0"), "INVALID_CONFIG"),
            (cfg("topic", "t", "1", key="retention.ms"), "INVALID_CONFIG"),
            (AlterConfigs(resource_type="topic", resource_name="t"), "INVALID_REQUEST"),
            (cfg("topic", "t", "2", delete=True), "INVALID_REQUEST"),  # both at once
            (cfg("group", "g", "2"), "INVALID_REQUEST"),
            (cfg("topic", "t", "2\x00"), "INVALID_REQUEST"),
        ],
    )
    def test_refusals(self, request_: AlterConfigs, code: str) -> None:
        c = with_elr()
        assert refused(c, request_) == code

    def test_a_large_clear_is_sliced_inside_one_transaction(self) -> None:
        c = Cluster()
        c.rules = Rules(c.config, POLICIES, work_budget=4)
        c.start(1, 2, 3)
        c.create("a", partitions=6, replication_factor=2)
        c.create("b", partitions=3, replication_factor=2)
        c.fence(2)
        first = c.step_one(
            AlterConfigs(
                resource_type="broker", resource_name="", set_configs={MIN_ISR_CONFIG: "2"}
            )
        )
        assert isinstance(first.follow_up, ClearElrSlice)
        assert isinstance(first.records[0], BeginTransactionRecord)
        ranges = [(r.topic, r.first, r.end) for r in first.records if isinstance(r, ClearElrRecord)]
        assert ranges == [("a", 0, 4)]
        results = [first]
        while results[-1].follow_up is not None:
            results.append(c.step_one(results[-1].follow_up))
        ranges = [
            (r.topic, r.first, r.end)
            for res in results
            for r in res.records
            if isinstance(r, ClearElrRecord)
        ]
        assert ranges == [("a", 0, 4), ("a", 4, 6), ("b", 0, 2), ("b", 2, 3)]
        assert isinstance(results[-1].records[-1], EndTransactionRecord)
        assert results[-1].response == AlterConfigsResponse(
            resource_type="broker", resource_name="", cleared_topics=2
        )
        assert all(c.p("a", i).min_isr == 2 for i in range(6))
        consistent(c)

    def test_a_pending_balanced_recovery_waits_for_an_operator_once_cleared(self) -> None:
        # Balanced waits for every LastKnownELR member; a clear empties the LastKnownELR,
        # so the recovery stays pending with nobody to wait for: only an operator's
        # election ends it. Proactive does not depend on it and carries on.
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2, 3]], min_isr=3)
        for b in (3, 2, 1):
            c.fence(b)
        for b in (1, 2, 3):  # each unclean: ELR -> LastKnownELR
            c.restart(b, clean=False)
        assert c.view() == (-1, [], [], [1, 2, 3])
        assert ("t", 0) in c.tracker.pending
        assert c.tracker.awaited(c.image, ("t", 0), POLICIES) == [1, 2, 3]
        topic_min_isr(c, "2")
        assert c.p().last_known_elr == frozenset()
        assert ("t", 0) in c.tracker.pending
        assert c.tracker.awaited(c.image, ("t", 0), POLICIES) == []
        records = c.elect_unclean(2)
        assert any(isinstance(r, UncleanRecoveryRecord) for r in records)
        assert c.view()[0] == 2


# --- the ELR feature level ------------------------------------------------------------------


class TestFeatures:
    def test_downgrade_clears_and_classic_rules_apply(self) -> None:
        c = with_elr()
        r = c.submit(UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="downgrade"))
        assert r.response == UpdateFeatureResponse(name=ELR_FEATURE, level=0, cleared_topics=1)
        assert c.view() == (1, [1], [], [])
        c.fence(1)  # classic: the last ISR member stays in the ISR
        assert c.view() == (-1, [1], [], [])
        consistent(c)

    def test_upgrade_tracks_from_the_current_isrs(self) -> None:
        c = Cluster(ControllerConfig(eligible_leader_replicas=False))
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2, 3]], min_isr=2)
        c.fence(3)
        assert c.view() == (1, [1, 2], [], [])
        r = c.submit(UpdateFeature(name=ELR_FEATURE, level=1))
        assert r.records == [FeatureLevelRecord(name=ELR_FEATURE, level=1)]
        assert c.view() == (1, [1, 2], [], [])  # nothing else changes
        c.fence(2)  # now KIP-966: 2 leaves the ISR below MinISR for the ELR
        assert c.view() == (1, [1], [2], [])
        assert c.image.elr_enabled(False)

    def test_same_level_writes_nothing(self) -> None:
        c = with_elr()
        c.submit(Bootstrap())
        r = c.submit(UpdateFeature(name=ELR_FEATURE, level=1))
        assert r.records == []

    @pytest.mark.parametrize(
        ("request_", "code"),
        [
            (UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="upgrade"), "INVALID_REQUEST"),
            (UpdateFeature(name=ELR_FEATURE, level=2), "INVALID_REQUEST"),
            (UpdateFeature(name="metadata.version", level=1), "INVALID_REQUEST"),
            (UpdateFeature(name=ELR_FEATURE, level=-1), "INVALID_REQUEST"),
        ],
    )
    def test_refusals(self, request_: UpdateFeature, code: str) -> None:
        assert refused(with_elr(), request_) == code

    def test_downgrade_then_upgrade_direction_checks(self) -> None:
        c = with_elr()
        c.submit(UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="downgrade"))
        assert refused(c, UpdateFeature(name=ELR_FEATURE, level=1, upgrade_type="downgrade"))
        c.submit(UpdateFeature(name=ELR_FEATURE, level=1, upgrade_type="upgrade"))
        assert c.image.features[ELR_FEATURE] == 1

    def test_upgrade_refused_while_classic_unclean_election_is_configured(self) -> None:
        c = Cluster(ControllerConfig(eligible_leader_replicas=False, unclean_leader_election=True))
        c.start(1)
        assert refused(c, UpdateFeature(name=ELR_FEATURE, level=1)) == "INVALID_REQUEST"

    def test_bootstrap_pins_the_static_settings_once(self) -> None:
        c = Cluster(ControllerConfig(eligible_leader_replicas=False, default_min_insync_replicas=2))
        assert needs_bootstrap(c.image)
        r = c.submit(Bootstrap())
        assert r.records == [
            FeatureLevelRecord(name=ELR_FEATURE, level=0),
            ConfigRecord(resource_type="broker", resource_name="", name=MIN_ISR_CONFIG, value="2"),
        ]
        assert not needs_bootstrap(c.image)
        assert c.submit(Bootstrap()).records == []
        # A controller started later with other flags keeps the cluster's level.
        assert not c.image.elr_enabled(True)
        assert c.image.cluster_min_isr(1) == 2


# --- delete -----------------------------------------------------------------------------


class TestDelete:
    def test_delete_drops_the_topic_its_indexes_and_its_recoveries(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        created = c.create(
            "t", assignments=[[1, 2], [2, 3]], min_isr=2, recovery_strategy="proactive"
        )
        c.fence(1)
        c.fence(2)
        assert ("t", 0) in c.tracker.pending or ("t", 0) in c.tracker.offline
        r = c.submit(DeleteTopic(name="t"))
        assert r.response == DeleteTopicResponse(name="t", topic_id=created.topic_id)
        assert r.records[0] == RemoveTopicRecord(topic_id=created.topic_id, name="t")
        assert "t" not in c.image.topics and len(c.image.partitions) == 0
        assert not c.image.offline and not c.image.replicas_by_broker
        assert created.topic_id not in c.image.topic_ids
        assert r.delta.removed_topics == {"t": (created.topic_id, 2)}
        assert not c.tracker.pending and not c.tracker.offline and not c.tracker.wake_of
        consistent(c)

    def test_a_recreated_topic_is_a_different_topic(self) -> None:
        c = Cluster()
        c.start(1, 2)
        first = c.create("t", replication_factor=2, topic_id=str(uuid.uuid4()))
        c.submit(DeleteTopic(name="t"))
        second = c.create("t", replication_factor=2, topic_id=str(uuid.uuid4()))
        assert second.topic_id != first.topic_id
        assert c.p().leader_epoch == 0 and c.p().partition_epoch == 0
        consistent(c)

    def test_refusals(self) -> None:
        c = Cluster()
        c.start(1)
        assert refused(c, DeleteTopic(name="nope")) == "UNKNOWN_TOPIC_OR_PARTITION"
        assert refused(c, DeleteTopic(name="bad name")) == "INVALID_TOPIC_EXCEPTION"
        assert refused(c, create_with_id("not-a-uuid")) == "INVALID_REQUEST"
        assert refused(c, create_with_id(str(uuid.UUID(int=0)))) == "INVALID_REQUEST"
        taken = str(uuid.uuid4())
        c.create("a", replication_factor=1, topic_id=taken)
        assert refused(c, create_with_id(taken)) == "TOPIC_ALREADY_EXISTS"

    def test_replay_refuses_a_stale_remove(self) -> None:
        c = Cluster()
        c.start(1)
        c.create("t", replication_factor=1)
        with pytest.raises(ReplayError):
            replay(c.image, [RemoveTopicRecord(topic_id="other", name="t")])
        with pytest.raises(ReplayError):
            replay(c.image, [TopicRecord(name="t", topic_id="other", partitions=1)])


def create_with_id(topic_id: str) -> CreateTopic:
    return CreateTopic(name="z", replication_factor=1, topic_id=topic_id)


# --- add partitions ---------------------------------------------------------------------------


class TestCreatePartitions:
    def test_new_partitions_continue_the_placement(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", partitions=2, replication_factor=2, min_isr=5)
        r = c.submit(CreatePartitions(topic="t", count=5))
        assert isinstance(r.response, CreateTopicResponse)
        assert r.response.assignments == [[3, 1], [1, 2], [2, 3]]
        assert c.image.topics["t"].partitions == 5
        assert [c.p("t", i).replicas for i in range(5)] == [(1, 2), (2, 3), (3, 1), (1, 2), (2, 3)]
        assert c.p("t", 4).min_isr == 2 and c.p("t", 4).leader == 2
        consistent(c)

    def test_racks_alternate_as_at_create(self) -> None:
        c = Cluster()
        for b, rack in ((1, "a"), (2, "a"), (3, "b"), (4, "b")):
            c.register(b, rack=rack)
            c.unfence(b)
        c.create("t", partitions=1, replication_factor=2)
        c.submit(CreatePartitions(topic="t", count=4))
        for i in range(4):
            racks = {c.image.brokers[b].rack for b in c.p("t", i).replicas}
            assert racks == {"a", "b"}

    def test_explicit_assignments(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", partitions=1, replication_factor=1)
        c.submit(CreatePartitions(topic="t", count=3, assignments=[[3], [2, 1]]))
        assert (c.p("t", 1).replicas, c.p("t", 2).replicas) == ((3,), (2, 1))
        for bad in ([[3]], [[3], []], [[3], [1, 1]], [[3], [9]], [[-1], [1]]):
            code = refused(c, CreatePartitions(topic="t", count=5, assignments=bad))
            assert code == "INVALID_REPLICA_ASSIGNMENT"
        c.fence(3)
        code = refused(c, CreatePartitions(topic="t", count=4, assignments=[[3]]))
        assert code == "INVALID_REPLICA_ASSIGNMENT"

    def test_refusals(self) -> None:
        c = Cluster()
        c.start(1, 2)
        c.create("t", partitions=2, replication_factor=2)
        assert refused(c, CreatePartitions(topic="t", count=2)) == "INVALID_PARTITIONS"
        assert refused(c, CreatePartitions(topic="t", count=1)) == "INVALID_PARTITIONS"
        assert refused(c, CreatePartitions(topic="nope", count=3)) == "UNKNOWN_TOPIC_OR_PARTITION"
        c.fence(2)
        assert refused(c, CreatePartitions(topic="t", count=3)) == "INVALID_REPLICATION_FACTOR"

    def test_many_new_partitions_are_sliced(self) -> None:
        c = Cluster()
        c.rules = Rules(c.config, POLICIES, work_budget=3)
        c.start(1, 2)
        c.create("t", partitions=1, replication_factor=1)
        first = c.step_one(CreatePartitions(topic="t", count=8))
        assert first.follow_up is not None
        r = c.submit(first.follow_up)
        assert isinstance(r.response, CreateTopicResponse) and c.image.topics["t"].partitions == 8
        assert len(c.image.partitions) == 8
        consistent(c)


# --- reassignment -------------------------------------------------------------------------


def reassign(c: Cluster, *moves: tuple[str, int, list[int] | None]) -> list[str | None]:
    r = c.submit(
        AlterPartitionReassignments(
            reassignments=[Reassignment(topic=t, partition=i, replicas=rs) for t, i, rs in moves]
        )
    )
    assert isinstance(r.response, AlterPartitionReassignmentsResponse)
    return [x.error_code for x in r.response.results]


class TestReassignment:
    def test_move_adds_then_completes_once_the_target_is_in_sync(self) -> None:
        c = Cluster()
        c.start(1, 2, 3, 4)
        c.create("t", assignments=[[1, 2, 3]], min_isr=2)
        assert reassign(c, ("t", 0, [2, 3, 4])) == [None]
        p = c.p()
        assert (p.replicas, p.adding, p.removing, p.leader) == ((2, 3, 4, 1), (4,), (1,), 1)
        assert ("t", 0) in c.image.reassigning
        assert ("t", 0) in c.image.replicas_by_broker[4]
        c.alter([1, 2, 3, 4])  # the leader adds the caught-up replica
        p = c.p()
        assert (p.replicas, p.adding, p.removing) == ((2, 3, 4), (), ())
        assert p.isr == {2, 3, 4} and p.leader == 2  # leadership moved off 1
        assert ("t", 0) not in c.image.reassigning
        assert ("t", 0) not in c.image.replicas_by_broker.get(1, ())
        last = c.log[-1]
        assert isinstance(last, PartitionChangeRecord)
        assert last.reason is ChangeReason.REASSIGNMENT and last.replicas == [2, 3, 4]
        consistent(c)

    def test_a_removed_replica_leaves_the_elr_and_last_known_elr(self) -> None:
        c = with_elr()  # ISR [1], ELR [2]
        c.restart(2, clean=True)
        c.fence(1)  # ELR election: 2 leads; 1 joins the ELR
        assert c.view() == (2, [2], [1], [])
        assert reassign(c, ("t", 0, [2])) == [None]  # pure removal: completes at once
        p = c.p()
        assert (p.replicas, p.isr, p.elr, p.last_known_elr, p.min_isr) == (
            (2,),
            frozenset({2}),
            frozenset(),
            frozenset(),
            1,
        )
        consistent(c)

    def test_cancel_restores_the_original_and_drops_the_adding_replica(self) -> None:
        c = Cluster()
        c.start(1, 2, 3, 4)
        c.create("t", assignments=[[1, 2], [1, 2]], min_isr=2)
        assert reassign(c, ("t", 0, [3, 4]), ("t", 1, [1, 2, 3])) == [None, None]
        c.alter([1, 2, 3], partition=0)  # 3 caught up: in the ISR, 4 not yet
        assert c.p().adding == (3, 4)
        assert reassign(c, ("t", 0, None)) == [None]
        p = c.p()
        assert (p.replicas, p.adding, p.removing) == ((1, 2), (), ())
        assert p.isr == {1, 2} and ("t", 0) not in c.image.replicas_by_broker.get(3, ())
        assert reassign(c, ("t", 0, None)) == ["NO_REASSIGNMENT_IN_PROGRESS"]
        consistent(c)

    def test_a_new_target_replaces_the_one_in_progress(self) -> None:
        c = Cluster()
        c.start(1, 2, 3, 4)
        c.create("t", assignments=[[1, 2]], min_isr=1)
        reassign(c, ("t", 0, [1, 3]))
        reassign(c, ("t", 0, [1, 4]))
        p = c.p()
        assert (p.replicas, p.adding, p.removing) == ((1, 4, 2), (4,), (2,))
        assert ("t", 0) not in c.image.replicas_by_broker.get(3, ())
        reassign(c, ("t", 0, [1, 2]))  # back to the original: nothing left to do
        assert (c.p().replicas, c.p().reassigning) == ((1, 2), False)
        consistent(c)

    def test_same_replicas_is_a_no_op(self) -> None:
        c = Cluster()
        c.start(1, 2)
        c.create("t", assignments=[[1, 2]])
        before = len(c.log)
        assert reassign(c, ("t", 0, [1, 2])) == [None]
        assert len(c.log) == before

    def test_each_partition_fails_alone(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2]])
        codes = reassign(c, ("t", 0, [2, 3]), ("t", 9, [1]), ("t", 1, [1]), ("nope", 0, [1]))
        assert codes == [None, *["UNKNOWN_TOPIC_OR_PARTITION"] * 3]
        c.create("u", assignments=[[1]])
        for bad in ([1, 1], [], [7]):
            assert reassign(c, ("u", 0, bad)) == ["INVALID_REPLICA_ASSIGNMENT"]
        for request in (
            AlterPartitionReassignments(reassignments=[]),
            AlterPartitionReassignments(
                reassignments=[Reassignment(topic="u", partition=0, replicas=[1])] * 2
            ),
            AlterPartitionReassignments(
                reassignments=[Reassignment(topic="u", partition=0, replicas=[-2])]
            ),
        ):
            assert refused(c, request) == "INVALID_REQUEST"

    def test_an_adding_replica_is_never_a_recovery_candidate(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2]], min_isr=2, recovery_strategy="proactive")
        reassign(c, ("t", 0, [1, 2, 3]))
        c.fence(2)
        c.fence(1)  # leaderless; 3 is active but only being added
        assert c.view()[0] == -1
        inspections = c.last.inspections  # type: ignore[union-attr]
        assert 3 not in {i.broker_id for i in inspections}
        c.now = 10_000
        c.answer(3, 5, 100)  # even if it answered, it is not chosen
        c.evaluate()
        assert c.view()[0] == -1

    def test_sliced_over_the_budget(self) -> None:
        c = Cluster()
        c.rules = Rules(c.config, POLICIES, work_budget=2)
        c.start(1, 2, 3)
        c.create("t", partitions=5, replication_factor=1)
        first = c.step_one(
            AlterPartitionReassignments(
                reassignments=[Reassignment(topic="t", partition=i, replicas=[3]) for i in range(5)]
            )
        )
        assert isinstance(first.follow_up, ReassignSlice) and first.response == Ack()
        r = c.submit(first.follow_up)
        assert isinstance(r.response, AlterPartitionReassignmentsResponse)
        assert len(r.response.results) == 5
        for i in range(5):
            p = c.p("t", i)
            if p.original == (3,):
                assert (p.replicas, p.adding) == ((3,), ())
            else:
                assert (p.replicas, p.adding, p.removing) == ((3, *p.original), (3,), p.original)
        consistent(c)


# --- unregister ------------------------------------------------------------------------


class TestUnregister:
    def test_a_fenced_broker_leaves_every_isr_elr_and_last_known_elr(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2, 3]], min_isr=3)
        c.create("u", assignments=[[2, 1]], min_isr=1)
        c.create("w", assignments=[[2, 1]], min_isr=1)
        c.alter([2], "w")  # 1 leaves w's ISR at MinISR: not in its ELR either
        c.fence(3)
        c.fence(2)  # ELR [2, 3]
        c.fence(1)  # ELR [1, 2, 3], no leader
        c.restart(3, clean=False)  # 3: ELR -> LastKnownELR
        assert c.view() == (-1, [], [1, 2], [3])
        c.fence(3)
        r = c.submit(UnregisterBroker(broker_id=3))
        assert r.response == Ack()
        assert isinstance(r.records[0], UnregisterBrokerRecord)
        assert 3 not in c.image.brokers
        assert c.view() == (-1, [], [1, 2], [])
        assert c.p().replicas == (1, 2, 3)  # replicas stay assigned, as in Kafka
        c.submit(UnregisterBroker(broker_id=1))
        assert c.view() == (-1, [], [2], [])
        assert c.view("u") == (-1, [], [], [])
        assert c.view("w") == (-1, [], [2], [])  # 1 in none of its sets: untouched
        consistent(c)
        # The id comes back as a first registration of a broker hosting replicas: unclean.
        assert c.register(3).clean is False

    def test_refusals(self) -> None:
        c = Cluster()
        c.start(1)
        assert refused(c, UnregisterBroker(broker_id=1)) == "INVALID_REQUEST"
        assert refused(c, UnregisterBroker(broker_id=7)) == "BROKER_ID_NOT_REGISTERED"
        assert refused(c, UnregisterBroker(broker_id=-1)) == "INVALID_REQUEST"

    def test_sliced_over_the_budget(self) -> None:
        c = Cluster()
        c.rules = Rules(c.config, POLICIES, work_budget=2)
        c.start(1, 2)
        c.create("t", partitions=6, replication_factor=2, min_isr=2)
        c.fence(2)
        first = c.step_one(UnregisterBroker(broker_id=2))
        assert isinstance(first.follow_up, Continue)
        c.submit(first.follow_up)
        assert all(2 not in c.p("t", i).elr for i in range(6))
        consistent(c)

    def test_replay_refuses_a_stale_epoch(self) -> None:
        c = Cluster()
        c.start(1)
        with pytest.raises(ReplayError):
            replay(c.image, [UnregisterBrokerRecord(broker_id=1, broker_epoch=99)])


def test_replay_refuses_configs_it_does_not_keep() -> None:
    c = Cluster()
    c.start(1)
    for record in (
        ConfigRecord(resource_type="topic", resource_name="t", name=MIN_ISR_CONFIG, value="2"),
        ConfigRecord(resource_type="broker", resource_name="", name="x", value="2"),
        ConfigRecord(resource_type="broker", resource_name="1", name=MIN_ISR_CONFIG, value="2"),
        ClearElrRecord(topic="t"),
    ):
        with pytest.raises(ReplayError):
            replay(c.image, [record])


def test_ticks_after_lifecycle_events_drain_the_backlog() -> None:
    c = with_elr()
    topic_min_isr(c, "3")
    assert c.state.idle
    c.submit(Tick())
    assert c.state.idle


# --- the image's new pieces, directly ---------------------------------------------------------


def test_replica_index_removals() -> None:
    from metadata_image.image import EMPTY_INDEX

    index = EMPTY_INDEX.added({"a": [0, 1, 2], "b": [0]}).added({"a": [3]})
    assert index.removed({"zz": [0]}) == index
    assert index.removed({"a": [7, 8]}) == index  # none of them is in it
    smaller = index.removed({"a": [1, 3, 9]})
    assert sorted(smaller) == [("a", 0), ("a", 2), ("b", 0)] and len(smaller) == 3
    assert sorted(smaller.removed({"a": [0, 2]})) == [("b", 0)]
    assert index.without_topic("zz") is index
    assert sorted(index.without_topic("a")) == [("b", 0)]


def test_partition_map_topic_reads_and_drops_skip_holes() -> None:
    from metadata_image.partition_map import CHUNK, EMPTY_PARTITIONS

    c = Cluster()
    c.start(1)
    c.create("t", partitions=3, replication_factor=1)
    states = {p.partition: p for p in c.image.partitions.values()}
    m = EMPTY_PARTITIONS.mutate()
    m[("t", 0)] = states[0]
    m[("t", 2)] = states[2]
    assert [p.partition for p in m.topic_states("t", range(CHUNK + 3))] == [0, 2]
    m.drop_topic("t", 3 * CHUNK)  # chunks 1 and 2 hold nothing
    assert len(m.finish()) == 0


def test_replay_edges_handlers_never_write() -> None:
    from metadata_image.replay import apply

    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2]])
    c.create("u", assignments=[[1]])
    c.create("v", assignments=[[3]])  # broker 3's index has no t to drop
    p = c.p()
    change = PartitionChangeRecord(
        topic="t",
        partition=0,
        reason=ChangeReason.ALTER_PARTITION,
        partition_epoch=p.partition_epoch + 1,
        leader_epoch=p.leader_epoch,
        isr=[1],
    )
    image, delta = apply(
        c.image, [change, RemoveTopicRecord(topic_id=c.image.topics["t"].topic_id, name="t")]
    )
    assert delta.partitions == set() and "t" in delta.removed_topics
    assert sorted(image.replicas_by_broker[1]) == [("u", 0)]
    empty = PartitionChangeRecord(
        topic="u",
        partition=0,
        reason=ChangeReason.REASSIGNMENT,
        partition_epoch=9,
        leader_epoch=0,
        replicas=[],
    )
    with pytest.raises(ReplayError):
        replay(c.image, [empty])
    # Deleting the cluster default (refused by the handler; a log could hold one).
    set_default = ConfigRecord(
        resource_type="broker", resource_name="", name=MIN_ISR_CONFIG, value="2"
    )
    unset = ConfigRecord(resource_type="broker", resource_name="", name=MIN_ISR_CONFIG)
    image = replay(c.image, [set_default, unset, unset])
    assert MIN_ISR_CONFIG not in image.cluster_configs


def test_deleting_a_topic_mid_reassignment() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2]])
    reassign(c, ("t", 0, [1, 3]))
    assert c.image.reassigning
    c.submit(DeleteTopic(name="t"))
    assert not c.image.reassigning and not c.image.replicas_by_broker
    consistent(c)


def test_retargeting_to_the_same_target_changes_nothing() -> None:
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2]])
    reassign(c, ("t", 0, [1, 3]))
    before = len(c.log)
    assert reassign(c, ("t", 0, [1, 3])) == [None]
    assert len(c.log) == before


def test_too_many_replicas_is_refused() -> None:
    c = Cluster()
    c.start(1)
    request = AlterPartitionReassignments(
        reassignments=[Reassignment(topic="t", partition=0, replicas=list(range(40_000)))]
    )
    assert refused(c, request) == "INVALID_REPLICA_ASSIGNMENT"


def test_folded_deltas_forget_what_a_later_delete_removed() -> None:
    c = Cluster()
    c.start(1)
    created = c.submit(CreateTopic(name="t", replication_factor=1)).delta
    deleted = c.submit(DeleteTopic(name="t")).delta
    recreated = c.submit(CreateTopic(name="t", replication_factor=1)).delta
    folded = MetadataDelta().update(created).update(deleted)
    assert folded.topics == set() and folded.partitions == set()
    assert set(folded.removed_topics) == {"t"}
    folded.update(recreated)
    assert folded.topics == {"t"} and folded.partitions == {("t", 0)}


def test_a_min_isr_change_mid_reassignment_caps_at_the_targets_size() -> None:
    # The reassignment and the clear agree: the effective MinISR is capped at the
    # target's replication factor, not at the replicas still being removed.
    c = Cluster()
    c.start(1, 2, 3, 4)
    c.create("t", assignments=[[1, 2, 3]], min_isr=2)
    reassign(c, ("t", 0, [4]))
    assert (c.p().replicas, c.p().min_isr) == ((4, 1, 2, 3), 1)
    topic_min_isr(c, "3")
    assert c.p().min_isr == 1
    consistent(c)


def test_a_deleted_topic_takes_its_last_recoveries_with_it() -> None:
    c = Cluster(policies=POLICIES)
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]], min_isr=1, recovery_strategy="manual")
    c.fence(2)
    c.fence(1)
    c.restart(2, clean=False)
    c.elect_unclean(2)
    assert ("t", 0) in c.image.last_recoveries
    c.submit(DeleteTopic(name="t"))
    assert not c.image.last_recoveries
    consistent(c)


def test_a_removal_only_reassignment_completes_once_the_target_is_back_in_sync() -> None:
    # Nothing to add, but a target replica outside the ISR: it stays in progress until
    # that replica rejoins (found by the fault simulator: it never completed).
    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2, 3]], min_isr=1)
    c.alter([1, 3])  # 2 falls out of the ISR
    reassign(c, ("t", 0, [1, 2]))
    p = c.p()
    assert (p.replicas, p.adding, p.removing) == ((1, 2, 3), (), (3,))
    c.alter([1, 2, 3])  # 2 caught up again
    p = c.p()
    assert (p.replicas, p.adding, p.removing, p.isr) == ((1, 2), (), (), frozenset({1, 2}))
    assert not c.image.reassigning
    consistent(c)


def test_a_bulk_preferred_election_piece() -> None:
    from controller.core.lifecycle import ElectPreferredGroup, add_up
    from protocol.messages.admin import ElectPreferredLeadersResponse

    c = Cluster()
    c.start(1, 2, 3)
    c.create("t", assignments=[[1, 2], [2, 1], [3, 1], [1, 3]], min_isr=1)
    c.fence(1)  # t-0 and t-3 move to 2 and 3
    c.restart(1, clean=True)
    c.alter([1, 2], partition=0)  # 1 back in t-0's ISR only
    r = c.submit(ElectPreferredGroup((("t", (0, 1, 2, 3, 9)), ("nope", (0,)))))
    answer = r.response
    assert isinstance(answer, ElectPreferredLeadersResponse)
    assert (answer.elected, answer.not_needed, answer.not_available, answer.unknown) == (
        1,
        2,
        1,
        2,
    )
    assert [(f.topic, f.partition, f.error_code) for f in answer.failures] == [
        ("t", 3, "PREFERRED_LEADER_NOT_AVAILABLE"),
        ("t", 9, "UNKNOWN_TOPIC_OR_PARTITION"),
        ("nope", 0, "UNKNOWN_TOPIC_OR_PARTITION"),
    ]
    assert c.p("t", 0).leader == 1
    total = add_up(answer, answer)
    assert (total.elected, total.unknown, len(total.failures)) == (2, 4, 6)
    many = ElectPreferredLeadersResponse(failures=answer.failures * 40)
    assert len(add_up(many, many).failures) == 100  # the first failures, capped


def test_a_feature_change_queues_every_leaderless_partition() -> None:
    from controller.core.step import touched
    from metadata_image.replay import apply

    c = Cluster()
    c.start(1, 2)
    c.create("t", assignments=[[1], [2]], min_isr=1)
    c.fence(1)
    assert ("t", 0) in c.image.offline
    image, delta = apply(c.image, [FeatureLevelRecord(name=ELR_FEATURE, level=0)])
    assert touched(image, delta) == frozenset({("t", 0)})


# --- issue 30: Kafka's exact rules, and no silent loss across an ELR upgrade ------------


def classic_last_member() -> Cluster:
    """t-0 on [1, 2], MinISR 2, under the classic rules: 2 fenced, then 1, the last ISR
    member, which the classic rules keep in the ISR (no leader)."""
    c = Cluster(ControllerConfig(eligible_leader_replicas=False))
    c.start(1, 2)
    c.create("t", assignments=[[1, 2]], min_isr=2)
    c.fence(2)
    c.fence(1)
    assert c.view() == (-1, [1], [], [])
    return c


class TestUncleanRegistrationAcrossLevels:
    def test_an_unclean_restart_after_the_upgrade_leaves_the_isr_for_the_lkelr(self) -> None:
        """Item 1: the classic last member, uncleanly restarted after the upgrade, is no
        clean ISR leader: it goes to the LastKnownELR and a recovery elects it, reported.
        (Before: a clean ISR election, no UncleanRecoveryRecord: a silent loss.)"""
        c = classic_last_member()
        c.submit(UpdateFeature(name=ELR_FEATURE, level=1))
        r = c.register(1)
        assert not r.clean
        assert c.view() == (-1, [], [], [1])
        change = c.last.records[-1]
        assert isinstance(change, PartitionChangeRecord)
        assert change.reason == ChangeReason.UNCLEAN_REGISTRATION
        result = c.unfence(1)
        assert c.view() == (-1, [], [], [1])  # no clean election from the ISR
        assert not any(isinstance(r, PartitionChangeRecord) for r in result.records)
        c.answer(1, 0, 10)  # balanced asks the LastKnownELR's log
        assert c.view() == (1, [1], [], [])
        assert c.p().recovery_state.value == 1  # RECOVERING: a potential data-loss event
        recoveries = [r for r in c.last.records if isinstance(r, UncleanRecoveryRecord)]
        assert [(r.chosen, r.potential_data_loss) for r in recoveries] == [(1, True)]
        consistent(c)

    def test_classic_rules_still_elect_the_last_member_again(self) -> None:
        """At level 0 the classic rules stand (the documented silent-loss path)."""
        c = classic_last_member()
        c.register(1)
        assert c.view() == (-1, [1], [], [])
        c.unfence(1)
        assert c.view() == (1, [1], [], [])
        assert c.p().recovery_state.value == 0

    def test_registered_uncleanly_before_the_upgrade_unfenced_after_it(self) -> None:
        c = classic_last_member()
        c.register(1)  # classic: stays in the ISR
        c.submit(UpdateFeature(name=ELR_FEATURE, level=1))
        assert c.view() == (-1, [1], [], [])
        c.unfence(1)
        changes = [r for r in c.last.records if isinstance(r, PartitionChangeRecord)]
        assert changes[0].reason == ChangeReason.UNCLEAN_REGISTRATION
        assert (changes[0].isr, changes[0].last_known_elr) == ([], [1])
        assert c.view() == (-1, [], [], [1])  # never a clean election
        c.answer(1, 0, 10)
        assert c.view() == (1, [1], [], [])
        assert c.p().recovery_state.value == 1  # recovered, reported
        consistent(c)

    def test_a_clean_registration_after_the_upgrade_is_elected_cleanly(self) -> None:
        c = classic_last_member()
        c.submit(UpdateFeature(name=ELR_FEATURE, level=1))
        c.restart(1, clean=True)
        assert c.view() == (1, [1], [], [])
        assert c.p().recovery_state.value == 0

    def test_re_registration_after_an_unregistration_under_the_classic_rules(self) -> None:
        c = classic_last_member()
        c.submit(UnregisterBroker(broker_id=1))
        assert c.view() == (-1, [1], [], [])  # classic: the last member stays
        c.submit(UpdateFeature(name=ELR_FEATURE, level=1))
        assert not c.register(1).clean  # a new registration of a broker hosting replicas
        assert c.view() == (-1, [], [], [1])

    def test_a_downgrade_puts_nobody_into_an_isr(self) -> None:
        c = Cluster()
        c.start(1, 2)
        c.create("t", assignments=[[1, 2]], min_isr=2)
        c.fence(2)
        c.fence(1)
        assert c.view() == (-1, [], [1, 2], [])
        c.submit(UpdateFeature(name=ELR_FEATURE, level=0, upgrade_type="downgrade"))
        assert c.view() == (-1, [], [], [])
        c.restart(1, clean=False)
        assert c.view() == (-1, [], [], [])  # classic: elected from the ISR only

    def test_an_isr_member_above_min_isr_just_leaves(self) -> None:
        """With other members enough for MinISR, the unclean registrant leaves the ISR and
        goes nowhere (rule 1 keeps no ELR at or above MinISR)."""
        c = Cluster(ControllerConfig(eligible_leader_replicas=False))
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2, 3]], min_isr=1)
        c.fence(2)
        c.fence(3)
        c.fence(1)
        assert c.view() == (-1, [1], [], [])
        c.submit(UpdateFeature(name=ELR_FEATURE, level=1))
        c.register(1)
        assert c.view() == (-1, [], [], [1])  # below MinISR 1: to the LastKnownELR


class TestKafkasConfigRules:
    def test_a_topic_value_set_to_itself_writes_nothing_and_keeps_the_elr(self) -> None:
        """Item 2."""
        c = with_elr()
        before = c.p().partition_epoch
        r = c.submit(cfg("topic", "t", "2"))
        assert r.records == []
        assert r.response == AlterConfigsResponse(
            resource_type="topic", resource_name="t", cleared_topics=0
        )
        assert c.view() == (1, [1], [2], []) and c.p().partition_epoch == before

    def test_deleting_a_value_never_set_writes_nothing(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2, 3]])  # follows the default
        c.fence(3)
        c.submit(cfg("broker", "", "3"))
        c.fence(2)
        assert c.view() == (1, [1], [2], [])
        assert c.submit(cfg("topic", "t", delete=True)).records == []
        assert c.view() == (1, [1], [2], [])

    def test_the_cluster_default_to_itself_still_clears(self) -> None:
        c = with_elr()
        c.submit(Bootstrap())
        r = c.submit(cfg("broker", "", c.image.cluster_configs[MIN_ISR_CONFIG]))
        assert any(isinstance(x, ClearElrRecord) for x in r.records)
        assert c.view() == (1, [1], [], [])

    def test_only_cleared_partitions_get_a_new_epoch(self) -> None:
        """Item 4: t-0 has an ELR, t-1 not; lowering MinISR bumps t-0 only, and t-1's
        leader's AlterPartition at the epoch it knew is accepted."""
        c = Cluster()
        c.start(1, 2, 3, 4)
        c.create("t", assignments=[[1, 2, 3], [2, 3, 4]], min_isr=3)
        c.fence(1)
        e0, e1 = c.p("t", 0).partition_epoch, c.p("t", 1).partition_epoch
        c.submit(cfg("topic", "t", "2"))
        assert c.p("t", 0).partition_epoch == e0 + 1
        assert (c.p("t", 1).partition_epoch, c.p("t", 1).min_isr) == (e1, 2)
        clears = [r for r in c.log if isinstance(r, ClearElrRecord)]
        assert clears and all(r.v == 3 for r in clears)
        c.alter([2, 3], topic="t", partition=1)
        assert c.view("t", 1)[1] == [2, 3]
        consistent(c)

    def test_an_old_clear_record_replays_as_written(self) -> None:
        """A version-1 ClearElrRecord (a log from before) bumps every changed partition."""
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2, 3]], min_isr=3)
        before = c.p().partition_epoch
        old = replay(c.image, [ClearElrRecord(topic="t", min_isr=2)])
        new = replay(c.image, [ClearElrRecord(v=3, topic="t", min_isr=2)])
        assert old.partitions[("t", 0)].partition_epoch == before + 1
        assert new.partitions[("t", 0)].partition_epoch == before
        assert old.partitions[("t", 0)].min_isr == new.partitions[("t", 0)].min_isr == 2


class TestReassignmentEpochs:
    def test_completion_and_cancel_bump_the_leader_epoch_where_the_leader_stays(self) -> None:
        """Item 3."""
        c = Cluster()
        c.start(1, 2, 3, 4, 5)
        c.create("t", assignments=[[1, 2, 3], [1, 2, 3]], min_isr=2)
        assert reassign(c, ("t", 0, [1, 2, 4])) == [None]
        assert (c.p().leader, c.p().leader_epoch) == (1, 0)  # growing: no bump
        c.alter([1, 2, 3, 4])  # completes: 3 leaves
        assert (c.p().replicas, c.p().leader, c.p().leader_epoch) == ((1, 2, 4), 1, 1)
        assert reassign(c, ("t", 1, [1, 2, 5])) == [None]
        assert reassign(c, ("t", 1, None)) == [None]
        assert (c.p("t", 1).replicas, c.p("t", 1).leader, c.p("t", 1).leader_epoch) == (
            (1, 2, 3),
            1,
            1,
        )
        consistent(c)

    def test_a_cancel_that_would_strand_the_data_is_refused(self) -> None:
        c = Cluster()
        c.start(1, 2, 3, 4)
        c.create("t", assignments=[[1, 2]], min_isr=1)
        reassign(c, ("t", 0, [3, 4]))
        c.alter([1, 2, 3])
        c.fence(1)
        c.fence(2)
        assert c.view() == (3, [3], [], [])
        assert reassign(c, ("t", 0, None)) == ["INVALID_REPLICA_ASSIGNMENT"]
        assert reassign(c, ("t", 0, [1, 4])) == ["INVALID_REPLICA_ASSIGNMENT"]
        assert c.view() == (3, [3], [], [])
