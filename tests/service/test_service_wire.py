"""The controller service over real TCP: bad frames, unknown brokers, stale epochs,
sessions, long-poll fetch. Each failure gets a coded answer and the service keeps serving."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.core.config import ControllerConfig
from controller.runtime.service import ControllerService
from metactl.errors import BrokerIdNotRegisteredError, StaleBrokerEpochError
from metadata_log.records import FeatureLevelRecord, FenceBrokerRecord, RegisterBrokerRecord
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.codec import decode_frame, encode_frame
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse
from protocol.messages.base import ErrorResponse
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    FetchMetadataRequest,
    FetchMetadataResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.transport import read_frame


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[ControllerService]:
    config = ControllerConfig(broker_session_timeout_ms=400, broker_heartbeat_interval_ms=100)
    svc = ControllerService(tmp_path, "127.0.0.1:0", config=config, max_frame_bytes=64 * 1024)
    await svc.start()
    yield svc
    await svc.stop()


async def _connect(svc: ControllerService) -> RpcClient:
    host, port = parse_address(svc.address)
    return await RpcClient.open(host, port)


async def _raw(svc: ControllerService) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = parse_address(svc.address)
    return await asyncio.open_connection(host, port)


async def _still_serving(svc: ControllerService) -> None:
    conn = await _connect(svc)
    try:
        assert isinstance(await conn.request(DescribeClusterRequest()), DescribeClusterResponse)
    finally:
        await conn.close()


async def test_undecodable_frame_gets_invalid_request_and_the_connection_survives(
    service: ControllerService,
) -> None:
    reader, writer = await _raw(service)
    junk = b"\xc1\xc1 not msgpack"
    writer.write(struct.pack(">I", len(junk)) + junk)
    await writer.drain()
    reply = decode_frame(await read_frame(reader))
    assert isinstance(reply.body, ErrorResponse) and reply.body.code == "INVALID_REQUEST"
    # Same connection, next frame: served normally.
    writer.write(encode_frame(7, DescribeClusterRequest()))
    await writer.drain()
    reply = decode_frame(await read_frame(reader))
    assert reply.correlation_id == 7 and isinstance(reply.body, DescribeClusterResponse)
    writer.close()


async def test_oversized_frame_is_refused_and_the_connection_closed(
    service: ControllerService,
) -> None:
    reader, writer = await _raw(service)
    writer.write(struct.pack(">I", 10 * 1024 * 1024))
    await writer.drain()
    reply = decode_frame(await read_frame(reader))
    assert isinstance(reply.body, ErrorResponse) and reply.body.code == "MESSAGE_TOO_LARGE"
    assert "exceeds" in reply.body.message
    assert await reader.read() == b""  # closed by the server
    writer.close()
    await _still_serving(service)


async def test_truncated_frame_then_disconnect_leaves_the_service_up(
    service: ControllerService,
) -> None:
    _, writer = await _raw(service)
    writer.write(struct.pack(">I", 100) + b"0123456789")
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    await _still_serving(service)


async def test_unknown_broker_and_stale_epoch_get_coded_errors(service: ControllerService) -> None:
    conn = await _connect(service)
    try:
        with pytest.raises(BrokerIdNotRegisteredError):
            await conn.request(
                BrokerHeartbeatRequest(broker_id=42, broker_epoch=0, metadata_offset=0)
            )
        r = await conn.request(RegisterBroker(broker_id=1, incarnation_id="a"))
        assert isinstance(r, RegisterBrokerResponse)
        with pytest.raises(StaleBrokerEpochError):
            await conn.request(
                BrokerHeartbeatRequest(
                    broker_id=1, broker_epoch=r.broker_epoch + 5, metadata_offset=0
                )
            )
        # The same connection still works.
        hb = await conn.request(
            BrokerHeartbeatRequest(broker_id=1, broker_epoch=r.broker_epoch, metadata_offset=0)
        )
        assert isinstance(hb, BrokerHeartbeatResponse) and hb.is_fenced
    finally:
        await conn.close()


async def test_unfence_after_catch_up_then_fence_on_session_expiry(
    service: ControllerService,
) -> None:
    conn = await _connect(service)
    try:
        r = await conn.request(RegisterBroker(broker_id=1, incarnation_id="a"))
        assert isinstance(r, RegisterBrokerResponse)
        hb = await conn.request(
            BrokerHeartbeatRequest(
                broker_id=1, broker_epoch=r.broker_epoch, metadata_offset=r.broker_epoch + 1
            )
        )
        assert isinstance(hb, BrokerHeartbeatResponse) and not hb.is_fenced
        # Stop heartbeating: the session expires and a FenceBrokerRecord is committed.
        store = service.store
        assert store is not None
        offset = store.end_offset
        deadline = asyncio.get_running_loop().time() + 30
        fenced = False
        while not fenced and asyncio.get_running_loop().time() < deadline:
            if await store.wait_for(offset, timeout=1.0):
                entries = await store.read(offset, 100)
                offset = entries[-1].offset + 1
                fenced = any(isinstance(e.record, FenceBrokerRecord) for e in entries)
        assert fenced
    finally:
        await conn.close()


async def test_fetch_returns_committed_records_and_long_polls(service: ControllerService) -> None:
    conn = await _connect(service)
    other = await _connect(service)
    try:
        await conn.request(RegisterBroker(broker_id=1, incarnation_id="a"))
        first = await conn.request(FetchMetadataRequest(from_offset=0, max_wait_ms=0))
        assert isinstance(first, FetchMetadataResponse)
        assert [r.offset for r in first.records] == list(range(first.end_offset))
        # The cluster's bootstrap records come first (docs/lifecycle.md), then the broker's.
        assert isinstance(first.records[0].record, FeatureLevelRecord)
        assert isinstance(first.records[-1].record, RegisterBrokerRecord)
        # A long poll at the end wakes up when the next record commits.
        poll = asyncio.create_task(
            conn.request(FetchMetadataRequest(from_offset=first.end_offset, max_wait_ms=10_000))
        )
        await other.request(RegisterBroker(broker_id=2, incarnation_id="b"))
        woke = await asyncio.wait_for(poll, 10)
        assert isinstance(woke, FetchMetadataResponse)
        assert woke.records and woke.records[0].offset == first.end_offset
        assert isinstance(woke.records[0].record, RegisterBrokerRecord)
        assert woke.records[0].record.broker_id == 2
    finally:
        await conn.close()
        await other.close()
