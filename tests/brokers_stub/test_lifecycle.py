"""The brokers follow the metadata lifecycle (issue 19): topic deletion, a topic created
again under the same name (a new topic id), reassignment, added partitions and MinISR
changes.

Most tests drive replica managers wired in memory, as test_replica_manager does: a fetch
is a direct call, each metadata change is the image and `MetadataDelta` that replaying
the controller's records gives (`metadata_image.replay.apply`), time is a virtual
clock. The last ones run real `Broker`s against the scripted fake controller, over
sockets: the metadata follower's deltas and the follower fetchers are the real ones.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from brokers_stub import replica_log as rl
from brokers_stub.logctx import BrokerLog
from brokers_stub.replica_log import ReplicaLog
from brokers_stub.replica_manager import ReplicaManager
from brokers_stub.storage import REPLICAS_DIR
from metactl.errors import (
    InconsistentTopicIdError,
    NotEnoughReplicasAfterAppendError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from metadata_image.replay import apply
from metadata_image.state import TopicPartition
from metadata_log.records import (
    ChangeReason,
    ClearElrRecord,
    MetadataRecord,
    PartitionChangeRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)
from protocol.client import RpcClient
from protocol.messages.broker_controller import ReplicaRef
from protocol.messages.data import (
    ACKS_ALL,
    ACKS_LEADER,
    ProduceRequest,
    ProduceResponse,
    ReadLogRequest,
    ReadLogResponse,
)
from protocol.messages.replication import ReplicaFetchRequest
from tests.brokers_stub.fake_controller import FakeController
from tests.brokers_stub.helpers import TOPIC, Running, broker_config, config, eventually
from tests.brokers_stub.test_replica_manager import Clock
from tests.brokers_stub.test_replica_manager import FakeController as AlterPartitions

TP: TopicPartition = (TOPIC, 0)
EPOCHS = {1: 100, 2: 200, 3: 300, 4: 400}
OLD_ID, NEW_ID = "id-old", "id-new"


# --- wiring ----------------------------------------------------------------------------


def manager(
    tmp_path: Path, broker_id: int, clock: Clock, controller: AlterPartitions | None = None
) -> ReplicaManager:
    """A replica manager on `tmp_path/b<id>`, loading what is on disk there (a restart)."""
    m = ReplicaManager(
        config(tmp_path / f"b{broker_id}", broker_id),
        BrokerLog(broker_id),
        broker_epoch=lambda: EPOCHS[broker_id],
        controller=controller,  # type: ignore[arg-type]
        clock_ms=clock,
    )
    m.load(lose_unflushed=False)
    return m


def registrations() -> list[MetadataRecord]:
    return [
        RegisterBrokerRecord(
            broker_id=b,
            incarnation_id=f"inc-{b}",
            broker_epoch=e,
            endpoint=f"127.0.0.1:{b}",
            fenced=False,
        )
        for b, e in EPOCHS.items()
    ]


def topic(
    topic_id: str,
    replicas: Sequence[int],
    isr: Sequence[int],
    *,
    min_isr: int = 1,
    n: int = 1,
    leader_epoch: int = 0,
) -> list[MetadataRecord]:
    """A topic of `n` partitions, each on `replicas`, led by the first of the ISR."""
    return [
        TopicRecord(name=TOPIC, topic_id=topic_id, partitions=n, min_isr=min_isr),
        *(
            PartitionRecord(
                topic=TOPIC,
                partition=i,
                replicas=list(replicas),
                isr=sorted(isr),
                leader=isr[0],
                leader_epoch=leader_epoch,
                min_isr=min(min_isr, len(replicas)),
            )
            for i in range(n)
        ),
    ]


def delete(image: ClusterImage) -> RemoveTopicRecord:
    return RemoveTopicRecord(topic_id=image.topics[TOPIC].topic_id, name=TOPIC)


def changed(image: ClusterImage, *, tp: TopicPartition = TP, **kw: Any) -> PartitionChangeRecord:
    """A PartitionChangeRecord on `tp` with the epochs bumped as the controller does."""
    p = image.partitions[tp]
    new_leader = kw.get("leader") not in (None, p.leader)
    return PartitionChangeRecord(
        topic=tp[0],
        partition=tp[1],
        reason=ChangeReason.REASSIGNMENT,
        partition_epoch=p.partition_epoch + 1,
        leader_epoch=p.leader_epoch + (1 if new_leader else 0),
        **kw,
    )


class Cluster:
    """Replica managers that all see every metadata change, caught up."""

    def __init__(self, ms: Sequence[ReplicaManager], records: list[MetadataRecord]) -> None:
        self.ms = {m.broker_id: m for m in ms}
        self.image, _ = apply(ClusterImage(), registrations() + records)
        for m in ms:
            m.on_metadata(self.image, None, True)

    def step(self, *records: MetadataRecord) -> ClusterImage:
        self.image, delta = apply(self.image, records)
        for m in self.ms.values():
            m.on_metadata(self.image, delta, True)
        return self.image


def fetch(leader: ReplicaManager, follower: ReplicaManager, tp: TopicPartition = TP) -> bool:
    log = follower.logs[tp]
    sent = log.log_end_offset
    resp = leader.handle_fetch(
        ReplicaFetchRequest(
            topic=tp[0],
            partition=tp[1],
            follower_id=follower.broker_id,
            follower_broker_epoch=EPOCHS[follower.broker_id],
            fetch_offset=sent,
            last_fetched_epoch=log.last_fetched_epoch,
        )
    )
    return follower.apply_fetch_response(tp, sent, resp, fetched_for=log)


def first_fetch(follower_id: int, tp: TopicPartition = TP) -> ReplicaFetchRequest:
    """A follower's fetch from an empty log."""
    return ReplicaFetchRequest(
        topic=tp[0],
        partition=tp[1],
        follower_id=follower_id,
        follower_broker_epoch=EPOCHS[follower_id],
        fetch_offset=0,
        last_fetched_epoch=-1,
    )


def produce(tp: TopicPartition = TP, count: int = 5, acks: int = ACKS_LEADER) -> ProduceRequest:
    return ProduceRequest(topic=tp[0], partition=tp[1], acks=acks, count=count)


async def waiting(m: ReplicaManager, n: int = 1) -> None:
    """Let the loop run until `n` acks=all batches wait on the high watermark."""
    for _ in range(100):
        if m.data.waiters.pending(TP) >= n:
            return
        await asyncio.sleep(0)  # one turn of the loop, not a delay
    raise AssertionError(f"{n} batch(es) never started waiting")


def files(m: ReplicaManager) -> dict[str, ReplicaLog]:
    logs, problems = rl.load_all(m.replicas_dir)
    assert problems == []
    return {log.name: log for log in logs}


# --- delete ------------------------------------------------------------------------------


async def test_a_deleted_topic_is_refused_and_its_data_deleted(tmp_path: Path) -> None:
    clock = Clock()
    leader, f2, f3 = (manager(tmp_path, b, clock) for b in (1, 2, 3))
    c = Cluster([leader, f2, f3], topic(OLD_ID, [1, 2, 3], [1, 2, 3], min_isr=2))
    await leader.data.produce(produce(count=5))
    fetch(leader, f2)
    assert f2.logs[TP].log_end_offset == 5
    assert set(files(f2)) == {"orders-0"}
    waiter = asyncio.create_task(leader.data.produce(produce(count=3, acks=ACKS_ALL)))
    await waiting(leader)  # 3 has not fetched: it cannot commit
    fetch(leader, f2)  # 2 now holds all 8
    follow = ReplicaFetchRequest(
        topic=TOPIC,
        partition=0,
        follower_id=2,
        follower_broker_epoch=EPOCHS[2],
        fetch_offset=8,
        last_fetched_epoch=0,
    )
    await leader.fetch(follow)  # the leader has sent 2 its high watermark
    parked = asyncio.create_task(leader.fetch(msgspec.structs.replace(follow, max_wait_ms=60_000)))
    st = leader.leaders[TP]
    for _ in range(100):
        if st.parked:
            break
        await asyncio.sleep(0)  # one turn of the loop, not a delay
    assert st.parked == 1  # nothing new for 2: the fetch is held

    c.step(delete(c.image))

    with pytest.raises(UnknownTopicOrPartitionError):
        await waiter  # never acknowledged: the topic went first
    with pytest.raises(NotLeaderOrFollowerError):
        await parked  # released at once, not after its wait
    for m in (leader, f2, f3):
        assert m.logs == {} and m.leaders == {}
        assert files(m) == {}  # the data is gone from disk
        assert list(m.followed_partitions(c.image)) == []  # nothing to fetch
    with pytest.raises(UnknownTopicOrPartitionError):
        await leader.data.produce(produce())
    with pytest.raises(UnknownTopicOrPartitionError):
        leader.data.read_log(ReadLogRequest(topic=TOPIC, partition=0))
    with pytest.raises(UnknownTopicOrPartitionError):
        leader.handle_fetch(first_fetch(2))
    (entry,) = leader.log_info([ReplicaRef(TOPIC, 0)])
    assert entry.error_code == UnknownTopicOrPartitionError.code


# --- created again ------------------------------------------------------------------------


async def test_a_topic_created_again_is_empty_and_never_serves_the_old_data(
    tmp_path: Path,
) -> None:
    clock = Clock()
    leader, f2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    c = Cluster([leader, f2], topic(OLD_ID, [1, 2], [1, 2], leader_epoch=3))
    await leader.data.produce(produce(count=9))
    fetch(leader, f2)
    assert f2.logs[TP].log_end_offset == 9
    in_flight = f2.logs[TP]

    # Deleted and created again in one delta (the same name, the same placement).
    c.step(delete(c.image), *topic(NEW_ID, [1, 2], [1, 2]))

    for m in (leader, f2):
        log = m.logs[TP]
        assert log is not in_flight
        assert (log.topic_id, log.log_end_offset, log.high_watermark) == (NEW_ID, 0, 0)
        assert files(m)["orders-0"].topic_id == NEW_ID
        assert files(m)["orders-0"].log_end_offset == 0
    assert leader.logs[TP].leader_epochs == [(0, 0)]  # the new topic's first epoch
    # An answer to a fetch made for the old replica is not applied to the new one.
    stale = leader.handle_fetch(first_fetch(2))
    assert not f2.apply_fetch_response(TP, 9, stale, fetched_for=in_flight)
    resp = await leader.data.produce(produce(count=2))
    assert (resp.base_offset, resp.leader_epoch) == (0, 0)
    r = leader.data.read_log(ReadLogRequest(topic=TOPIC, partition=0))
    assert r.log_end_offset == 2


async def test_a_broker_down_during_delete_and_create_deletes_its_stale_replica(
    tmp_path: Path,
) -> None:
    clock = Clock()
    leader, f2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    c = Cluster([leader, f2], topic(OLD_ID, [1, 2], [1, 2]))
    await leader.data.produce(produce(count=6))
    fetch(leader, f2)
    assert files(f2)["orders-0"].log_end_offset == 6
    old = c.image
    # Broker 2 is down while the topic is deleted and created again.
    del c.ms[2]
    c.step(delete(c.image), *topic(NEW_ID, [1, 2], [1, 2]))

    # It restarts: loads its files, then replays the controller's log from 0.
    back = manager(tmp_path, 2, clock)
    assert back.logs[TP].topic_id == OLD_ID  # on disk: the old topic's replica
    back.on_metadata(old, None, False)  # an older image: catching up, nothing acted on
    assert back.logs[TP].topic_id == OLD_ID and back.image is None
    # A snapshot of the latest state (so no delta names the delete): it holds the topic
    # under another id. Not caught up yet, the stale replica reports nothing ...
    back.on_metadata(c.image, None, False)
    assert back.logs[TP].topic_id == OLD_ID
    (entry,) = back.log_info([ReplicaRef(TOPIC, 0)])
    assert entry.error_code == UnknownTopicOrPartitionError.code
    # ... and once caught up it is deleted and replaced by an empty one of the new id.
    back.on_metadata(c.image, MetadataDelta(), True)
    log = back.logs[TP]
    assert (log.topic_id, log.log_end_offset, log.leader_epochs) == (NEW_ID, 0, [])
    assert files(back)["orders-0"].topic_id == NEW_ID
    (entry,) = back.log_info([ReplicaRef(TOPIC, 0)])
    assert (entry.error_code, entry.log_end_offset) == (None, 0)


async def test_replaying_the_old_topics_delete_keeps_the_new_topics_replica(
    tmp_path: Path,
) -> None:
    """A restarted broker replays the log from 0: the old topic's create and delete go
    by before the new topic's create. Its replica of the new topic must survive them."""
    clock = Clock()
    leader, f2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    c = Cluster([leader, f2], topic(OLD_ID, [1, 2], [1, 2]))
    c.step(delete(c.image), *topic(NEW_ID, [1, 2], [1, 2]))
    await leader.data.produce(produce(count=4))
    fetch(leader, f2)
    assert files(f2)["orders-0"].log_end_offset == 4

    back = manager(tmp_path, 2, clock)  # a restart: the new topic's replica on disk
    image, _ = apply(ClusterImage(), registrations() + topic(OLD_ID, [1, 2], [1, 2]))
    back.on_metadata(image, None, False)  # the old topic, not caught up
    image, delta = apply(image, [RemoveTopicRecord(topic_id=OLD_ID, name=TOPIC)])
    back.on_metadata(image, delta, False)  # its delete names the old id only
    assert back.logs[TP].log_end_offset == 4
    image, delta = apply(image, topic(NEW_ID, [1, 2], [1, 2]))
    back.on_metadata(image, delta, True)
    assert (back.logs[TP].topic_id, back.logs[TP].log_end_offset) == (NEW_ID, 4)
    assert files(back)["orders-0"].log_end_offset == 4


async def test_a_replica_of_a_topic_deleted_while_down_is_a_stray_and_goes(
    tmp_path: Path,
) -> None:
    clock = Clock()
    leader, f2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    c = Cluster([leader, f2], topic(OLD_ID, [1, 2], [1, 2], n=2))
    del c.ms[2]
    c.step(delete(c.image))
    back = manager(tmp_path, 2, clock)
    assert set(back.logs) == {(TOPIC, 0), (TOPIC, 1)}
    back.on_metadata(c.image, None, True)
    assert back.logs == {} and files(back) == {}


async def test_a_replica_without_a_recorded_id_takes_the_topics_unless_deleted(
    tmp_path: Path,
) -> None:
    """Files written before topic ids were recorded: adopted by the topic of that name
    on a caught-up image, deleted once a delta says that name was deleted."""
    clock = Clock()
    m = manager(tmp_path, 1, clock)
    m.replicas_dir.mkdir(parents=True, exist_ok=True)
    legacy = {"topic": TOPIC, "partition": 0, "leader_epochs": [[0, 0]], "log_end_offset": 3}
    (m.replicas_dir / "orders-0.json").write_text(json.dumps(legacy))  # no topic_id
    m = manager(tmp_path, 1, clock)
    assert m.logs[TP].topic_id == ""
    c = Cluster([m], topic(OLD_ID, [1], [1]))
    assert (m.logs[TP].topic_id, m.logs[TP].log_end_offset) == (OLD_ID, 3)
    assert files(m)["orders-0"].topic_id == OLD_ID

    m.logs[TP].topic_id = ""  # as if it had not been adopted yet
    c.step(delete(c.image), *topic(NEW_ID, [1], [1]))
    assert (m.logs[TP].topic_id, m.logs[TP].log_end_offset) == (NEW_ID, 0)


# --- reassignment ---------------------------------------------------------------------------


async def test_reassignment_copies_to_the_new_replica_and_deletes_the_removed_one(
    tmp_path: Path,
) -> None:
    clock = Clock()
    alter = AlterPartitions()
    ms = [manager(tmp_path, 1, clock, alter)] + [manager(tmp_path, b, clock) for b in (2, 3, 4)]
    b1, b2, b3, b4 = ms
    c = Cluster(ms, topic(OLD_ID, [1, 2, 3], [1, 2, 3], min_isr=2))
    await b1.data.produce(produce(count=10))
    for f in (b2, b3):
        fetch(b1, f)
        fetch(b1, f)
    assert b1.logs[TP].high_watermark == 10
    assert TP not in b4.logs

    # Move [1, 2, 3] -> [2, 3, 4]: replicas = target + removing, 4 adding, 1 removing.
    c.step(changed(c.image, replicas=[2, 3, 4, 1], adding_replicas=[4], removing_replicas=[1]))
    assert b4.logs[TP].topic_id == OLD_ID and b4.logs[TP].log_end_offset == 0
    assert [p.tp for p in b4.followed_partitions(c.image)] == [TP]  # it fetches from 1

    # 4 catching up does not count for the high watermark or acks=all before it is in
    # the ISR: with 2 and 3 silent, the batch waits however far 4 gets.
    batch = asyncio.create_task(b1.data.produce(produce(count=5, acks=ACKS_ALL)))
    await waiting(b1)
    while fetch(b1, b4):
        pass
    assert b4.logs[TP].log_end_offset == 15
    assert b4.logs[TP].leader_epochs == b1.logs[TP].leader_epochs
    assert b1.logs[TP].high_watermark == 10 and not batch.done()
    for f in (b2, b3):
        fetch(b1, f)
        fetch(b1, f)
    assert (await batch).high_watermark == 15

    # The ISR expands to 4 only through the leader's AlterPartition, under its rule
    # (caught up, and past the high watermark).
    b1.tick(clock.now)
    await b1.isr_updater.settled()
    assert [sorted(m.broker_id for m in r.isr) for r in alter.requests] == [[1, 2, 3, 4]]
    c.step(changed(c.image, isr=[1, 2, 3, 4]))

    # Completion: leadership moves off 1, then 1 leaves the replicas.
    c.step(changed(c.image, leader=2, isr=[2, 3, 4]))
    assert TP in b2.leaders and TP not in b1.leaders
    assert b1.logs[TP].log_end_offset == 15  # still a replica until the move completes
    c.step(changed(c.image, replicas=[2, 3, 4], adding_replicas=[], removing_replicas=[]))
    assert TP not in b1.logs and files(b1) == {}
    assert list(b1.followed_partitions(c.image)) == []
    with pytest.raises(NotLeaderOrFollowerError):
        await b1.data.produce(produce())
    for f in (b2, b3, b4):
        log = files(f)["orders-0"]
        assert (log.topic_id, log.log_end_offset) == (OLD_ID, 15)
    with pytest.raises(NotLeaderOrFollowerError):  # 1 is not a follower any more
        b2.handle_fetch(first_fetch(1))


async def test_a_removed_leader_fails_its_waiting_batches(tmp_path: Path) -> None:
    """Were a leader removed without being moved off first, its waiting batches fail
    with NOT_LEADER_OR_FOLLOWER: the partition lives on elsewhere."""
    clock = Clock()
    b1, b2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    c = Cluster([b1, b2], topic(OLD_ID, [1, 2], [1, 2]))
    batch = asyncio.create_task(b1.data.produce(produce(count=2, acks=ACKS_ALL)))
    await waiting(b1)
    c.step(changed(c.image, replicas=[2], leader=2, isr=[2]))
    with pytest.raises(NotLeaderOrFollowerError):
        await batch
    assert b1.logs == {} and files(b1) == {}


# --- add partitions, MinISR ---------------------------------------------------------------


async def test_added_partitions_are_created_led_and_followed(tmp_path: Path) -> None:
    clock = Clock()
    b1, b2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    c = Cluster([b1, b2], topic(OLD_ID, [1, 2], [1, 2]))
    grown = topic(OLD_ID, [2, 1], [2, 1], n=3)
    c.step(grown[0], *grown[2:])  # TopicRecord grown to 3, partitions 1 and 2
    for i in (1, 2):
        tp = (TOPIC, i)
        assert b1.logs[tp].topic_id == b2.logs[tp].topic_id == OLD_ID
        assert tp in b2.leaders
        await b2.data.produce(produce(tp, count=3))
        fetch(b2, b1, tp)
        assert b1.logs[tp].log_end_offset == 3
    assert set(files(b1)) == {"orders-0", "orders-1", "orders-2"}


async def test_a_min_isr_change_reaches_acks_all(tmp_path: Path) -> None:
    clock = Clock()
    b1, b2, b3 = (manager(tmp_path, b, clock) for b in (1, 2, 3))
    c = Cluster([b1, b2, b3], topic(OLD_ID, [1, 2, 3], [1, 2], min_isr=2))
    batch = asyncio.create_task(b1.data.produce(produce(count=3, acks=ACKS_ALL)))
    await waiting(b1)

    c.step(ClearElrRecord(topic=TOPIC, min_isr=3))  # kafka-configs: min.insync.replicas=3
    assert c.image.partitions[TP].min_isr == 3
    with pytest.raises(NotEnoughReplicasAfterAppendError):
        await batch  # the ISR {1, 2} is now below MinISR: it cannot be acknowledged
    with pytest.raises(NotEnoughReplicasError):
        await b1.data.produce(produce(acks=ACKS_ALL))
    fetch(b1, b2)
    fetch(b1, b2)
    assert b1.logs[TP].high_watermark == 0  # KIP-966: no commit below MinISR

    c.step(ClearElrRecord(topic=TOPIC, min_isr=5))  # above RF: capped at 3
    assert c.image.partitions[TP].min_isr == 3
    c.step(ClearElrRecord(topic=TOPIC, min_isr=2))
    assert b1.logs[TP].high_watermark == 3  # the batch commits now (unacknowledged)
    resp = await b1.data.produce(produce(count=1, acks=ACKS_LEADER))
    task = asyncio.create_task(b1.data.produce(produce(count=1, acks=ACKS_ALL)))
    await waiting(b1)
    fetch(b1, b2)
    fetch(b1, b2)
    assert (await task).high_watermark == resp.base_offset + 2


# --- real brokers against the fake controller ------------------------------------------------


async def test_brokers_follow_delete_reassignment_and_re_creation_over_the_wire(
    controller: FakeController, tmp_path: Path
) -> None:
    """Two real brokers: 1 leads orders-0 alone, then it is moved to 2 (which copies it
    over ReplicaFetch), then the topic is deleted while 2 is stopped and created again;
    2 restarts and deletes its stale replica instead of serving it."""
    controller.append(TopicRecord(name=TOPIC, topic_id=OLD_ID, partitions=1, min_isr=1))
    b1 = Running(broker_config(controller, tmp_path / "b1", broker_id=1))
    b2 = Running(broker_config(controller, tmp_path / "b2", broker_id=2))
    ready = await b1.await_ready()
    await b2.await_ready()
    controller.append(
        PartitionRecord(topic=TOPIC, partition=0, replicas=[1], isr=[1], leader=1, leader_epoch=1)
    )
    r1, r2 = b1.broker.replicas, b2.broker.replicas
    await eventually(lambda: TP in r1.leaders, what="1 leads")
    async with RpcClient(ready[3]) as client:
        resp = await client.request(produce(count=7, acks=ACKS_ALL))
    assert isinstance(resp, ProduceResponse) and resp.high_watermark == 7

    def change(**kw: Any) -> PartitionChangeRecord:
        return changed(controller.image, **kw)

    controller.append(change(replicas=[2, 1], adding_replicas=[2], removing_replicas=[1]))
    await eventually(
        lambda: TP in r2.logs and r2.logs[TP].log_end_offset == 7, what="2 copies the log"
    )
    assert r2.logs[TP].leader_epochs == [(1, 0)] and r2.logs[TP].topic_id == OLD_ID
    controller.append(change(leader=2, isr=[2]))
    controller.append(change(replicas=[2], adding_replicas=[], removing_replicas=[]))
    await eventually(lambda: TP not in r1.logs, what="1 deletes its replica")
    assert rl.load_all(tmp_path / "b1" / REPLICAS_DIR) == ([], [])
    await eventually(lambda: TP in r2.leaders, what="2 leads")
    assert r2.fetchers == {}  # it fetched from 1 while it was being added; no longer

    assert await b2.stop() == 0
    controller.append(RemoveTopicRecord(topic_id=OLD_ID, name=TOPIC))
    controller.append(TopicRecord(name=TOPIC, topic_id=NEW_ID, partitions=1, min_isr=1))
    controller.append(
        PartitionRecord(topic=TOPIC, partition=0, replicas=[2], isr=[2], leader=2, leader_epoch=0)
    )
    (stale,), _ = rl.load_all(tmp_path / "b2" / REPLICAS_DIR)
    assert (stale.topic_id, stale.log_end_offset) == (OLD_ID, 7)
    again = Running(broker_config(controller, tmp_path / "b2", broker_id=2))
    m = await again.await_ready()
    r2 = again.broker.replicas
    await eventually(lambda: TP in r2.leaders, what="2 leads the new topic")
    (log,), _ = rl.load_all(tmp_path / "b2" / REPLICAS_DIR)
    assert (log.topic_id, log.log_end_offset, log.leader_epochs) == (NEW_ID, 0, [(0, 0)])
    async with RpcClient(m[3]) as client:
        read = await client.request(ReadLogRequest(topic=TOPIC, partition=0))
    assert isinstance(read, ReadLogResponse) and read.log_end_offset == 0
    assert await again.stop() == 0
    assert await b1.stop() == 0


async def test_a_replica_removed_and_added_again_must_catch_up_anew(tmp_path: Path) -> None:
    """The leader forgets a removed follower's fetch state: that replica was deleted, so
    its last fetch (caught up) says nothing about the empty replica added back."""
    clock = Clock()
    alter = AlterPartitions()
    b1, b2, b3 = (
        manager(tmp_path, 1, clock, alter),
        manager(tmp_path, 2, clock),
        manager(tmp_path, 3, clock),
    )
    c = Cluster([b1, b2, b3], topic(OLD_ID, [1, 2, 3], [1, 2, 3]))
    await b1.data.produce(produce(count=4))
    for f in (b2, b3):
        fetch(b1, f)
        fetch(b1, f)
    assert b1.leaders[TP].followers[3].caught_up
    c.step(changed(c.image, replicas=[1, 2], isr=[1, 2]))
    assert TP not in b3.logs
    c.step(changed(c.image, replicas=[1, 2, 3], adding_replicas=[3], removing_replicas=[]))
    assert b3.logs[TP].log_end_offset == 0
    b1.tick(clock.now)
    await b1.isr_updater.settled()
    assert alter.requests == []  # not proposed on the strength of the deleted replica
    fetch(b1, b3)
    fetch(b1, b3)
    await b1.isr_updater.settled()
    assert [sorted(m.broker_id for m in r.isr) for r in alter.requests] == [[1, 2, 3]]


async def test_a_fetch_for_another_topic_id_is_refused(tmp_path: Path) -> None:
    """KIP-516: a follower whose replica is of the old topic (it has not applied the
    delete and re-create yet) must not copy the new topic's records, nor the reverse,
    even when both are at leader epoch 0."""
    clock = Clock()
    leader, f2 = manager(tmp_path, 1, clock), manager(tmp_path, 2, clock)
    Cluster([leader, f2], topic(NEW_ID, [1, 2], [1, 2]))
    await leader.data.produce(produce(count=3))
    stale = msgspec.structs.replace(first_fetch(2), topic_id=OLD_ID)
    with pytest.raises(InconsistentTopicIdError, match="topic id"):
        leader.handle_fetch(stale)
    same = msgspec.structs.replace(first_fetch(2), topic_id=NEW_ID)
    assert leader.handle_fetch(same).log_end_offset == 3
    unnamed = first_fetch(2)  # an older follower sends no id: unchecked, as before
    assert unnamed.topic_id == "" and leader.handle_fetch(unnamed).log_end_offset == 3
