"""Produce and ReadLog over real TCP: two in-process brokers against the fake controller.

Broker 1 leads orders-0 (replicas [1, 2], ISR [1, 2], MinISR 2). Broker 2 starts later:
until it runs and replicates, an acks=all batch waits on broker 1 while acks=1 is
answered at once. Waiting is on observable state (a registered waiter, READY lines),
never on time.
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from metactl.errors import (
    MessageTooLargeError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    UnknownTopicOrPartitionError,
)
from metadata_log.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.codec import decode_frame
from protocol.messages.base import ErrorResponse
from protocol.messages.data import (
    ACKS_ALL,
    ACKS_LEADER,
    ProduceRequest,
    ProduceResponse,
    ReadLogRequest,
    ReadLogResponse,
)
from protocol.transport import read_frame
from tests.brokers_stub.fake_controller import FakeController
from tests.brokers_stub.helpers import TOPIC, Running, broker_config, eventually

TP = (TOPIC, 0)


async def leader_of_two(controller: FakeController, tmp_path: Path, min_isr: int = 2) -> Running:
    """Broker 1 running and leading orders-0 with ISR [1, 2]; broker 2 only known."""
    controller.append(
        RegisterBrokerRecord(broker_id=2, incarnation_id="b2-old", broker_epoch=0, fenced=True),
        TopicRecord(name=TOPIC, topic_id="t", partitions=1, min_isr=min_isr),
    )
    run = Running(broker_config(controller, tmp_path / "b1"))
    await run.await_ready()
    controller.append(
        PartitionRecord(
            topic=TOPIC, partition=0, replicas=[1, 2], isr=[1, 2], leader=1, min_isr=min_isr
        )
    )
    await eventually(lambda: TP in run.broker.replicas.leaders, what="broker 1 leading")
    return run


def produce(count: int, acks: int = ACKS_ALL, **kw: object) -> ProduceRequest:
    return ProduceRequest(topic=TOPIC, partition=0, acks=acks, count=count, **kw)  # type: ignore[arg-type]


async def test_acks_all_waits_for_the_follower_acks_1_does_not(
    controller: FakeController, tmp_path: Path
) -> None:
    one = await leader_of_two(controller, tmp_path)
    endpoint = one.broker.server.address
    async with RpcClient(endpoint) as c_all, RpcClient(endpoint) as c_one:
        pending = asyncio.create_task(c_all.request(produce(10), 30))
        await eventually(
            lambda: one.broker.replicas.data.waiters.pending(TP) == 1, what="a waiting batch"
        )
        # Broker 2, an ISR member, is not running: the HW cannot reach the batch.
        fast = await c_one.request(produce(5, ACKS_LEADER))
        assert isinstance(fast, ProduceResponse)
        assert (fast.base_offset, fast.count, fast.high_watermark) == (10, 5, 0)
        assert not pending.done()
        two = Running(broker_config(controller, tmp_path / "b2", broker_id=2))
        try:
            await two.await_ready()
            resp = await pending  # answered once 2 has fetched the batch and said so
            assert isinstance(resp, ProduceResponse)
            assert (resp.base_offset, resp.count, resp.leader_epoch) == (0, 10, 0)
            assert resp.high_watermark >= 10
            assert two.broker.replicas.logs[TP].log_end_offset >= 10
            # The follower refuses clients; the leader serves the committed log.
            async with RpcClient(two.broker.server.address) as c_two:
                with pytest.raises(NotLeaderOrFollowerError):
                    await c_two.request(produce(1))
                with pytest.raises(NotLeaderOrFollowerError):
                    await c_two.request(ReadLogRequest(topic=TOPIC, partition=0))
            read = await c_one.request(ReadLogRequest(topic=TOPIC, partition=0))
            assert isinstance(read, ReadLogResponse)
            assert read.high_watermark >= 10 and read.leader_epochs == [(0, 0)]
        finally:
            assert await two.stop() == 0
    assert await one.stop() == 0


async def test_refusals_over_tcp(controller: FakeController, tmp_path: Path) -> None:
    one = await leader_of_two(controller, tmp_path, min_isr=2)
    controller.append(
        PartitionRecord(topic=TOPIC, partition=1, replicas=[1, 2], isr=[1], leader=1, min_isr=2)
    )
    await eventually(lambda: (TOPIC, 1) in one.broker.replicas.leaders, what="leading orders-1")
    async with RpcClient(one.broker.server.address) as c:
        with pytest.raises(NotEnoughReplicasError):  # orders-1: ISR [1] < MinISR 2
            await c.request(ProduceRequest(topic=TOPIC, partition=1, acks=ACKS_ALL, count=1))
        with pytest.raises(UnknownTopicOrPartitionError):
            await c.request(ProduceRequest(topic="nope", partition=0, count=1))
        with pytest.raises(MessageTooLargeError):
            await c.request(produce(10_001))
        ok = await c.request(ProduceRequest(topic=TOPIC, partition=1, acks=ACKS_LEADER, count=2))
        assert isinstance(ok, ProduceResponse) and ok.base_offset == 0
    assert await one.stop() == 0


async def test_garbage_frame_leaves_the_broker_serving_produce(
    controller: FakeController, tmp_path: Path
) -> None:
    one = await leader_of_two(controller, tmp_path, min_isr=1)
    host, port = parse_address(one.broker.server.address)
    reader, writer = await asyncio.open_connection(host, port)
    garbage = b"\xc1\xff not msgpack"
    writer.write(struct.pack(">I", len(garbage)) + garbage)
    await writer.drain()
    answer = decode_frame(await read_frame(reader))
    assert isinstance(answer.body, ErrorResponse) and answer.body.code == "INVALID_REQUEST"
    writer.close()
    async with RpcClient(one.broker.server.address) as c:
        resp = await c.request(produce(3, ACKS_LEADER))
        assert isinstance(resp, ProduceResponse) and resp.count == 3
    assert await one.stop() == 0
