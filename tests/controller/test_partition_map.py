"""PartitionMap: the image's persistent partition map against a dict model."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metactl.errors import ReplayError
from metadata_image.image import ClusterImage
from metadata_image.partition_map import CHUNK, EMPTY_PARTITIONS, PartitionMap
from metadata_image.replay import replay
from metadata_image.snapshot import image_from_records, image_to_records
from metadata_image.state import PartitionState, TopicPartition
from metadata_log.records import (
    NO_LEADER,
    ChangeReason,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    TopicRecord,
)


def state(topic: str, partition: int, epoch: int = 0) -> PartitionState:
    return PartitionState(
        topic=topic,
        partition=partition,
        tp=(topic, partition),
        replicas=(1,),
        isr=frozenset({1}),
        leader_epoch=epoch,
    )


def pmap(items: dict[TopicPartition, PartitionState]) -> PartitionMap:
    """A map holding `items`, built as replay builds one (through a mutation)."""
    m = EMPTY_PARTITIONS.mutate()
    for key, value in items.items():
        m[key] = value
    return m.finish()


def with_one(m: PartitionMap, value: PartitionState) -> PartitionMap:
    edit = m.mutate()
    edit[value.tp] = value
    return edit.finish()


# Partition numbers around chunk boundaries, far apart (sparse chunks) and negative.
numbers = st.one_of(
    st.integers(0, 2 * CHUNK + 3),
    st.sampled_from([CHUNK - 1, CHUNK, 10 * CHUNK + 7, -1, -CHUNK]),
)
keys = st.tuples(st.sampled_from(["a", "b", "orders-0"]), numbers)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, st.integers(0, 3)),
        st.tuples(st.just("del"), keys, st.just(0)),
        st.tuples(st.just("finish"), keys, st.just(0)),
    ),
    max_size=60,
)


def check(m: PartitionMap, model: dict[TopicPartition, PartitionState]) -> None:
    assert len(m) == len(model)
    assert sorted(m) == sorted(model)
    assert sorted(m.keys()) == sorted(model)
    assert sorted(m.items(), key=lambda kv: kv[0]) == sorted(model.items())
    assert sorted(v.tp for v in m.values()) == sorted(model)
    assert m == pmap(model)
    assert m == model and model == m  # against any Mapping
    for k, v in model.items():
        assert m[k] is v and m.get(k) is v and k in m


class TestAgainstADict:
    @settings(max_examples=300, deadline=None)
    @given(ops)
    def test_every_read_agrees_and_finished_maps_never_change(
        self, steps: list[tuple[str, TopicPartition, int]]
    ) -> None:
        model: dict[TopicPartition, PartitionState] = {}
        published: list[tuple[PartitionMap, dict[TopicPartition, PartitionState]]] = []
        m = EMPTY_PARTITIONS.mutate()
        for op, key, epoch in steps:
            if op == "set":
                value = state(key[0], key[1], epoch)
                m[key] = value
                model[key] = value
            elif op == "del":
                if key in model:
                    del m[key]
                    del model[key]
                else:
                    with pytest.raises(KeyError):
                        del m[key]
            else:
                published.append((m.finish(), dict(model)))
            assert len(m) == len(model)
            assert (key in m) == (key in model)
            assert m.get(key) is model.get(key)
        published.append((m.finish(), dict(model)))
        for snapshot, content in published:
            check(snapshot, content)
        assert len(EMPTY_PARTITIONS) == 0 and list(EMPTY_PARTITIONS) == []

    @settings(max_examples=100, deadline=None)
    @given(st.lists(keys, max_size=40, unique=True), st.randoms(use_true_random=False))
    def test_same_content_compares_equal_whatever_the_history(
        self, content: list[TopicPartition], rnd: object
    ) -> None:
        values = {k: state(*k) for k in content}
        forward = pmap(values)
        shuffled = list(values.items())
        rnd.shuffle(shuffled)  # type: ignore[attr-defined]
        # Built in another order, with extra partitions set and deleted on the way.
        m = EMPTY_PARTITIONS.mutate()
        for k, v in shuffled:
            m[k] = v
            extra = (k[0], k[1] + 3 * CHUNK)
            if extra not in values:
                m[extra] = state(*extra)
                del m[extra]
        other = m.finish()
        assert other == forward
        assert other._chunks == forward._chunks  # canonical: no trailing holes, no empties


class TestReads:
    def test_missing_and_malformed_keys(self) -> None:
        m = pmap({("t", 0): state("t", 0), ("t", 2): state("t", 2)})
        m = m.delete(("t", 2))  # leaves nothing past ("t", 0): the chunk is trimmed
        m = with_one(m, state("t", 2))
        assert repr(m) == "PartitionMap(<2 partitions in 1 chunks>)"
        malformed = ["t", ("t",), None, ("t", "0")]
        for key in [("t", 1), ("u", 0), ("t", CHUNK), ("t", -1), *malformed]:
            assert key not in m
            assert m.get(key, "none") == "none"
        with pytest.raises(KeyError):
            m[("t", 1)]
        with pytest.raises(KeyError):
            m.mutate()[("t", 1)]
        assert m.mutate()[("t", 2)] is m[("t", 2)]
        assert m != {("t", 0): state("t", 0, epoch=1)}
        assert m != 3

    def test_of_topic_follows_the_numbers_and_names_a_missing_one(self) -> None:
        m = pmap({("t", i): state("t", i) for i in range(0, 3 * CHUNK, 7)})
        wanted = [14, 0, 2 * CHUNK + 6]  # multiples of 7
        assert [p.partition for p in m.of_topic("t", wanted)] == wanted
        with pytest.raises(KeyError, match="'t', 1"):
            list(m.of_topic("t", [0, 1]))
        with pytest.raises(KeyError, match="'u', 5"):
            list(m.of_topic("u", [5]))
        assert list(m.of_topic("u", [])) == []

    def test_set_and_delete_leave_the_original(self) -> None:
        m = pmap({("t", 0): state("t", 0)})
        more = with_one(m, state("t", 1))
        fewer = more.delete(("t", 0))
        assert list(m) == [("t", 0)]
        assert sorted(more) == [("t", 0), ("t", 1)]
        assert list(fewer) == [("t", 1)]
        assert m.mutate().finish() is m  # nothing edited: the same map

    def test_holds_only_partition_states_under_their_own_key(self) -> None:
        with pytest.raises(TypeError, match="not None"):
            EMPTY_PARTITIONS.mutate()[("t", 0)] = None  # type: ignore[assignment]
        with pytest.raises(ValueError, match=r"the state of \('t', 1\) stored under \('t', 0\)"):
            EMPTY_PARTITIONS.mutate()[("t", 0)] = state("t", 1)

    def test_chunk_is_writable_in_place_and_absent_where_nothing_is(self) -> None:
        base = pmap({("t", 1): state("t", 1)})
        m = base.mutate()
        assert m.chunk("t", 1) is None and m.chunk("u", 0) is None
        chunk = m.chunk("t", 0)
        assert chunk is not None and chunk[1] == state("t", 1)
        chunk[1] = state("t", 1, epoch=5)
        assert m.chunk("t", 0) is chunk  # the mutation's own copy, fetched again
        after = m.finish()
        assert after[("t", 1)].leader_epoch == 5
        assert base[("t", 1)].leader_epoch == 0


class TestReplayOfChangeRuns:
    def test_a_change_outside_a_run_applies_alike(self) -> None:
        # A snapshot's partition records are read in runs too; a lone change is a run of 1.
        change = PartitionChangeRecord(
            topic="t", partition=1, reason=ChangeReason.FENCE, partition_epoch=1,
            leader_epoch=1, leader=NO_LEADER, isr=[],
        )  # fmt: skip
        image = self.cluster(hole=None)
        records = [*image_to_records(image), change]
        one_by_one = image_from_records(records, image.end_offset + 1)
        assert one_by_one.same_state(replay(image, [change]))
        assert [p.tp for p in one_by_one.offline_partitions()] == [("t", 1)]

    def test_records_of_a_subclass_replay_as_their_base_one_by_one(self) -> None:
        # A subclass (a newer record version) is not a run of the base type: it takes the
        # one-record handlers, and replays exactly as the base records would.
        class NewerPartition(PartitionRecord, tag="NewerPartition"):
            pass

        class NewerChange(PartitionChangeRecord, tag="NewerChange"):
            pass

        base = self.cluster()
        new = PartitionRecord(topic="t", partition=5, replicas=[1], isr=[1], leader=1)
        change = PartitionChangeRecord(
            topic="t", partition=1, reason=ChangeReason.FENCE, partition_epoch=1,
            leader_epoch=1, leader=NO_LEADER, isr=[],
        )  # fmt: skip
        newer = [
            NewerPartition(**msgspec.structs.asdict(new)),
            NewerChange(**msgspec.structs.asdict(change)),
        ]
        assert replay(base, newer).same_state(replay(base, [new, change]))

    def test_partition_records_out_of_order_fill_the_holes_they_leave(self) -> None:
        records: list[MetadataRecord] = [
            TopicRecord(name="t", topic_id="t", partitions=CHUNK + 3, min_isr=1)
        ]
        order = [CHUNK + 2, 3, 0, CHUNK, 1, 2, CHUNK + 1, *range(4, CHUNK)]
        parts = {
            i: PartitionRecord(topic="t", partition=i, replicas=[1], isr=[1], leader=1)
            for i in order
        }
        shuffled = replay(ClusterImage(), records + [parts[i] for i in order])
        in_order = replay(ClusterImage(), records + [parts[i] for i in sorted(order)])
        assert shuffled.same_state(in_order)
        assert len(shuffled.partitions) == CHUNK + 3 == len(in_order.partitions)

    def test_a_partition_created_again_with_a_leader_is_online(self) -> None:
        again = PartitionRecord(topic="t", partition=0, replicas=[1], isr=[1], leader=1)
        image = replay(self.cluster(), [msgspec.structs.replace(again, leader=NO_LEADER)])
        assert [p.tp for p in image.offline_partitions()] == [("t", 0)]
        assert list(replay(image, [again]).offline_partitions()) == []

    def cluster(self, hole: int | None = 5) -> ClusterImage:
        records: list[MetadataRecord] = [
            TopicRecord(name="t", topic_id="t", partitions=CHUNK + 2, min_isr=1)
        ]
        records += [
            PartitionRecord(topic="t", partition=i, replicas=[1], isr=[1], leader=1)
            for i in range(CHUNK + 2)
            if i != hole
        ]
        return replay(ClusterImage(), records)

    @pytest.mark.parametrize("missing", [5, CHUNK + 2, 3 * CHUNK, -1])
    def test_an_unknown_partition_inside_a_run_is_refused(self, missing: int) -> None:
        # In a hole of a chunk, past a chunk's end, in a chunk that does not exist.
        def change(i: int) -> PartitionChangeRecord:
            return PartitionChangeRecord(
                topic="t", partition=i, reason=ChangeReason.FENCE, partition_epoch=1,
                leader_epoch=0, isr=[],
            )  # fmt: skip

        with pytest.raises(ReplayError, match=f"unknown partition t-{missing}"):
            replay(self.cluster(), [change(0), change(CHUNK + 1), change(missing), change(1)])

    def test_a_run_changes_exactly_its_partitions(self) -> None:
        image = self.cluster()
        changes = [
            PartitionChangeRecord(
                topic="t", partition=i, reason=ChangeReason.FENCE, partition_epoch=1,
                leader_epoch=0, isr=[],
            )
            for i in (CHUNK + 1, 0, 7, CHUNK)
        ]  # fmt: skip
        after = replay(image, changes)
        for tp, p in after.partitions.items():
            touched = tp[1] in (CHUNK + 1, 0, 7, CHUNK)
            assert p.isr == (frozenset() if touched else frozenset({1}))
            assert p.partition_epoch == (1 if touched else 0)
        assert all(p.isr == frozenset({1}) for p in image.partitions.values())
