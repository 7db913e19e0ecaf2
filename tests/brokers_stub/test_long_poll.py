"""Long-polled ReplicaFetch: the leader holds a fetch until it has news for the follower.

The leader side runs on replica managers wired in memory (as in test_replica_manager): a
fetch is a `leader.fetch(...)` task, "held" is observed on the partition's `LeaderState`
(`parked`), and an answer is an event awaited by letting the loop turn, never after a
sleep. The max wait is far longer than any test (WAIT), so an answer that comes sooner
came from a wake-up; the test of the max wait itself uses a short one. The acks=all test
runs two brokers over TCP with a fetch interval far longer than the test: only the long
poll can carry the batch and its high watermark in time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from brokers_stub.fetcher import Fetcher
from brokers_stub.leader import LeaderState
from brokers_stub.replica_manager import ReplicaManager
from metactl.errors import InvalidRequestError, NotLeaderOrFollowerError
from metadata_image.image import ClusterImage
from metadata_log.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
from protocol.client import RpcClient
from protocol.codec import decode_frame
from protocol.messages.data import ACKS_ALL, ProduceRequest, ProduceResponse
from protocol.messages.replication import ReplicaFetchRequest, ReplicaFetchResponse
from tests.brokers_stub.fake_controller import FakeController
from tests.brokers_stub.helpers import TOPIC, Running, broker_config, change, cluster, eventually
from tests.brokers_stub.test_produce import three, waiting
from tests.brokers_stub.test_replica_manager import EPOCHS, TP, Clock, manager, produce

WAIT = 600_000  # ms: no test lasts this long
LAG = 10 * WAIT  # the leader holds a fetch at most half the replica lag time


def request(follower: ReplicaManager, max_wait_ms: int = WAIT) -> ReplicaFetchRequest:
    log = follower.logs[TP]
    return ReplicaFetchRequest(
        topic=TOPIC,
        partition=0,
        follower_id=follower.broker_id,
        follower_broker_epoch=EPOCHS[follower.broker_id],
        fetch_offset=log.log_end_offset,
        last_fetched_epoch=log.last_fetched_epoch,
        max_wait_ms=max_wait_ms,
    )


async def fetch_now(leader: ReplicaManager, follower: ReplicaManager) -> ReplicaFetchResponse:
    """A fetch that has news (so it is answered at once), applied by the follower."""
    req = request(follower)
    resp = await leader.fetch(req)
    follower.apply_fetch_response(TP, req.fetch_offset, resp)
    return resp


async def parked(st: LeaderState, n: int = 1) -> None:
    """Let the loop run until `n` fetches are held (no timing involved)."""
    for _ in range(100):
        if st.parked >= n:
            return
        await asyncio.sleep(0)  # one turn of the loop, not a delay
    raise AssertionError(f"{n} fetch(es) never parked")


async def answered(task: asyncio.Task[ReplicaFetchResponse]) -> ReplicaFetchResponse:
    """The fetch's answer, once the loop has run the wake-up through: a fetch not woken
    is still held (its max wait is WAIT), and fails the test here."""
    for _ in range(100):
        if task.done():
            return task.result()
        await asyncio.sleep(0)  # one turn of the loop, not a delay
    task.cancel()
    raise AssertionError("the held fetch was not answered")


def pair(tmp_path: Path, lag: int = LAG) -> tuple[ReplicaManager, ReplicaManager, ClusterImage]:
    """Leader 1 and follower 2 of orders-0, ISR [1, 2], MinISR 1."""
    clock = Clock()
    leader = manager(tmp_path, 1, clock, replica_lag_time_max_ms=lag)
    f2 = manager(tmp_path, 2, clock)
    image = cluster(EPOCHS, replicas=[1, 2, 3], leader=1, isr=[1, 2])
    leader.on_metadata(image, None, True)
    f2.on_metadata(image, None, True)
    return leader, f2, image


async def test_a_held_fetch_is_answered_when_records_arrive(tmp_path: Path) -> None:
    leader, f2, _ = pair(tmp_path)
    await fetch_now(leader, f2)  # the first of the leadership: the follower's HW is unknown
    task = asyncio.create_task(leader.fetch(request(f2)))
    st = leader.leaders[TP]
    await parked(st)  # nothing new for 2: held
    await produce(leader, 5)  # acks=1
    resp = await answered(task)
    assert (resp.log_end_offset, resp.truncate_to) == (5, None)
    assert st.parked == 0
    assert f2.apply_fetch_response(TP, 0, resp)  # it copies 0..4, and fetches again at once
    assert f2.logs[TP].log_end_offset == 5


async def test_a_held_fetch_carries_the_high_watermark_as_soon_as_it_moves(
    tmp_path: Path,
) -> None:
    leader, f2, f3, _ = three(tmp_path, isr=[1, 2, 3], replica_lag_time_max_ms=LAG)
    batch = asyncio.create_task(leader.data.produce(ProduceRequest(topic=TOPIC, partition=0)))
    await waiting(leader)  # the batch is appended and waits on the HW
    for f in (f2, f3):
        await fetch_now(leader, f)  # each copies offset 0
    # 2 says it holds offset 0: the HW cannot move while 3 has not said so. Nothing new
    # for 2, so its fetch is held.
    task = asyncio.create_task(leader.fetch(request(f2)))
    await parked(leader.leaders[TP])
    assert leader.logs[TP].high_watermark == 0
    resp3 = await fetch_now(leader, f3)  # 3 says it too: the HW moves to 1 ...
    assert resp3.high_watermark == 1
    resp2 = await answered(task)  # ... and 2's held fetch carries it at once
    assert (resp2.log_end_offset, resp2.high_watermark) == (1, 1)
    produced = await batch  # the acks=all batch was answered when the HW covered it
    assert isinstance(produced, ProduceResponse) and produced.high_watermark == 1


async def test_a_held_fetch_is_released_when_the_leadership_moves(tmp_path: Path) -> None:
    leader, f2, image = pair(tmp_path)
    await fetch_now(leader, f2)
    task = asyncio.create_task(leader.fetch(request(f2)))
    await parked(leader.leaders[TP])
    leader.on_metadata(change(image, leader=3), None, True)
    with pytest.raises(NotLeaderOrFollowerError, match="no longer leads"):
        await answered(task)


async def test_a_held_fetch_is_released_when_the_broker_stops(tmp_path: Path) -> None:
    leader, f2, _ = pair(tmp_path)
    await fetch_now(leader, f2)
    task = asyncio.create_task(leader.fetch(request(f2)))
    await parked(leader.leaders[TP])
    await leader.stop()
    with pytest.raises(NotLeaderOrFollowerError):
        await answered(task)


@pytest.mark.timeout(60)  # a fetch held past its max wait would hang: fail instead
async def test_a_held_fetch_is_answered_empty_after_its_max_wait(tmp_path: Path) -> None:
    leader, f2, _ = pair(tmp_path)
    first = await fetch_now(leader, f2)
    task = asyncio.create_task(leader.fetch(request(f2, max_wait_ms=10)))
    await parked(leader.leaders[TP])
    resp = await task  # nothing happens: the wait ends it
    assert resp == first  # nothing new: the same log end, high watermark and history
    assert leader.leaders[TP].parked == 0
    # Without a max wait (an older follower's fetch) it is answered at once.
    now = await leader.fetch(request(f2, max_wait_ms=0))
    assert now == first


@pytest.mark.timeout(60)
async def test_the_leader_holds_a_fetch_at_most_half_the_replica_lag_time(
    tmp_path: Path,
) -> None:
    # The fetch is recorded when it arrives: held longer than the lag time, an idle
    # follower would look out of sync.
    leader, f2, _ = pair(tmp_path, lag=40)
    await fetch_now(leader, f2)
    resp = await leader.fetch(request(f2, max_wait_ms=WAIT))  # held 20 ms, not WAIT
    assert resp.log_end_offset == 0
    assert leader.config.fetch_wait_ms == 20  # and its own fetches ask for no more


async def test_max_wait_on_the_wire(tmp_path: Path) -> None:
    leader, f2, _ = pair(tmp_path)
    with pytest.raises(InvalidRequestError, match="max_wait_ms"):
        await leader.fetch(request(f2, max_wait_ms=-1))
    # The codec refuses a wrong type with a named error.
    body = msgspec.to_builtins(request(f2))
    assert decode_frame(msgspec.msgpack.encode([7, body])).body == request(f2)
    body["max_wait_ms"] = "soon"
    with pytest.raises(InvalidRequestError, match="max_wait_ms"):
        decode_frame(msgspec.msgpack.encode([7, body]))

    # An older follower omits the field: answered at once. An older leader ignores it.
    class OldReplicaFetch(msgspec.Struct, tag="ReplicaFetch", tag_field="type", kw_only=True):
        v: int = 1
        topic: str
        partition: int
        follower_id: int
        follower_broker_epoch: int
        fetch_offset: int
        last_fetched_epoch: int

    old = OldReplicaFetch(
        topic=TOPIC, partition=0, follower_id=2, follower_broker_epoch=200, fetch_offset=0,
        last_fetched_epoch=-1,
    )  # fmt: skip
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=ReplicaFetchRequest)
    assert decoded.max_wait_ms == 0
    seen_by_old = msgspec.msgpack.decode(msgspec.msgpack.encode(request(f2)), type=OldReplicaFetch)
    assert seen_by_old.fetch_offset == 0


async def test_lanes_long_poll_up_to_the_cap_and_share_one_beyond(tmp_path: Path) -> None:
    m = manager(tmp_path, 1, Clock(), replica_fetch_sessions_max=2)
    fetcher = Fetcher(m, 2)  # no image: the lanes find nothing to fetch
    a, b, c = (TOPIC, 0), (TOPIC, 1), (TOPIC, 2)
    fetcher.assign([c, a, b])
    assert set(fetcher.lanes) == {a, b}
    assert fetcher.shared is not None and fetcher.shared.partitions == [c]
    assert all(lane.long_poll for lane in fetcher.lanes.values())
    assert not fetcher.shared.long_poll
    gone = fetcher.lanes[a].task
    fetcher.assign([b, c])  # a's lane ends, and c moves onto a lane of its own
    assert set(fetcher.lanes) == {b, c} and fetcher.shared is None
    await asyncio.gather(gone, return_exceptions=True)
    assert gone.cancelled()
    tasks = [lane.task for lane in fetcher.lanes.values()]
    fetcher.close()
    await m.stop()  # awaits every lane's task
    assert all(t.done() for t in tasks)


async def two_brokers(
    controller: FakeController, tmp_path: Path, partitions: int, **kw: object
) -> tuple[Running, Running]:
    """Brokers 1 and 2 running, 1 leading `partitions` partitions of orders (replicas and
    ISR [1, 2], MinISR 2), 2 following them."""
    controller.append(
        RegisterBrokerRecord(broker_id=2, incarnation_id="b2-old", broker_epoch=0, fenced=True),
        TopicRecord(name=TOPIC, topic_id="t", partitions=partitions, min_isr=2),
    )
    one = Running(broker_config(controller, tmp_path / "b1", **kw))
    await one.await_ready()
    controller.append(
        *(
            PartitionRecord(
                topic=TOPIC, partition=i, replicas=[1, 2], isr=[1, 2], leader=1, min_isr=2
            )
            for i in range(partitions)
        )
    )
    led = one.broker.replicas.leaders
    await eventually(lambda: len(led) == partitions, what="broker 1 leading")
    two = Running(broker_config(controller, tmp_path / "b2", broker_id=2, **kw))
    await two.await_ready()
    return one, two


async def produce_all(one: Running, partition: int, base: int) -> None:
    """An acks=all batch of 10 to broker 1, committed within its 20 s timeout."""
    async with RpcClient(one.broker.server.address) as client:
        req = ProduceRequest(
            topic=TOPIC, partition=partition, acks=ACKS_ALL, count=10, timeout_ms=20_000
        )
        resp = await client.request(req, 30)
    assert isinstance(resp, ProduceResponse)
    assert (resp.base_offset, resp.count) == (base, 10)
    assert resp.high_watermark >= base + 10


async def test_acks_all_completes_through_the_long_poll(
    controller: FakeController, tmp_path: Path
) -> None:
    """Two brokers over TCP, ISR [1, 2], MinISR 2. Followers fetch once a fetch interval
    (10 minutes here) unless the long poll carries them: the batches commit within their
    20 s timeout only if it does."""
    slow = {
        "fetch_interval_ms": WAIT,
        "replica_fetch_wait_max_ms": WAIT,
        "replica_lag_time_max_ms": LAG,
    }
    one, two = await two_brokers(controller, tmp_path, 1, **slow)
    try:
        st = one.broker.replicas.leaders[TP]
        await eventually(lambda: st.parked == 1, what="broker 2's fetch held")
        for base in (0, 10, 20):
            await produce_all(one, 0, base)
        # The follower learns the high watermark on the fetch after; it is then held.
        await eventually(lambda: two.broker.replicas.logs[TP].high_watermark == 30, what="HW")
        await eventually(lambda: st.parked == 1, what="broker 2's fetch held again")
    finally:
        assert await two.stop() == 0
        assert await one.stop() == 0


async def test_partitions_beyond_the_lane_cap_are_fetched_on_the_shared_lane(
    controller: FakeController, tmp_path: Path
) -> None:
    """With one long-polling lane per leader, orders-0 gets it and orders-1 is polled on
    the shared lane (every 20 ms here): acks=all commits on both."""
    one, two = await two_brokers(controller, tmp_path, 2, replica_fetch_sessions_max=1)
    try:
        fetchers = two.broker.replicas.fetchers
        await eventually(lambda: 1 in fetchers and fetchers[1].shared is not None, what="lanes")
        fetcher = fetchers[1]
        assert list(fetcher.lanes) == [TP]
        assert fetcher.shared is not None and fetcher.shared.partitions == [(TOPIC, 1)]
        await produce_all(one, 0, 0)
        await produce_all(one, 1, 0)
        assert one.broker.replicas.leaders[(TOPIC, 1)].parked == 0  # never held
    finally:
        assert await two.stop() == 0
        assert await one.stop() == 0
