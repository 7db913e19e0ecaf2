"""DescribeCluster paging against a real controller service over TCP, with a 64 KiB frame
limit: a topic of 3,000 partitions (about 0.3 MB to describe) breaks a whole answer, and
pages of it never do, whatever the client's own limit."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clients.admin import pages
from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.describe import describe_page
from controller.runtime.service import ControllerService
from metactl.errors import FrameTooLargeError, UnknownTopicOrPartitionError
from protocol.client import RpcClient
from protocol.codec import encode_frame
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)

FRAME = 64 * 1024
BIG = 3000


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    # A virtual clock: broker sessions never expire behind the test's back.
    svc = ControllerService(
        tmp_path,
        "127.0.0.1:0",
        config=ControllerConfig(),
        clock=VirtualClock(1_700_000_000_000),
        max_frame_bytes=FRAME,
    )
    await svc.start()
    async with RpcClient(svc.address) as c:
        for b in (1, 2, 3):
            r = await c.request(RegisterBroker(broker_id=b, incarnation_id=f"i{b}"))
            assert isinstance(r, RegisterBrokerResponse)
            await c.request(
                BrokerHeartbeatRequest(
                    broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
                )
            )
        created = await c.request(
            CreateTopicsRequest(
                topics=[
                    CreateTopic(name="big", partitions=BIG, replication_factor=3),
                    CreateTopic(name="small", partitions=3, replication_factor=2),
                ]
            )
        )
        assert isinstance(created, CreateTopicsResponse)
        assert [r.error_code for r in created.results] == [None, None]
    try:
        yield svc
    finally:
        await svc.stop()


async def collect(
    client: RpcClient, request: DescribeClusterRequest
) -> list[DescribeClusterResponse]:
    return [r async for r in pages(client, request)]


async def test_the_whole_answer_is_refused_by_name_and_the_connection_keeps_serving(
    service: ControllerService,
) -> None:
    # What a v1 DescribeCluster would have sent: over the frame limit.
    ctl = service.controller
    whole = describe_page(
        ctl.committed_image,
        DescribeClusterRequest(),
        max_bytes=10**9,
        end_offset=0,
        committed_offset=0,
    )
    assert len(whole.partitions) == BIG + 3 and len(encode_frame(1, whole)) > FRAME
    async with RpcClient(service.address, max_frame_bytes=FRAME) as c:
        with pytest.raises(FrameTooLargeError) as e:
            await c.request(DescribeClusterRequest())
        assert "DescribeCluster v2 pages it" in e.value.message
        # A v1 answer that fits is still whole, for old clients; same connection.
        small = await c.request(DescribeClusterRequest(topic="small"))
        assert isinstance(small, DescribeClusterResponse)
        assert small.v == 1 and len(small.partitions) == 3 and len(small.brokers) == 3


async def test_pages_hold_every_partition_once_in_order(service: ControllerService) -> None:
    async with RpcClient(service.address, max_frame_bytes=FRAME) as c:
        got = await collect(c, DescribeClusterRequest(broker_limit=0))
    names = [(p.topic, p.partition) for r in got for p in r.partitions]
    assert names == [("big", i) for i in range(BIG)] + [("small", i) for i in range(3)]
    assert len(got) > 1 and all(r.v == 2 and r.brokers == [] for r in got)
    # Every page carries the committed offset it was answered from.
    assert {r.committed_offset for r in got} == {service.controller.committed_image.end_offset}


async def test_a_client_with_a_smaller_frame_limit_gets_smaller_pages(
    service: ControllerService,
) -> None:
    async with RpcClient(service.address, max_frame_bytes=FRAME) as c:
        wide = await collect(c, DescribeClusterRequest(topic="big", broker_limit=0))
    async with RpcClient(service.address, max_frame_bytes=16 * 1024) as c:
        narrow = await collect(c, DescribeClusterRequest(topic="big", broker_limit=0))
    # Had a page exceeded 16 KiB, the client would have refused its frame.
    assert len(narrow) > len(wide)
    assert [p.partition for r in narrow for p in r.partitions] == list(range(BIG))


async def test_brokers_page_by_id_and_one_topic_pages_alone(service: ControllerService) -> None:
    async with RpcClient(service.address) as c:
        brokers = await collect(c, DescribeClusterRequest(partition_limit=0, broker_limit=1))
        assert [[b.broker_id for b in r.brokers] for r in brokers] == [[1], [2], [3]]
        assert all(r.partitions == [] for r in brokers)
        small = await collect(c, DescribeClusterRequest(topic="small", broker_limit=0))
        assert [[p.partition for p in r.partitions] for r in small] == [[0, 1, 2]]
        with pytest.raises(UnknownTopicOrPartitionError):
            await collect(c, DescribeClusterRequest(topic="nope"))
