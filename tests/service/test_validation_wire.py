"""Issue 11's validation findings, over real TCP against a real controller service on a real
SQLite log: each bad request gets its named error, commits nothing (the log end offset
is unchanged), and the same connection keeps serving. At the end the log still exports
to Parquet (2^63-1 and 2^64-1 broke `metactl log export` when they were accepted)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from audit.export import export_parquet
from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from metactl.errors import MetactlError
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ElectLeader,
)
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.unions import Message

HUGE_IDS = (2**63 - 1, 2**64 - 1)
LONG = "x" * 10_000


class Wire:
    """A started service with brokers 1-3 active and topic `orders`, and one connection."""

    def __init__(self, service: ControllerService, conn: RpcClient) -> None:
        self.service = service
        self.conn = conn

    @property
    def end_offset(self) -> int:
        store = self.service.store
        assert store is not None
        return store.end_offset

    async def refused(self, request: Message, code: str) -> str:
        """The request fails with `code`; nothing is committed; the connection serves on."""
        end = self.end_offset
        with pytest.raises(MetactlError) as raised:
            await self.conn.request(request)
        assert raised.value.code == code, raised.value
        await self.still_serving(end)
        return raised.value.message

    async def topic_refused(self, spec: CreateTopic, code: str) -> str:
        """A CreateTopics whose one topic fails with `code` (per-topic results)."""
        end = self.end_offset
        r = await self.conn.request(CreateTopicsRequest(topics=[spec]))
        assert isinstance(r, CreateTopicsResponse)
        (result,) = r.results
        assert result.error_code == code, result
        assert result.topic_id is None
        await self.still_serving(end)
        return result.message

    async def still_serving(self, end: int) -> None:
        described = await self.conn.request(DescribeClusterRequest())
        assert isinstance(described, DescribeClusterResponse)
        assert described.end_offset == described.committed_offset == end
        assert self.end_offset == end
        assert self.service.controller.image.end_offset == end
        assert {b.broker_id for b in described.brokers} == {1, 2, 3}
        assert {p.topic for p in described.partitions} == {"orders"}


@pytest.fixture
async def wire(tmp_path: Path) -> AsyncIterator[Wire]:
    # Sessions never expire during a test, so no fence moves the log end behind our back.
    config = ControllerConfig(broker_session_timeout_ms=600_000)
    service = ControllerService(tmp_path / "log", "127.0.0.1:0", config=config)
    await service.start()
    host, port = parse_address(service.address)
    conn = await RpcClient.open(host, port)
    try:
        for b in (1, 2, 3):
            r = await conn.request(
                RegisterBroker(
                    broker_id=b, incarnation_id=f"b{b}", endpoint=f"127.0.0.1:{9000 + b}"
                )
            )
            assert isinstance(r, RegisterBrokerResponse)
            hb = await conn.request(
                BrokerHeartbeatRequest(
                    broker_id=b, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
                )
            )
            assert isinstance(hb, BrokerHeartbeatResponse) and not hb.is_fenced
        created = await conn.request(
            CreateTopicsRequest(
                topics=[CreateTopic(name="orders", partitions=2, replication_factor=3, min_isr=2)]
            )
        )
        assert isinstance(created, CreateTopicsResponse) and created.results[0].error_code is None
        yield Wire(service, conn)
    finally:
        await conn.close()
        await service.stop()


async def test_broker_id_minus_one_the_no_leader_sentinel(wire: Wire) -> None:
    message = await wire.refused(
        RegisterBroker(broker_id=-1, incarnation_id="x"), "INVALID_REQUEST"
    )
    assert "broker_id -1 is outside 0..2147483647" in message
    await wire.refused(
        BrokerHeartbeatRequest(broker_id=-1, broker_epoch=0, metadata_offset=0), "INVALID_REQUEST"
    )
    # `metactl elect --replica -1`
    await wire.refused(
        ElectLeader(topic="orders", partition=0, election_type="unclean", replica=-1),
        "INVALID_REQUEST",
    )
    # A topic assigned [[-1]] (it showed `Isr: -1`).
    await wire.topic_refused(
        CreateTopic(name="t", assignments=[[-1]]), "INVALID_REPLICA_ASSIGNMENT"
    )


async def test_broker_ids_beyond_int32_and_the_log_still_exports(
    wire: Wire, tmp_path: Path
) -> None:
    for big in HUGE_IDS:
        message = await wire.refused(
            RegisterBroker(broker_id=big, incarnation_id="x"), "INVALID_REQUEST"
        )
        assert f"broker_id {big} is outside" in message
        await wire.topic_refused(
            CreateTopic(name="t", assignments=[[1, big]]), "INVALID_REPLICA_ASSIGNMENT"
        )
    end = wire.end_offset
    await wire.service.stop()
    report = export_parquet([str(tmp_path / "log")], tmp_path / "pq")
    assert report.records == end
    table = pq.read_table(tmp_path / "pq")
    assert table.num_rows == end
    assert set(table.column("broker").drop_null().to_pylist()) <= {1, 2, 3}


async def test_topic_name_with_a_trailing_newline(wire: Wire) -> None:
    message = await wire.topic_refused(
        CreateTopic(name="abc\n", replication_factor=1), "INVALID_TOPIC_EXCEPTION"
    )
    assert "'abc\\n'" in message
    for name in (".", "..", "a" * 250, "a b"):
        await wire.topic_refused(
            CreateTopic(name=name, replication_factor=1), "INVALID_TOPIC_EXCEPTION"
        )


async def test_min_insync_replicas_2_to_the_64_minus_1(wire: Wire) -> None:
    await wire.topic_refused(
        CreateTopic(name="t", replication_factor=3, min_isr=2**64 - 1), "INVALID_CONFIG"
    )
    # Above the replication factor is accepted, as in Kafka (docs/lifecycle.md): the
    # effective MinISR is capped at the RF.
    r = await wire.conn.request(
        CreateTopicsRequest(topics=[CreateTopic(name="t", replication_factor=2, min_isr=3)])
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None


async def test_ten_thousand_character_endpoint_and_rack(wire: Wire) -> None:
    message = await wire.refused(
        RegisterBroker(broker_id=4, incarnation_id="x", endpoint=LONG + ":9092"),
        "INVALID_REQUEST",
    )
    assert "endpoint is 10005 characters; the limit is 255" in message
    message = await wire.refused(
        RegisterBroker(broker_id=4, incarnation_id="x", endpoint="127.0.0.1:70000"),
        "INVALID_REQUEST",
    )
    assert "port in 1..65535" in message
    message = await wire.refused(
        RegisterBroker(broker_id=4, incarnation_id="x", rack=LONG), "INVALID_REQUEST"
    )
    assert "rack is 10000 characters; the limit is 255" in message
