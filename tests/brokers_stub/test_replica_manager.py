"""The replica manager, driven directly: a leader and followers wired in memory.

No sockets: a follower's fetch is `leader.handle_fetch(...)` and the answer goes to
`follower.apply_fetch_response(...)`; a produced batch is `leader.data.produce(...)`;
AlterPartition goes to a recording fake. Time is an explicit virtual clock.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from brokers_stub import replica_log as rl
from brokers_stub.leader import MAX_ALTER_BYTES, MAX_ALTER_ITEMS, LeaderState, alter_item_bytes
from brokers_stub.logctx import BrokerLog
from brokers_stub.replica_log import ReplicaLog
from brokers_stub.replica_manager import ReplicaManager
from brokers_stub.storage import REPLICAS_DIR
from metactl.errors import (
    InvalidUpdateVersionError,
    MetactlError,
    NetworkError,
    NotControllerError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)
from metadata_image.image import ClusterImage
from protocol.codec import DEFAULT_MAX_FRAME_BYTES, encode_frame
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitionResult,
    AlterPartitions,
    AlterPartitionsResponse,
    IsrMember,
    PartitionView,
    ReplicaRef,
)
from protocol.messages.data import ACKS_LEADER, ProduceRequest, ProduceResponse
from protocol.messages.replication import ReplicaFetchRequest
from protocol.messages.unions import Message
from tests.brokers_stub.helpers import TOPIC, change, cluster, config, eventually

TP = (TOPIC, 0)
EPOCHS = {1: 100, 2: 200, 3: 300}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class FakeController:
    """Records the AlterPartition items of each batched request (`requests`, flattened)
    and answers each item with the next scripted outcome: None accepts it, a MetactlError
    refuses it, a NetworkError fails the whole request."""

    def __init__(self) -> None:
        self.requests: list[AlterPartition] = []
        self.batches: list[AlterPartitions] = []
        self.outcomes: list[MetactlError | None] = []
        self.gate: asyncio.Event | None = None  # when set: answer only once it opens
        self.received = asyncio.Event()

    async def request(self, body: Message, timeout_s: float) -> Message:
        assert isinstance(body, AlterPartitions)
        self.batches.append(body)
        self.requests.extend(body.items)
        self.received.set()
        if self.gate is not None:
            await self.gate.wait()
        results: list[AlterPartitionResult] = []
        for item in body.items:
            outcome = self.outcomes.pop(0) if self.outcomes else None
            if isinstance(outcome, NetworkError):
                raise outcome
            if outcome is not None:
                results.append(
                    AlterPartitionResult(
                        topic=item.topic,
                        partition=item.partition,
                        error_code=outcome.code,
                        message=outcome.message,
                    )
                )
                continue
            view = PartitionView(
                topic=item.topic,
                partition=item.partition,
                leader=item.leader,
                leader_epoch=item.leader_epoch or 0,
                partition_epoch=item.partition_epoch + 1,
                isr=[m.broker_id for m in item.isr],
            )
            results.append(
                AlterPartitionResult(topic=item.topic, partition=item.partition, view=view)
            )
        return AlterPartitionsResponse(results=results)


def manager(
    tmp_path: Path,
    broker_id: int,
    clock: Clock,
    controller: FakeController | None = None,
    **kw: object,
) -> ReplicaManager:
    cfg = config(tmp_path / f"b{broker_id}", broker_id, **kw)
    m = ReplicaManager(
        cfg,
        BrokerLog(broker_id),
        broker_epoch=lambda: EPOCHS[broker_id],
        controller=controller,  # type: ignore[arg-type]
        clock_ms=clock,
    )
    m.load(lose_unflushed=False)
    return m


def fetch(leader: ReplicaManager, follower: ReplicaManager) -> None:
    log = follower.logs[TP]
    sent = log.log_end_offset
    resp = leader.handle_fetch(
        ReplicaFetchRequest(
            topic=TOPIC,
            partition=0,
            follower_id=follower.broker_id,
            follower_broker_epoch=EPOCHS[follower.broker_id],
            fetch_offset=sent,
            last_fetched_epoch=log.last_fetched_epoch,
        )
    )
    follower.apply_fetch_response(TP, sent, resp)


async def produce(m: ReplicaManager, count: int, acks: int = ACKS_LEADER) -> ProduceResponse:
    """A client's batch of `count` records (acks=1 by default: answered at append)."""
    return await m.data.produce(ProduceRequest(topic=TOPIC, partition=0, acks=acks, count=count))


def on_disk(m: ReplicaManager) -> ReplicaLog:
    (log,), _ = rl.load_all(m.replicas_dir)
    return log


async def test_leader_appends_its_epoch_produces_and_persists(tmp_path: Path) -> None:
    clock = Clock()
    leader = manager(tmp_path, 1, clock)
    image = cluster(EPOCHS, replicas=[1, 2, 3], leader=1, isr=[1], leader_epoch=4)
    leader.on_metadata(image, None, True)
    assert leader.logs[TP].leader_epochs == [(4, 0)]
    leader.tick(clock.now)
    assert leader.logs[TP].log_end_offset == 0  # the log grows only through Produce
    first = await produce(leader, 15)
    assert (first.base_offset, first.count, first.leader_epoch) == (0, 15, 4)
    second = await produce(leader, 1)
    assert second.base_offset == 15
    log = leader.logs[TP]
    assert log.log_end_offset == 16
    assert log.high_watermark == 16  # ISR {1} and min ISR 1
    assert on_disk(leader).log_end_offset == 16
    assert on_disk(leader).flushed_offset == 0  # page cache only, so far
    leader.flush_changed()
    assert on_disk(leader).flushed_offset == 16


def test_nothing_happens_before_the_image_is_caught_up(tmp_path: Path) -> None:
    clock = Clock()
    leader = manager(tmp_path, 1, clock)
    image = cluster(EPOCHS, replicas=[1, 2, 3], leader=1, isr=[1], leader_epoch=4)
    leader.on_metadata(image, None, False)
    assert leader.logs[TP].leader_epochs == []  # the replica exists, but nothing is led
    assert leader.leaders == {}
    follower = manager(tmp_path, 2, clock)
    follower.on_metadata(image, None, False)
    with pytest.raises(NotLeaderOrFollowerError):
        fetch(leader, follower)


async def test_followers_copy_and_hw_needs_every_isr_member(tmp_path: Path) -> None:
    clock = Clock()
    leader = manager(tmp_path, 1, clock)
    f2, f3 = manager(tmp_path, 2, clock), manager(tmp_path, 3, clock)
    image = cluster(EPOCHS, replicas=[1, 2, 3], leader=1, isr=[1, 2, 3], min_isr=2)
    for m in (leader, f2, f3):
        m.on_metadata(image, None, True)
    await produce(leader, 10)  # LEO 10
    assert leader.logs[TP].high_watermark == 0  # 2 and 3 have not fetched yet
    fetch(leader, f2)
    assert f2.logs[TP].log_end_offset == 10
    assert f2.logs[TP].leader_epochs == [(0, 0)]
    fetch(leader, f3)
    fetch(leader, f2)
    fetch(leader, f3)
    assert leader.logs[TP].high_watermark == 10
    fetch(leader, f2)  # and the followers learn it on their next fetch
    assert f2.logs[TP].high_watermark == 10


async def test_hw_stops_when_the_isr_shrinks_below_min_isr(tmp_path: Path) -> None:
    clock = Clock()
    leader = manager(tmp_path, 1, clock)
    image = cluster(EPOCHS, replicas=[1, 2, 3], leader=1, isr=[1, 2], min_isr=2)
    f2 = manager(tmp_path, 2, clock)
    leader.on_metadata(image, None, True)
    f2.on_metadata(image, None, True)
    await produce(leader, 10)
    fetch(leader, f2)
    fetch(leader, f2)
    assert leader.logs[TP].high_watermark == 10
    image = change(image, isr=[1])  # 2 left the ISR: below min ISR
    leader.on_metadata(image, None, True)
    await produce(leader, 10)  # acks=1 is still accepted
    leader.tick(clock.now)
    assert leader.logs[TP].log_end_offset == 20
    assert leader.logs[TP].high_watermark == 10  # frozen


async def test_a_diverged_follower_truncates_then_copies(tmp_path: Path) -> None:
    clock = Clock()
    # Broker 2 led epoch 0 to offset 12 but only 0..7 reached broker 1, now leader of
    # epoch 1 from offset 8.
    f2 = manager(tmp_path, 2, clock)
    f2.logs[TP] = ReplicaLog(topic=TOPIC, partition=0, leader_epochs=[(0, 0)], log_end_offset=12)
    leader = manager(tmp_path, 1, clock)
    leader.logs[TP] = ReplicaLog(topic=TOPIC, partition=0, leader_epochs=[(0, 0)], log_end_offset=8)
    image = cluster(EPOCHS, replicas=[1, 2], leader=1, isr=[1], leader_epoch=1)
    leader.on_metadata(image, None, True)
    f2.on_metadata(image, None, True)
    await produce(leader, 20)  # epoch 1 holds 8..27
    assert leader.logs[TP].leader_epochs == [(0, 0), (1, 8)]
    fetch(leader, f2)
    assert f2.logs[TP].log_end_offset == 8  # the 4 records of epoch 0 nobody else has
    assert on_disk(f2).log_end_offset == 8
    fetch(leader, f2)
    assert f2.logs[TP].log_end_offset == 28
    assert f2.logs[TP].leader_epochs == [(0, 0), (1, 8)]


def test_fetch_refusals(tmp_path: Path) -> None:
    clock = Clock()
    follower = manager(tmp_path, 1, clock)
    image = cluster(EPOCHS, replicas=[1, 2, 3], leader=2, isr=[1, 2])
    follower.on_metadata(image, None, True)
    req = ReplicaFetchRequest(
        topic=TOPIC,
        partition=0,
        follower_id=3,
        follower_broker_epoch=300,
        fetch_offset=0,
        last_fetched_epoch=-1,
    )
    with pytest.raises(NotLeaderOrFollowerError):
        follower.handle_fetch(req)
    with pytest.raises(UnknownTopicOrPartitionError):
        follower.handle_fetch(
            ReplicaFetchRequest(
                topic="nope",
                partition=0,
                follower_id=3,
                follower_broker_epoch=300,
                fetch_offset=0,
                last_fetched_epoch=-1,
            )
        )


def test_log_info_reports_each_replica(tmp_path: Path) -> None:
    clock = Clock()
    m = manager(tmp_path, 1, clock)
    m.logs[TP] = ReplicaLog(
        topic=TOPIC, partition=0, leader_epochs=[(0, 0), (3, 9)], log_end_offset=11
    )
    entries = m.log_info([ReplicaRef(TOPIC, 0), ReplicaRef(TOPIC, 1)])
    assert (entries[0].last_leader_epoch, entries[0].log_end_offset) == (3, 11)
    assert entries[0].error_code is None
    assert entries[1].error_code == "UNKNOWN_TOPIC_OR_PARTITION"


def test_load_with_lose_unflushed(tmp_path: Path) -> None:
    clock = Clock()
    replicas = tmp_path / "b1" / REPLICAS_DIR
    replicas.mkdir(parents=True)
    rl.save(
        ReplicaLog(
            topic=TOPIC,
            partition=0,
            leader_epochs=[(0, 0), (2, 30)],
            log_end_offset=40,
            high_watermark=35,
            flushed_offset=25,
        ),
        replicas,
    )
    m = manager(tmp_path, 1, clock, lose_unflushed=True)  # load() keeps it all
    assert m.logs[TP].log_end_offset == 40
    m.load(lose_unflushed=True)
    log = m.logs[TP]
    assert (log.log_end_offset, log.leader_epochs, log.high_watermark) == (25, [(0, 0)], 25)
    assert on_disk(m) == log  # the loss is durable: a second start sees the same


def alter_setup(
    tmp_path: Path, *, isr: list[int], recovering: bool = False
) -> tuple[Clock, FakeController, ReplicaManager, ClusterImage]:
    clock = Clock()
    ctl = FakeController()
    leader = manager(tmp_path, 1, clock, ctl, replica_lag_time_max_ms=3000)
    image = cluster(EPOCHS, replicas=[1, 2, 3], leader=1, isr=isr, min_isr=2, recovering=recovering)
    return clock, ctl, leader, image


async def test_isr_expands_once_a_follower_caught_up(tmp_path: Path) -> None:
    clock, ctl, leader, image = alter_setup(tmp_path, isr=[1, 2])
    f3 = manager(tmp_path, 3, clock)
    leader.on_metadata(image, None, True)
    f3.on_metadata(image, None, True)
    await produce(leader, 10)
    leader.tick(clock.now)
    fetch(leader, f3)  # from 0, leader at 10: behind
    await leader.isr_updater.settled()  # any AlterPartition decided on has been sent
    assert ctl.requests == []
    clock.now += 100
    await produce(leader, 10)
    leader.tick(clock.now)
    fetch(leader, f3)  # holds the 10 we had at its previous fetch: caught up
    await leader.isr_updater.settled()
    assert len(ctl.requests) == 1
    req = ctl.requests[0]
    assert [(m.broker_id, m.broker_epoch) for m in req.isr] == [(1, 100), (2, 200), (3, 300)]
    assert (req.leader, req.broker_epoch, req.partition_epoch, req.leader_epoch) == (1, 100, 0, 0)
    # Accepted: nothing more is sent until the image shows the change.
    assert not leader.leaders[TP].alter_in_flight
    fetch(leader, f3)
    await leader.isr_updater.settled()
    assert len(ctl.requests) == 1
    leader.on_metadata(change(image, isr=[1, 2, 3]), None, True)
    fetch(leader, f3)
    await leader.isr_updater.settled()
    assert len(ctl.requests) == 1  # nothing left to change


async def test_an_isr_addition_in_flight_holds_the_high_watermark(tmp_path: Path) -> None:
    # Kafka's maximal ISR: the controller may commit the addition before its answer
    # arrives, so the proposed member must hold everything the HW covers from the moment
    # the request leaves. Otherwise the new member could be elected cleanly while missing
    # records acknowledged with the old ISR.
    clock, ctl, leader, image = alter_setup(tmp_path, isr=[1, 2])
    f2, f3 = manager(tmp_path, 2, clock), manager(tmp_path, 3, clock)
    for m in (leader, f2, f3):
        m.on_metadata(image, None, True)
    ctl.gate = asyncio.Event()
    await produce(leader, 10)
    fetch(leader, f3)
    clock.now += 100
    await produce(leader, 10)
    fetch(leader, f2)
    fetch(leader, f3)  # caught up, at 10
    await ctl.received.wait()  # the AlterPartition adding 3 is in flight
    assert [m.broker_id for m in ctl.requests[0].isr] == [1, 2, 3]
    fetch(leader, f2)  # 2 holds all 20: with ISR {1, 2} alone the HW would be 20
    assert leader.logs[TP].high_watermark == 10  # 3 is at 10
    ctl.gate.set()
    await leader.isr_updater.settled()
    fetch(leader, f3)  # now holds 20
    fetch(leader, f2)
    assert leader.logs[TP].high_watermark == 20


async def test_isr_shrinks_a_follower_that_stopped_fetching(tmp_path: Path) -> None:
    clock, ctl, leader, image = alter_setup(tmp_path, isr=[1, 2, 3])
    f2, f3 = manager(tmp_path, 2, clock), manager(tmp_path, 3, clock)
    for m in (leader, f2, f3):
        m.on_metadata(image, None, True)
    for _ in range(40):  # 4 s: 2 keeps fetching, 3 is silent
        clock.now += 100
        await produce(leader, 10)
        leader.tick(clock.now)
        fetch(leader, f2)
    await eventually(lambda: len(ctl.requests) == 1, what="an AlterPartition")
    assert [m.broker_id for m in ctl.requests[0].isr] == [1, 2]


async def test_refused_alter_partition_waits_for_new_metadata(tmp_path: Path) -> None:
    clock, ctl, leader, image = alter_setup(tmp_path, isr=[1, 2, 3])
    ctl.outcomes = [InvalidUpdateVersionError("stale")]
    leader.on_metadata(image, None, True)
    clock.now += 3001  # neither 2 nor 3 has been caught up for the lag time
    leader.tick(clock.now)
    await leader.isr_updater.settled()
    assert len(ctl.requests) == 1 and not leader.leaders[TP].alter_in_flight
    leader.tick(clock.now)
    await leader.isr_updater.settled()
    assert len(ctl.requests) == 1  # same partition epoch: wait
    image = change(image, isr=[1, 2, 3])  # something else changed it (epoch 0 -> 1)
    leader.on_metadata(image, None, True)
    await eventually(lambda: len(ctl.requests) == 2, what="a retry with the new epoch")
    assert ctl.requests[1].partition_epoch == 1


@pytest.mark.parametrize(
    "outcome",
    [
        InvalidUpdateVersionError("stale: maybe this very change, committed by an earlier try"),
        NotControllerError("the pieces after the first were not committed"),
        NetworkError("no answer"),
    ],
)
async def test_an_addition_whose_outcome_is_unknown_keeps_holding_the_high_watermark(
    tmp_path: Path, outcome: MetactlError
) -> None:
    # The controller commits a batch piece by piece: an item answered with a retriable
    # error, a whole request that failed, or INVALID_UPDATE_VERSION (a resend after
    # NOT_CONTROLLER finds its own committed change) may each be committed. Until the
    # image moves past the epoch proposed against, the proposed member keeps counting.
    clock, ctl, leader, image = alter_setup(tmp_path, isr=[1, 2])
    f2, f3 = manager(tmp_path, 2, clock), manager(tmp_path, 3, clock)
    for m in (leader, f2, f3):
        m.on_metadata(image, None, True)
    ctl.outcomes = [outcome]
    await produce(leader, 10)
    fetch(leader, f3)
    clock.now += 100
    await produce(leader, 10)
    fetch(leader, f2)
    fetch(leader, f3)  # caught up at 10: the addition of 3 is proposed
    await leader.isr_updater.settled()
    assert [m.broker_id for m in ctl.requests[0].isr] == [1, 2, 3]
    st = leader.leaders[TP]
    assert not st.alter_in_flight and st.accepted_isr == frozenset({1, 2, 3})
    fetch(leader, f2)  # 2 holds all 20: the ISR {1, 2} alone would put the HW at 20
    assert leader.logs[TP].high_watermark == 10  # 3, proposed, is at 10
    leader.on_metadata(change(image, isr=[1, 2]), None, True)  # epoch 1: the outcome shows
    assert st.accepted_isr is None


async def test_a_batch_leaves_out_ended_leaderships_and_older_items(tmp_path: Path) -> None:
    _, _, leader, _ = alter_setup(tmp_path, isr=[1, 2, 3])
    updater = leader.isr_updater
    req = ctl_item(partition=0, epoch=0)
    ended, old, new, other = (LeaderState(leader_epoch=e) for e in (0, 1, 2, 2))
    ended.end()
    for st, item in (
        (ended, req), (old, ctl_item(1, 3)), (new, ctl_item(1, 4)), (other, ctl_item(2, 0))
    ):  # fmt: skip
        st.in_flight_isr = frozenset({1})
        updater._queue.append((st, item, [1]))
    batch = updater._next_batch()
    assert [(r.partition, r.partition_epoch) for _, r, _ in batch] == [(1, 4), (2, 0)]
    assert not ended.alter_in_flight and not old.alter_in_flight  # dropped, free again
    assert new.alter_in_flight and other.alter_in_flight
    assert not updater._queue


def test_a_batch_stays_inside_the_frame_limit_whatever_its_items(tmp_path: Path) -> None:
    # Items of a 249-character topic with a 200-member ISR: MAX_ALTER_ITEMS of them would
    # be about 35 MB. The estimate bounds each item's real encoding, so the batch, cut by
    # it, encodes inside MAX_ALTER_BYTES and one frame.
    _, _, leader, _ = alter_setup(tmp_path, isr=[1, 2, 3])
    updater = leader.isr_updater
    wide = [IsrMember(broker_id=b, broker_epoch=2**40 + b) for b in range(200)]
    for i in range(MAX_ALTER_ITEMS):
        item = AlterPartition(
            topic="t" * 249, partition=i, leader=1, broker_epoch=2**40, partition_epoch=2**33,
            isr=wide, leader_epoch=2**33,
        )  # fmt: skip
        updater._queue.append((LeaderState(leader_epoch=0), item, [1]))
    first = updater._next_batch()
    items = [r for _, r, _ in first]
    assert all(len(encode_frame(0, r)) <= alter_item_bytes(r) for r in items[:3])
    encoded = len(encode_frame(0, AlterPartitions(items=items)))
    assert 0 < encoded <= MAX_ALTER_BYTES < DEFAULT_MAX_FRAME_BYTES
    assert len(items) < MAX_ALTER_ITEMS and len(updater._queue) == MAX_ALTER_ITEMS - len(items)


def ctl_item(partition: int, epoch: int) -> AlterPartition:
    return AlterPartition(
        topic=TOPIC, partition=partition, leader=1, broker_epoch=EPOCHS[1],
        partition_epoch=epoch, isr=[IsrMember(broker_id=1, broker_epoch=EPOCHS[1])],
    )  # fmt: skip


async def test_a_recovering_leader_reports_recovery_at_once(tmp_path: Path) -> None:
    _, ctl, leader, image = alter_setup(tmp_path, isr=[1], recovering=True)
    leader.on_metadata(image, None, True)
    await eventually(lambda: len(ctl.requests) == 1, what="an AlterPartition")
    req = ctl.requests[0]
    assert req.recovered
    assert [m.broker_id for m in req.isr] == [1]


def test_a_broker_acts_only_on_the_partitions_in_the_delta(tmp_path: Path) -> None:
    from metadata_image.delta import MetadataDelta

    clock = Clock()
    m = manager(tmp_path, 1, clock)
    led_by_2 = cluster(EPOCHS, replicas=[1, 2, 3], leader=2, isr=[1, 2, 3])
    m.on_metadata(led_by_2, None, True)  # a whole image: every partition is looked at
    assert TP not in m.leaders
    now_ours = change(led_by_2, leader=1)
    # A delta that does not name orders-0 (nor a broker sharing it) changes nothing here.
    m.on_metadata(now_ours, MetadataDelta(), True)
    assert TP not in m.leaders
    # Deltas seen while catching up are folded and acted on once caught up.
    named = MetadataDelta()
    named.partitions.add(TP)
    m.on_metadata(now_ours, named, False)
    assert TP not in m.leaders
    m.on_metadata(now_ours, MetadataDelta(), True)
    assert m.leaders[TP].leader_epoch == now_ours.partitions[TP].leader_epoch
    # A change of a broker sharing the partition brings it into scope too.
    back_to_2 = change(now_ours, leader=2)
    peer = MetadataDelta()
    peer.brokers.add(3)
    m.on_metadata(back_to_2, peer, True)
    assert TP not in m.leaders
