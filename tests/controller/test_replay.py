"""Replay (the only place state changes), the image's queries, and the snapshot form."""

from __future__ import annotations

import immutables
import msgspec
import pytest

from metactl.errors import MetactlError, ReplayError
from metadata_image import builder as builder_module
from metadata_image import replay as replay_module
from metadata_image import snapshot as snapshot_module
from metadata_image.image import EMPTY_INDEX, ClusterImage
from metadata_image.replay import replay
from metadata_image.snapshot import (
    ImageSnapshot,
    from_snapshot,
    image_from_records,
    image_to_records,
    partition_record,
    to_snapshot,
)
from metadata_image.state import EMPTY, BrokerState, PartitionState, TopicState, parse_tp, tp_name
from metadata_log.records import (
    NO_LEADER,
    RECORD_TYPES,
    BrokerRegistrationChangeRecord,
    ChangeReason,
    ClearElrRecord,
    FenceBrokerRecord,
    LeaderRecoveryState,
    MetadataRecord,
    NoOpRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RecoveryCandidate,
    RegisterBrokerRecord,
    TopicRecord,
    UncleanRecoveryRecord,
    UnfenceBrokerRecord,
    decode_batch,
)

from .testkit import Cluster

REG = RegisterBrokerRecord(broker_id=1, incarnation_id="i1", broker_epoch=0, rack="r")


def rich_cluster() -> Cluster:
    """Every kind of state: racks, fenced, controlled shutdown, ELR, LastKnownELR,
    leaderless, recovering, several topics and strategies."""
    c = Cluster()
    c.start(1, 2, rack="a")
    c.start(3, 4, rack="b")
    c.start(5)
    c.create("orders", partitions=3, replication_factor=3, min_isr=2)
    c.create("audit", assignments=[[1, 2, 3]], min_isr=3, recovery_strategy="manual")
    c.create("logs", assignments=[[4, 5]], min_isr=2, recovery_strategy="proactive")
    c.alter([1], "audit")
    c.fence(1)
    c.register(1)  # unclean
    c.shutdown(4)
    for b in (2, 3):
        c.fence(b)
    c.register(3)
    c.unfence(3)
    c.elect_unclean(3, "audit")
    c.fence(5)
    return c


# --- replay of each record type ----------------------------------------------------------


class TestReplayRecords:
    def test_register_broker(self) -> None:
        image = replay(ClusterImage(), [REG])
        assert image.brokers[1] == BrokerState(
            broker_id=1,
            epoch=0,
            incarnation_id="i1",
            rack="r",
            fenced=True,
            last_registration_clean=False,
        )
        assert image.end_offset == 1

    def test_fence_and_unfence_apply_only_to_the_named_epoch(self) -> None:
        image = replay(ClusterImage(), [REG, UnfenceBrokerRecord(broker_id=1, broker_epoch=0)])
        assert image.brokers[1].active
        stale = replay(image, [FenceBrokerRecord(broker_id=1, broker_epoch=7)])
        assert stale.brokers[1].active
        assert stale.end_offset == image.end_offset + 1
        fenced = replay(image, [FenceBrokerRecord(broker_id=1, broker_epoch=0)])
        assert fenced.brokers[1].fenced
        assert replay(fenced, [UnfenceBrokerRecord(broker_id=1, broker_epoch=3)]).brokers[1].fenced

    def test_broker_registration_change(self) -> None:
        image = replay(ClusterImage(), [REG])
        cs = replay(
            image,
            [
                BrokerRegistrationChangeRecord(
                    broker_id=1, broker_epoch=0, in_controlled_shutdown=True
                )
            ],
        )
        b = cs.brokers[1]
        assert (b.fenced, b.in_controlled_shutdown) == (True, True)
        unfenced = replay(
            cs, [BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=0, fenced=False)]
        )
        b = unfenced.brokers[1]
        assert (b.fenced, b.in_controlled_shutdown) == (False, True)
        assert b.rack == "r" and b.incarnation_id == "i1"
        stale = replay(
            unfenced, [BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=9, fenced=True)]
        )
        assert stale.brokers[1] == unfenced.brokers[1]

    def test_a_new_registration_clears_controlled_shutdown(self) -> None:
        image = replay(
            ClusterImage(),
            [
                REG,
                BrokerRegistrationChangeRecord(
                    broker_id=1, broker_epoch=0, in_controlled_shutdown=True
                ),
                RegisterBrokerRecord(broker_id=1, incarnation_id="i2", broker_epoch=2, clean=True),
            ],
        )
        b = image.brokers[1]
        assert (b.epoch, b.in_controlled_shutdown, b.fenced, b.rack) == (2, False, True, None)
        assert b.last_registration_clean

    def test_topic_and_partition_records_build_the_indexes(self) -> None:
        image = replay(
            ClusterImage(),
            [
                TopicRecord(name="t", topic_id="x", partitions=2, min_isr=2),
                PartitionRecord(topic="t", partition=0, replicas=[1, 2], isr=[1, 2], leader=1),
                PartitionRecord(topic="t", partition=1, replicas=[2, 3], isr=[], elr=[3]),
            ],
        )
        assert image.topics["t"] == TopicState(name="t", topic_id="x", partitions=2, min_isr=2)
        assert set(image.replicas_by_broker[2]) == {("t", 0), ("t", 1)}
        assert set(image.replicas_by_broker[1]) == {("t", 0)}
        assert set(image.offline) == {("t", 1)}
        assert image.partitions[("t", 1)].elr == frozenset({3})
        # Re-stating a partition keeps the index as it is.
        again = replay(
            image,
            [PartitionRecord(topic="t", partition=0, replicas=[1, 2], isr=[1], leader=NO_LEADER)],
        )
        assert again.replicas_by_broker == image.replicas_by_broker
        assert set(again.offline) == {("t", 0), ("t", 1)}

    def test_a_run_of_partition_records_over_several_topics_indexes_each(self) -> None:
        # One run of PartitionRecords (as a snapshot's) moves from topic to topic: each
        # topic's new partitions, grouped by replicas, reach every replica's index entry
        # under their own topic.
        image = replay(
            ClusterImage(),
            [
                TopicRecord(name="a", topic_id="x", partitions=2, min_isr=1),
                TopicRecord(name="b", topic_id="y", partitions=2, min_isr=1),
                PartitionRecord(topic="a", partition=0, replicas=[1, 2], isr=[1, 2], leader=1),
                PartitionRecord(topic="a", partition=1, replicas=[2, 3], isr=[2, 3], leader=2),
                PartitionRecord(topic="b", partition=0, replicas=[1, 2], isr=[1, 2], leader=1),
                PartitionRecord(topic="b", partition=1, replicas=[1, 2], isr=[1, 2], leader=2),
            ],
        )
        assert set(image.replicas_by_broker[1]) == {("a", 0), ("b", 0), ("b", 1)}
        assert set(image.replicas_by_broker[2]) == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
        assert set(image.replicas_by_broker[3]) == {("a", 1)}

    def test_partition_change_sets_only_the_given_fields(self) -> None:
        base = replay(
            ClusterImage(),
            [
                TopicRecord(name="t", topic_id="x", partitions=1, min_isr=3),
                PartitionRecord(
                    topic="t",
                    partition=0,
                    replicas=[1, 2, 3],
                    isr=[1],
                    elr=[2],
                    last_known_elr=[3],
                    leader=1,
                    leader_epoch=5,
                    partition_epoch=9,
                    min_isr=3,
                ),
            ],
        )
        p0 = base.partitions[("t", 0)]
        same = replay(
            base,
            [
                PartitionChangeRecord(
                    topic="t",
                    partition=0,
                    reason=ChangeReason.ALTER_PARTITION,
                    partition_epoch=10,
                    leader_epoch=5,
                )
            ],
        ).partitions[("t", 0)]
        assert same == msgspec.structs.replace(p0, partition_epoch=10)
        changed = replay(
            base,
            [
                PartitionChangeRecord(
                    topic="t",
                    partition=0,
                    reason=ChangeReason.FENCE,
                    partition_epoch=10,
                    leader_epoch=6,
                    leader=NO_LEADER,
                    isr=[],
                    elr=[1, 2],
                    last_known_elr=[],
                    recovery_state=LeaderRecoveryState.RECOVERING,
                )
            ],
        )
        p = changed.partitions[("t", 0)]
        assert (p.leader, p.isr, p.elr, p.last_known_elr) == (
            NO_LEADER,
            frozenset(),
            frozenset({1, 2}),
            frozenset(),
        )
        assert (p.leader_epoch, p.partition_epoch, p.min_isr) == (6, 10, 3)
        assert p.recovery_state is LeaderRecoveryState.RECOVERING
        assert ("t", 0) in changed.offline
        back = replay(
            changed,
            [
                PartitionChangeRecord(
                    topic="t",
                    partition=0,
                    reason=ChangeReason.UNFENCE,
                    partition_epoch=11,
                    leader_epoch=7,
                    leader=2,
                    isr=[2],
                )
            ],
        )
        assert ("t", 0) not in back.offline
        assert back.partitions[("t", 0)].leader == 2

    def test_audit_records_change_nothing_but_the_offset_and_the_last_recovery(self) -> None:
        c = rich_cluster()
        recovery = UncleanRecoveryRecord(
            topic="orders",
            partition=0,
            strategy="balanced",
            candidates=[RecoveryCandidate(broker_id=1, last_leader_epoch=1, log_end_offset=2)],
            chosen=1,
            at_ms=7,
        )
        after = replay(c.image, [NoOpRecord(), recovery])
        assert after.end_offset == c.image.end_offset + 2
        # The recovery is kept as the partition's last (describe shows it after restarts);
        # the PartitionChangeRecord beside it in a real log carries the state.
        assert after.last_recoveries[("orders", 0)] == recovery
        kept = msgspec.structs.replace(
            after, end_offset=c.image.end_offset, last_recoveries=c.image.last_recoveries
        )
        assert kept.same_state(c.image)
        with pytest.raises(ReplayError, match="unknown partition"):
            replay(c.image, [msgspec.structs.replace(recovery, partition=99)])

    def test_end_offset_counts_records_and_input_is_never_modified(self) -> None:
        c = rich_cluster()
        before = c.image
        records = image_to_records(before)
        copy = image_from_records(records, before.end_offset)
        replay(before, [FenceBrokerRecord(broker_id=3, broker_epoch=before.brokers[3].epoch)])
        assert before.same_state(copy)
        assert replay(before, []).same_state(before)


class TestClearElr:
    def test_clears_elr_and_last_known_elr_of_every_partition_of_the_topic(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.create("t", assignments=[[1, 2, 3], [1, 2, 3], [1, 2, 3]], min_isr=3)
        c.create("u", assignments=[[1, 2, 3]], min_isr=3)
        c.alter([1, 2], "t", 0)
        c.alter([1], "t", 1)
        c.alter([1], "u", 0)
        c.fence(3)
        c.register(3)  # unclean: t-0 and t-1 and u-0 now have 3 in their LastKnownELR
        assert c.view("t", 0) == (1, [1, 2], [], [3])
        assert c.view("t", 1) == (1, [1], [2], [3])
        t2 = c.p("t", 2)  # ISR [1, 2] after the fence: 3 joined its ELR, then moved to LKELR
        before = {i: c.p("t", i).partition_epoch for i in range(3)}
        u0 = c.p("u", 0)
        c.commit([ClearElrRecord(topic="t")])
        for i in range(3):
            p = c.p("t", i)
            assert p.elr == frozenset() and p.last_known_elr == frozenset()
            assert p.partition_epoch == before[i] + 1
            assert p.leader == 1
        assert t2.last_known_elr  # it did have something to clear
        assert c.p("u", 0) == u0

    def test_partitions_with_nothing_to_clear_are_untouched(self) -> None:
        c = Cluster()
        c.start(1, 2)
        c.create("t", replication_factor=2, min_isr=1)
        p = c.p()
        c.commit([ClearElrRecord(topic="t")])
        assert c.p() == p

    def test_unknown_topic(self) -> None:
        with pytest.raises(ReplayError, match="unknown topic"):
            replay(ClusterImage(), [ClearElrRecord(topic="t")])


class TestReplayErrors:
    @pytest.mark.parametrize(
        "record",
        [
            FenceBrokerRecord(broker_id=9, broker_epoch=0),
            UnfenceBrokerRecord(broker_id=9, broker_epoch=0),
            BrokerRegistrationChangeRecord(broker_id=9, broker_epoch=0, fenced=True),
        ],
        ids=["fence", "unfence", "registration-change"],
    )
    def test_unknown_broker(self, record: MetadataRecord) -> None:
        with pytest.raises(ReplayError, match="unknown broker 9") as e:
            replay(ClusterImage(), [REG, record])
        assert e.value.code == "METADATA_REPLAY_ERROR"
        assert isinstance(e.value, MetactlError)

    def test_a_record_of_a_type_replay_does_not_know_is_refused(self) -> None:
        # Replay never silently skips what it cannot interpret (the offset would advance
        # with the state missing); a new record type must be taught to replay first.
        class FutureRecord(NoOpRecord, tag="Future", frozen=True):
            pass

        with pytest.raises(ReplayError, match="cannot replay a str"):
            replay(ClusterImage(), ["not a record"])  # type: ignore[list-item]
        assert replay(ClusterImage(), [FutureRecord()]).end_offset == 1  # a NoOp subclass

    def test_unknown_partition(self) -> None:
        record = PartitionChangeRecord(
            topic="t", partition=3, reason=ChangeReason.FENCE, partition_epoch=1, leader_epoch=0
        )
        with pytest.raises(ReplayError, match="unknown partition t-3"):
            replay(ClusterImage(), [record])


# --- snapshots ---------------------------------------------------------------------------


class TestSnapshotForm:
    def test_image_to_records_and_back_gives_the_same_state(self) -> None:
        c = rich_cluster()
        image = c.image
        # The cluster really is rich: check the states the round trip must carry.
        assert image.brokers[4].in_controlled_shutdown
        assert image.brokers[5].fenced
        assert not image.brokers[1].last_registration_clean
        assert image.partitions[("audit", 0)].recovery_state is LeaderRecoveryState.RECOVERING
        assert image.offline
        assert any(p.elr for p in image.partitions.values())
        assert any(p.last_known_elr for p in image.partitions.values())
        rebuilt = image_from_records(image_to_records(image), image.end_offset)
        assert rebuilt.same_state(image)
        # ... and equals replaying the whole log from scratch.
        assert replay(ClusterImage(), c.log).same_state(image)

    def test_image_to_records_order_and_content(self) -> None:
        c = rich_cluster()
        records = image_to_records(c.image)
        brokers = [r.broker_id for r in records if isinstance(r, RegisterBrokerRecord)]
        assert brokers == [1, 2, 3, 4, 5]
        assert [r for r in records if isinstance(r, BrokerRegistrationChangeRecord)] == [
            BrokerRegistrationChangeRecord(
                broker_id=4, broker_epoch=c.epoch(4), in_controlled_shutdown=True
            )
        ]
        topics = [r.name for r in records if isinstance(r, TopicRecord)]
        assert topics == ["audit", "logs", "orders"]
        assert records[-1] == partition_record(c.p("orders", 2))
        assert {type(r) for r in records} == {
            RegisterBrokerRecord,
            BrokerRegistrationChangeRecord,
            TopicRecord,
            PartitionRecord,
            UncleanRecoveryRecord,  # a partition's last recovery, right after it
        }
        for tp, last in c.image.last_recoveries.items():
            at = records.index(last)
            assert records[at - 1] == partition_record(c.p(*tp))

    def test_image_from_records_takes_the_given_end_offset(self) -> None:
        c = rich_cluster()
        image = image_from_records(image_to_records(c.image), 12345)
        assert image.end_offset == 12345
        assert not image.same_state(c.image)
        assert image_from_records([], 0).same_state(ClusterImage())

    def test_snapshot_round_trip_through_msgpack(self) -> None:
        c = rich_cluster()
        snapshot = to_snapshot(c.image)
        assert snapshot.end_offset == c.image.end_offset
        payload = msgspec.msgpack.encode(snapshot)
        decoded = msgspec.msgpack.decode(payload, type=ImageSnapshot)
        assert decoded == snapshot
        assert from_snapshot(decoded).same_state(c.image)
        # The batches inside are the metadata log's own encoding, too.
        assert snapshot.v == 2 and not snapshot.records
        assert [r for b in snapshot.batches for r in decode_batch(b)] == image_to_records(c.image)

    def test_a_large_image_snapshots_in_several_batches(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        c = rich_cluster()
        monkeypatch.setattr(snapshot_module, "SNAPSHOT_BATCH_RECORDS", 3)
        snapshot = to_snapshot(c.image)
        n = len(image_to_records(c.image))
        assert len(snapshot.batches) == -(-n // 3) > 1
        assert snapshot.all_records() == image_to_records(c.image)
        assert from_snapshot(snapshot).same_state(c.image)

    def test_a_version_1_snapshot_still_loads(self) -> None:
        c = rich_cluster()
        v1 = msgspec.msgpack.encode(
            {
                "type": "ImageSnapshot",
                "v": 1,
                "end_offset": c.image.end_offset,
                "records": image_to_records(c.image),
            }
        )
        decoded = msgspec.msgpack.decode(v1, type=ImageSnapshot)
        assert decoded.v == 1 and not decoded.batches
        assert from_snapshot(decoded).same_state(c.image)
        assert decoded.all_records() == image_to_records(c.image)

    def test_snapshot_then_the_rest_of_the_log_gives_the_same_state(self) -> None:
        c = rich_cluster()
        snap_payload = msgspec.msgpack.encode(to_snapshot(c.image))
        offset = c.image.end_offset
        c.fence(4)
        c.register(2)
        c.unfence(2)
        c.alter([3, 2], "audit")
        restored = from_snapshot(msgspec.msgpack.decode(snap_payload, type=ImageSnapshot))
        assert replay(restored, c.log[offset:]).same_state(c.image)

    def test_snapshot_of_the_empty_image(self) -> None:
        snapshot = to_snapshot(ClusterImage())
        assert snapshot == ImageSnapshot(end_offset=0, batches=[])
        assert from_snapshot(snapshot).same_state(ClusterImage())


# --- bulk replay: interning and the paused collector ------------------------------------------


class TestBulkReplay:
    def records(self, n: int) -> list[MetadataRecord]:
        out: list[MetadataRecord] = [TopicRecord(name="t", topic_id="x", partitions=n, min_isr=1)]
        for i in range(n):
            replicas = [1 + i % 3, 1 + (i + 1) % 3]
            out.append(
                PartitionRecord(
                    topic="t", partition=i, replicas=replicas, isr=replicas, leader=replicas[0]
                )
            )
        return out

    def test_equal_sets_and_replica_lists_are_shared(self) -> None:
        image = replay(ClusterImage(), self.records(6))
        p0, p3 = image.partitions[("t", 0)], image.partitions[("t", 3)]
        assert p0.replicas == p3.replicas and p0.isr == p3.isr
        assert p0.replicas is p3.replicas and p0.isr is p3.isr
        assert p0.elr is EMPTY

    def test_the_intern_tables_are_bounded(self, monkeypatch: pytest.MonkeyPatch) -> None:
        sets: dict[tuple[int, ...], frozenset[int]] = {}
        tuples: dict[tuple[int, ...], tuple[int, ...]] = {}
        monkeypatch.setattr(builder_module, "_SETS", sets)
        monkeypatch.setattr(builder_module, "_TUPLES", tuples)
        monkeypatch.setattr(builder_module, "_INTERN_LIMIT", 2)
        image = replay(ClusterImage(), self.records(6))
        assert 0 < len(sets) <= 2 and 0 < len(tuples) <= 2
        for i in range(6):
            p = image.partitions[("t", i)]
            assert list(p.replicas) == [1 + i % 3, 1 + (i + 1) % 3]
            assert p.isr == frozenset(p.replicas)

    class FakeGC:
        def __init__(self, enabled: bool) -> None:
            self.enabled = enabled
            self.calls: list[str] = []

        def isenabled(self) -> bool:
            return self.enabled

        def disable(self) -> None:
            self.calls.append("disable")
            self.enabled = False

        def enable(self) -> None:
            self.calls.append("enable")
            self.enabled = True

    @pytest.mark.parametrize("build", ["replay", "image_from_records"])
    def test_the_collector_pauses_for_big_batches_only(
        self, build: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        fake = self.FakeGC(enabled=True)
        monkeypatch.setattr(builder_module, "gc", fake)
        monkeypatch.setattr(builder_module, "BULK", 5)

        def run(records: list[MetadataRecord]) -> ClusterImage:
            if build == "replay":
                return replay(ClusterImage(), records)
            return image_from_records(records, len(records))

        run(self.records(3))  # 4 records
        assert fake.calls == []
        image = run(self.records(4))  # 5 records
        assert fake.calls == ["disable", "enable"] and fake.enabled
        assert len(image.partitions) == 4
        fake.calls.clear()
        with pytest.raises(ReplayError):
            run([*self.records(4), FenceBrokerRecord(broker_id=1, broker_epoch=0)])
        assert fake.calls == ["disable", "enable"] and fake.enabled

    def test_a_disabled_collector_is_left_alone(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = self.FakeGC(enabled=False)
        monkeypatch.setattr(builder_module, "gc", fake)
        monkeypatch.setattr(builder_module, "BULK", 1)
        replay(ClusterImage(), self.records(2))
        assert fake.calls == [] and not fake.enabled

    def test_any_iterable_of_records_is_accepted(self) -> None:
        records = self.records(3)
        assert replay(ClusterImage(), iter(records)).same_state(replay(ClusterImage(), records))
        assert image_from_records(iter(records), 4).same_state(replay(ClusterImage(), records))


# --- the image ---------------------------------------------------------------------------


class TestImage:
    def test_partition_names(self) -> None:
        assert tp_name(("orders", 3)) == "orders-3"
        assert parse_tp("orders-3") == ("orders", 3)
        assert parse_tp("my-topic-12") == ("my-topic", 12)
        assert parse_tp(tp_name(("a-b", 0))) == ("a-b", 0)

    @pytest.mark.parametrize("name", ["orders", "-3", "orders-", "orders-x", "orders-1.5"])
    def test_bad_partition_names(self, name: str) -> None:
        with pytest.raises(ValueError, match="not a partition name"):
            parse_tp(name)

    def test_queries(self) -> None:
        c = Cluster()
        c.start(1, 2, 3)
        c.register(4)
        c.create("t", assignments=[[1, 2], [2, 3]], min_isr=1)
        image = c.image
        assert image.broker(9) is None and image.broker(1) is not None
        assert image.is_active(1) and not image.is_active(4) and not image.is_active(9)
        assert image.partition(("t", 5)) is None
        p = image.partition(("t", 1))
        assert isinstance(p, PartitionState)
        assert p.tp == ("t", 1) and p.has_leader
        assert sorted(x.tp for x in image.partitions_of(2)) == [("t", 0), ("t", 1)]
        assert list(image.partitions_of(9)) == []
        assert image.hosts_replicas(3) and not image.hosts_replicas(4)
        assert image.leads_anything(1) and image.leads_anything(2)
        assert not image.leads_anything(3) and not image.leads_anything(4)
        assert list(image.offline_partitions()) == []
        c.fence(2)
        c.fence(3)
        assert [p.tp for p in c.image.offline_partitions()] == [("t", 1)]

    def test_empty_index_means_hosting_nothing(self) -> None:
        image = msgspec.structs.replace(
            ClusterImage(), replicas_by_broker=immutables.Map({1: EMPTY_INDEX})
        )
        assert not image.hosts_replicas(1)
        assert not image.leads_anything(1)

    def test_broker_activity(self) -> None:
        b = BrokerState(broker_id=1, epoch=0, incarnation_id="i")
        assert not b.active  # fenced by default
        assert msgspec.structs.replace(b, fenced=False).active
        assert not msgspec.structs.replace(b, fenced=False, in_controlled_shutdown=True).active

    def test_same_state_compares_every_component(self) -> None:
        image = rich_cluster().image
        other = image_from_records(image_to_records(image), image.end_offset)
        assert image.same_state(other)
        variants = [
            msgspec.structs.replace(other, end_offset=other.end_offset + 1),
            msgspec.structs.replace(other, brokers=other.brokers.delete(5)),
            msgspec.structs.replace(other, topics=other.topics.delete("logs")),
            msgspec.structs.replace(other, partitions=other.partitions.delete(("logs", 0))),
            msgspec.structs.replace(other, replicas_by_broker=other.replicas_by_broker.delete(5)),
            msgspec.structs.replace(other, offline=immutables.Map()),
        ]
        for v in variants:
            assert not image.same_state(v)


class TestReplicaIndex:
    def test_membership_iteration_and_size(self) -> None:
        index = EMPTY_INDEX.added({"b": [2, 0], "a": [1]})
        assert ("b", 2) in index and ("a", 1) in index
        assert ("a", 2) not in index and ("c", 0) not in index
        assert "a" not in index and ("a", 1, 0) not in index  # not a partition at all
        assert ("a", "1") not in index  # nor is a partition named by anything but a number
        assert len(index) == 3
        assert next(iter(index)) == ("a", 1)  # topics in name order, whatever the hash seed
        grown = index.added({"b": [5], "c": [0]})
        assert set(grown) == {("a", 1), ("b", 0), ("b", 2), ("b", 5), ("c", 0)}
        assert len(grown) == 5 and len(index) == 3  # the old index is unchanged
        assert grown == EMPTY_INDEX.added({"a": [1], "b": [0, 2, 5], "c": [0]})

    def test_a_topic_added_in_slices_keeps_few_chunks_and_acts_as_one_set(self) -> None:
        """A sliced create adds a chunk per slice; chunks merge four at a time, as a
        base-4 counter carries, so 100 slices leave a handful, and the index is, for
        membership, iteration order and equality, the one set built at once."""
        index = EMPTY_INDEX
        for s in range(100):
            index = index.added({"t": range(1000 * s, 1000 * (s + 1))})
        at_once = EMPTY_INDEX.added({"t": range(100_000)})
        chunks = index.topics["t"]
        assert 1 < len(chunks) <= 8
        assert sum(len(c) for c in chunks) == 100_000 == len(index)
        assert ("t", 0) in index and ("t", 99_999) in index and ("t", 100_000) not in index
        assert list(index) == list(at_once) and index == at_once
        assert index != EMPTY_INDEX.added({"t": range(99_999)})  # sizes differ
        assert index != EMPTY_INDEX.added({"u": range(100_000)})  # topics differ
        other = EMPTY_INDEX.added({"t": range(1, 100_001)})
        assert index != other  # same size, other partitions
        assert index.__eq__("t") is NotImplemented and index.__ne__("t") is NotImplemented
        assert (index != at_once) is False  # != agrees with ==, however the sets are chunked
        # Adding what is there already adds nothing.
        again = index.added({"t": [0, 5, 99_999]})
        assert len(again) == 100_000 and again.topics["t"] == chunks
        assert len(index.added({"t": [7, 100_000]})) == 100_001

    def test_every_record_type_has_a_replay_handler(self) -> None:
        assert set(RECORD_TYPES.values()) <= set(replay_module._APPLY)
