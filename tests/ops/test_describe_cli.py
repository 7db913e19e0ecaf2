"""`metactl describe` and `metactl brokers` (real subprocesses) against a real controller
whose frame limit is 64 KiB, with a topic of 3,000 partitions that a one-frame describe
cannot carry: every partition is printed, page by page, online and offline."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clients.admin import pages
from controller.core.config import ControllerConfig
from controller.runtime.clock import VirtualClock
from controller.runtime.service import ControllerService
from metactl.errors import FrameTooLargeError, UnsupportedVersionError
from protocol.admission import Peer
from protocol.client import RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    PartitionState,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.unions import Message
from protocol.server import FrameServer

FRAME = 64 * 1024
BIG = 3000


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    svc = ControllerService(
        tmp_path,
        "127.0.0.1:0",
        config=ControllerConfig(),
        clock=VirtualClock(1_700_000_000_000),  # sessions never expire behind the test
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
        spec = [
            CreateTopic(name="big", partitions=BIG, replication_factor=3),
            CreateTopic(name="a-small", partitions=2, replication_factor=1),
        ]
        r = await c.request(CreateTopicsRequest(topics=spec))
        assert isinstance(r, CreateTopicsResponse)
        # The one-frame describe of this cluster is refused: it would not fit.
        with pytest.raises(FrameTooLargeError):
            await c.request(DescribeClusterRequest())
    try:
        yield svc
    finally:
        await svc.stop()


async def metactl(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ops.cli", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


EXPECTED = [("a-small", i) for i in range(2)] + [("big", i) for i in range(BIG)]


def fields(line: str) -> dict[str, str]:
    return dict(f.split(": ", 1) for f in line.strip("\t").split("\t"))


def parsed(out: str) -> list[tuple[str, int]]:
    """The (topic, partition) of every partition line (Kafka's: tab-indented)."""
    lines = [line for line in out.splitlines() if line.startswith("\t")]
    return [(f["Topic"], int(f["Partition"])) for f in map(fields, lines)]


async def test_describe_prints_every_partition_of_a_cluster_one_frame_cannot_hold(
    service: ControllerService,
) -> None:
    rc, out, err = await metactl("describe", "--controller", service.address, "--insecure")
    assert rc == 0, err
    assert parsed(out) == EXPECTED
    lines = out.splitlines()
    # Kafka's layout: a summary line per topic (once, though "big" spans many pages),
    # then its partitions, Kafka's fields first and in Kafka's order.
    topics = [fields(line) for line in lines if line.startswith("Topic:")]
    assert [(t["Topic"], t["PartitionCount"], t["ReplicationFactor"]) for t in topics] == [
        ("a-small", "2", "1"),
        ("big", "3000", "3"),
    ]
    assert all(t["TopicId"] and t["Configs"] == "min.insync.replicas=1" for t in topics)
    assert lines[0].startswith("Topic: a-small\tTopicId: ") and lines[3].startswith("Topic: big")
    assert lines[4] == (
        "\tTopic: big\tPartition: 0\tLeader: 1\tReplicas: 1,2,3\tIsr: 1,2,3\tElr: \t"
        "LastKnownElr: \tLeaderEpoch: 0\tRecovery: ok"
    )


async def test_describe_json_is_one_object_streamed_from_several_pages(
    service: ControllerService,
) -> None:
    rc, out, err = await metactl(
        "describe", "--controller", service.address, "--insecure", "--json", "--page-size", "500"
    )
    assert rc == 0, err
    doc = json.loads(out)
    assert [(p["topic"], p["partition"]) for p in doc["partitions"]] == EXPECTED
    assert doc["pages"] == 7  # 3,002 partitions, 500 a page (45 kB: under the frame limit)
    committed = service.controller.committed_image.end_offset
    assert doc["end_offset"] == doc["last_end_offset"] == committed
    assert doc["partitions"][0]["replicas"] == [1] and doc["partitions"][0]["elr"] == []
    assert [(t["name"], t["partitions"]) for t in doc["topics"]] == [("a-small", 2), ("big", 3000)]


async def test_one_topic_brokers_and_an_unknown_topic(service: ControllerService) -> None:
    ctl = ("--controller", service.address, "--insecure")
    rc, out, _ = await metactl("describe", *ctl, "--topic", "a-small")
    assert rc == 0 and parsed(out) == EXPECTED[:2]

    rc, out, _ = await metactl("brokers", *ctl, "--json", "--page-size", "1")
    doc = json.loads(out)
    assert rc == 0 and [b["broker_id"] for b in doc["brokers"]] == [1, 2, 3]
    assert doc["pages"] == 3 and all(not b["fenced"] for b in doc["brokers"])

    rc, out, _ = await metactl("brokers", *ctl)
    lines = out.splitlines()
    assert rc == 0 and lines[0].split()[:2] == ["ID", "EPOCH"] and len(lines) == 4

    rc, out, err = await metactl("describe", *ctl, "--topic", "nope", "--json")
    assert rc == 4 and out == "" and err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION: ")
    assert err.count("\n") == 1  # one line


async def test_offline_describe_walks_the_same_order(
    service: ControllerService, tmp_path: Path
) -> None:
    rc, out, err = await metactl("describe", "--data-dir", str(tmp_path))
    assert rc == 0, err
    assert parsed(out) == EXPECTED
    rc, out, err = await metactl("describe", "--data-dir", str(tmp_path), "--topic", "nope")
    assert rc == 4 and err.startswith("error: UNKNOWN_TOPIC_OR_PARTITION: ")
    rc, out, _ = await metactl("brokers", "--data-dir", str(tmp_path), "--json")
    assert rc == 0 and [b["broker_id"] for b in json.loads(out)["brokers"]] == [1, 2, 3]


async def test_a_controller_without_paging_gets_one_v1_request() -> None:
    asked: list[int] = []
    whole = DescribeClusterResponse(
        brokers=[],
        partitions=[
            PartitionState(
                topic="t", partition=0, replicas=[1], leader=1, leader_epoch=0,
                partition_epoch=0, isr=[1],
            )
        ],
        end_offset=3,
        committed_offset=3,
    )  # fmt: skip

    async def old_controller(body: Message, peer: Peer) -> Message:
        assert isinstance(body, DescribeClusterRequest)
        asked.append(body.v)
        if body.v != 1:  # what an older codec answers
            raise UnsupportedVersionError("DescribeClusterRequest version 2 is not supported")
        return whole

    server = FrameServer(old_controller)
    await server.start("127.0.0.1:0")
    try:
        async with RpcClient(server.address) as c:
            got = [r async for r in pages(c, DescribeClusterRequest(broker_limit=0))]
    finally:
        await server.stop()
    assert got == [whole] and asked == [2, 1]
