"""The metadata lifecycle end to end (issue 19), with a real controller and four real
broker processes:

1. a topic of RF 3 on brokers 1, 2, 3;
2. produced to with acks=all while partition 0 moves from [1, 2, 3] to [2, 3, 4];
3. every acknowledged record is then in the replica files of 2, 3 and 4 (and 1's is
   deleted);
4. MinISR raised to 3 while a replica is in the ELR: the ELR (and LastKnownELR) clear;
5. the topic deleted (its replicas deleted) while a replica is down, then created
   again: a new id, empty everywhere, and the broker that was down deletes its stale
   replica rather than serving it;
6. broker 1 stopped, fenced, then unregistered (while active it is refused).

Every wait is on observable state (DescribeCluster, the committed log, a replica file)
with a deadline; nothing sleeps to let something happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from brokers_stub.replica_log import ReplicaLog, epoch_at
from clients.data import Connections, Leaders, leader_request
from metactl.errors import MetactlError
from metadata_log.records import ClearElrRecord, RemoveTopicRecord
from protocol.client import RetryPolicy
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    PartitionState,
    Reassignment,
    UnregisterBroker,
)
from protocol.messages.data import (
    ACKS_ALL,
    ProduceRequest,
    ProduceResponse,
    ReadLogRequest,
    ReadLogResponse,
)
from tests.e2e.cluster import Cluster

pytestmark = pytest.mark.slow

TOPIC = "t"
RETRY = RetryPolicy(attempts=12, base_s=0.05, cap_s=0.5)
Acked = tuple[int, int, int]  # (base offset, count, leader epoch)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    c.start_controller()
    try:
        yield c
    finally:
        c.stop()


def part(s: DescribeClusterResponse) -> PartitionState | None:
    return next((p for p in s.partitions if p.topic == TOPIC and p.partition == 0), None)


def p0(s: DescribeClusterResponse) -> PartitionState:
    p = part(s)
    assert p is not None, f"no partition {TOPIC}-0 in {s}"
    return p


def topic_id(s: DescribeClusterResponse) -> str | None:
    return next((t.topic_id for t in s.topics if t.name == TOPIC), None)


def fenced(s: DescribeClusterResponse, broker_id: int) -> bool:
    return any(b.broker_id == broker_id and b.fenced for b in s.brokers)


def active(s: DescribeClusterResponse, broker_ids: list[int]) -> bool:
    live = {b.broker_id for b in s.brokers if not b.fenced}
    return set(broker_ids) <= live


class Producer:
    """acks=all batches to partition 0's leader, one at a time, following the leader
    as it moves; every acknowledged batch is recorded, a refused one is counted."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.acked: list[Acked] = []
        self.refused = 0
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        c = self.cluster
        leaders = Leaders(c.address, TOPIC, RETRY, c.security)
        conns = Connections(c.security)
        req = ProduceRequest(topic=TOPIC, partition=0, acks=ACKS_ALL, count=10, timeout_ms=3000)
        try:
            await leaders.refresh()
            while not self.stop.is_set():
                try:
                    r = await leader_request(leaders, conns, 0, req, timeout_s=5, retry=RETRY)
                except (MetactlError, OSError, TimeoutError):
                    self.refused += 1
                    with contextlib.suppress(MetactlError, OSError, TimeoutError):
                        await leaders.refresh()
                    continue
                assert isinstance(r, ProduceResponse)
                self.acked.append((r.base_offset, r.count, r.leader_epoch))
        finally:
            await conns.close()

    async def acks(self, n: int) -> None:
        """Wait until `n` more batches are acknowledged."""
        target = len(self.acked) + n
        await self.cluster.wait_for(
            lambda: len(self.acked) >= target or self.task.done() or None,
            f"{n} acknowledged batches",
        )
        assert not self.task.done(), self.task

    async def close(self) -> list[Acked]:
        self.stop.set()
        await self.task
        return self.acked


def replica_if(c: Cluster, broker_id: int, test: Callable[[ReplicaLog], bool]) -> ReplicaLog | None:
    """Broker `broker_id`'s replica of partition 0 if it passes `test`, else None."""
    log = c.replica(broker_id, TOPIC, 0)
    return log if log is not None and test(log) else None


def no_replica(c: Cluster, broker_id: int) -> bool:
    return c.replica(broker_id, TOPIC, 0) is None


def missing(log: ReplicaLog, acked: list[Acked]) -> list[tuple[int, int]]:
    """The acknowledged records (offset, leader epoch) the replica does not hold."""
    return [
        (o, epoch)
        for base, count, epoch in acked
        for o in range(base, base + count)
        if o >= log.log_end_offset or epoch_at(log.leader_epochs, o) != epoch
    ]


async def test_the_metadata_lifecycle_with_real_processes(cluster: Cluster) -> None:
    c = cluster
    for b in (1, 2, 3, 4):
        c.start_broker(b)
    await c.wait_until(lambda s: len(s.brokers) == 4 and active(s, [1, 2, 3, 4]), "4 active")

    # 1. A topic of RF 3 on 1, 2, 3.
    r = await c.request(
        CreateTopicsRequest(topics=[CreateTopic(name=TOPIC, assignments=[[1, 2, 3]], min_isr=2)])
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
    old_id = r.results[0].topic_id
    assert old_id
    await c.wait_until(lambda s: p0(s).isr == [1, 2, 3], "full ISR")

    # 2. acks=all produce while partition 0 moves from [1, 2, 3] to [2, 3, 4].
    producer = Producer(c)
    await producer.acks(5)
    r = await c.request(
        AlterPartitionReassignments(
            reassignments=[Reassignment(topic=TOPIC, partition=0, replicas=[2, 3, 4])]
        )
    )
    assert isinstance(r, AlterPartitionReassignmentsResponse)
    assert r.results[0].error_code is None, r.results[0]
    s = await c.wait_until(
        lambda s: p0(s).replicas == [2, 3, 4] and p0(s).isr == [2, 3, 4], "the move completed"
    )
    assert p0(s).leader in (2, 3, 4)
    listed = await c.request(ListPartitionReassignmentsRequest())
    assert isinstance(listed, ListPartitionReassignmentsResponse) and listed.reassignments == []
    await producer.acks(5)  # and it goes on at the new leader
    acked = await producer.close()
    assert acked[-1][2] > acked[0][2]  # acknowledged in both leaderships
    end = max(base + count for base, count, _ in acked)

    # 3. Every acknowledged record is in each new replica's log; 1's replica is deleted.
    for b in (2, 3, 4):
        log = await c.wait_for(
            functools.partial(replica_if, c, b, lambda x: x.log_end_offset >= end),
            f"broker {b}'s replica holding offset {end - 1}",
        )
        assert log.topic_id == old_id
        assert missing(log, acked) == [], f"broker {b} misses acknowledged records"
    await c.wait_for(functools.partial(no_replica, c, 1), "broker 1's replica deleted")
    s = await c.describe()
    leader = p0(s).leader
    read = await leader_read(c)
    assert read.high_watermark >= end

    # 4. A replica in the ELR, then MinISR raised to 3: the ELR and LastKnownELR clear.
    first, second = [b for b in (2, 3, 4) if b != leader]
    c.kill_broker(second)
    await c.wait_until(lambda s: fenced(s, second) and p0(s).isr == sorted({leader, first}), "ISR")
    c.kill_broker(first)
    s = await c.wait_until(lambda s: fenced(s, first) and p0(s).isr == [leader], "ISR = leader")
    assert p0(s).elr == [first]  # below MinISR 2: it is eligible (KIP-966)
    mark = s.committed_offset
    r = await c.request(
        AlterConfigs(
            resource_type="topic",
            resource_name=TOPIC,
            set_configs={"min.insync.replicas": "3"},
        )
    )
    assert isinstance(r, AlterConfigsResponse) and r.cleared_topics == 1
    await c.wait_for_record(lambda x: isinstance(x, ClearElrRecord), "ClearElr", mark)
    s = await c.wait_until(lambda s: p0(s).min_isr == 3, "MinISR 3")
    assert (p0(s).elr, p0(s).last_known_elr, p0(s).isr) == ([], [], [leader])

    # 5. Deleted while `first` is down (its replica stays on its disk), created again.
    c.start_broker(second)
    await c.wait_until(lambda s: active(s, [second]), f"{second} back")
    mark = (await c.describe()).committed_offset
    r = await c.request(DeleteTopicsRequest(topics=[TOPIC]))
    assert isinstance(r, DeleteTopicsResponse) and r.results[0].error_code is None
    assert r.results[0].topic_id == old_id
    await c.wait_until(lambda s: part(s) is None and topic_id(s) is None, "the topic gone")
    for b in (leader, second):
        await c.wait_for(functools.partial(no_replica, c, b), f"{b}'s replica deleted")
    stale = c.replica(first, TOPIC, 0)
    assert stale is not None and stale.topic_id == old_id and stale.log_end_offset >= end

    r = await c.request(
        CreateTopicsRequest(topics=[CreateTopic(name=TOPIC, assignments=[[2, 3, 4]], min_isr=2)])
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
    new_id = r.results[0].topic_id
    assert new_id and new_id != old_id
    _, removed = await c.wait_for_record(lambda x: isinstance(x, RemoveTopicRecord), "RT", mark)
    assert isinstance(removed, RemoveTopicRecord) and removed.topic_id == old_id
    c.start_broker(first)  # it finds its replica of the old id, and must not serve it
    s = await c.wait_until(lambda s: p0(s).isr == [2, 3, 4], "the new topic's full ISR")
    assert topic_id(s) == new_id
    for b in (2, 3, 4):
        log = await c.wait_for(
            functools.partial(replica_if, c, b, lambda x: x.topic_id == new_id),
            f"broker {b}'s replica of the new topic",
        )
        assert (log.log_end_offset, log.high_watermark) == (0, 0), f"broker {b}: {log}"
    read = await leader_read(c)
    assert (read.log_end_offset, read.high_watermark) == (0, 0)
    producer = Producer(c)
    await producer.acks(1)
    assert (await producer.close())[0][0] == 0  # the first record of the new topic: offset 0

    # 6. Broker 1: refused while active; stopped, fenced, unregistered.
    with pytest.raises(MetactlError):
        await c.request(UnregisterBroker(broker_id=1))
    c.kill_broker(1, signal.SIGTERM)
    await c.wait_until(lambda s: fenced(s, 1), "1 fenced")
    await c.request(UnregisterBroker(broker_id=1))
    s = await c.wait_until(lambda s: all(b.broker_id != 1 for b in s.brokers), "1 unregistered")
    assert active(s, [2, 3, 4])


async def leader_read(c: Cluster) -> ReadLogResponse:
    """ReadLog from partition 0's current leader (the committed ranges)."""
    leaders = Leaders(c.address, TOPIC, RETRY, c.security)
    conns = Connections(c.security)
    try:
        await leaders.refresh()
        r = await leader_request(
            leaders, conns, 0, ReadLogRequest(topic=TOPIC, partition=0), timeout_s=5, retry=RETRY
        )
    finally:
        await conns.close()
    assert isinstance(r, ReadLogResponse)
    return r
