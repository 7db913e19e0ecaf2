"""The broker's listener over real TCP on 127.0.0.1 (ephemeral port).

GetReplicaLogInfo as the controller sends it during unclean recovery, and bad input:
each bad connection is answered or closed, and the listener keeps serving others.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from brokers_stub.broker import Broker
from brokers_stub.replica_log import ReplicaLog
from metactl.errors import InvalidRequestError, StaleBrokerEpochError
from protocol.address import parse_address
from protocol.client import RpcClient
from protocol.codec import decode_frame, encode_frame
from protocol.messages.base import ErrorResponse
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    ReplicaRef,
)
from protocol.messages.unions import Message
from protocol.transport import read_frame
from tests.brokers_stub.helpers import TOPIC, config

MAX_FRAME = 4096


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    b = Broker(config(tmp_path, 1, max_frame_bytes=MAX_FRAME))
    b.epoch = 7
    b.replicas.logs[(TOPIC, 0)] = ReplicaLog(
        topic=TOPIC, partition=0, leader_epochs=[(0, 0), (5, 40)], log_end_offset=52
    )
    await b.server.start("127.0.0.1:0")
    yield b
    await b.server.stop()


async def connect(address: str) -> RpcClient:
    host, port = parse_address(address)
    return await RpcClient.open(host, port)


async def log_info(address: str, epoch: int) -> Message:
    conn = await connect(address)
    try:
        return await conn.request(
            GetReplicaLogInfoRequest(
                broker_id=1,
                broker_epoch=epoch,
                partitions=[ReplicaRef(TOPIC, 0), ReplicaRef("other", 2)],
            )
        )
    finally:
        await conn.close()


async def raw(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = parse_address(address)
    return await asyncio.open_connection(host, port)


async def test_replica_log_info(broker: Broker) -> None:
    resp = await log_info(broker.server.address, 7)
    assert isinstance(resp, GetReplicaLogInfoResponse)
    assert (resp.broker_id, resp.broker_epoch) == (1, 7)
    known, unknown = resp.partitions
    assert (known.topic, known.partition) == (TOPIC, 0)
    assert (known.last_leader_epoch, known.log_end_offset, known.error_code) == (5, 52, None)
    assert (unknown.topic, unknown.partition) == ("other", 2)
    assert unknown.error_code == "UNKNOWN_TOPIC_OR_PARTITION"


async def test_replica_log_info_at_a_stale_epoch_is_refused(broker: Broker) -> None:
    with pytest.raises(StaleBrokerEpochError):
        await log_info(broker.server.address, 6)
    broker.epoch = None  # not registered (yet): every epoch is stale
    with pytest.raises(StaleBrokerEpochError):
        await log_info(broker.server.address, 7)


async def test_requests_a_broker_does_not_serve(broker: Broker) -> None:
    conn = await connect(broker.server.address)
    try:
        with pytest.raises(InvalidRequestError):
            await conn.request(
                BrokerHeartbeatRequest(broker_id=1, broker_epoch=7, metadata_offset=0)
            )
        with pytest.raises(InvalidRequestError):  # another broker's id
            await conn.request(GetReplicaLogInfoRequest(broker_id=2, broker_epoch=7, partitions=[]))
        # The same connection still serves.
        resp = await conn.request(
            GetReplicaLogInfoRequest(broker_id=1, broker_epoch=7, partitions=[])
        )
        assert isinstance(resp, GetReplicaLogInfoResponse)
    finally:
        await conn.close()


async def test_malformed_frame_gets_invalid_request_and_the_connection_serves_on(
    broker: Broker,
) -> None:
    reader, writer = await raw(broker.server.address)
    try:
        junk = b"\x93\xff\x00not msgpack at all"
        writer.write(struct.pack(">I", len(junk)) + junk)
        await writer.drain()
        frame = decode_frame(await read_frame(reader))
        assert isinstance(frame.body, ErrorResponse)
        assert frame.body.code == "INVALID_REQUEST"
        # A well-formed request on the same connection is answered normally.
        writer.write(
            encode_frame(41, GetReplicaLogInfoRequest(broker_id=1, broker_epoch=7, partitions=[]))
        )
        await writer.drain()
        frame = decode_frame(await read_frame(reader))
        assert frame.correlation_id == 41
        assert isinstance(frame.body, GetReplicaLogInfoResponse)
    finally:
        writer.close()


async def test_oversized_frame_closes_the_connection_cleanly(broker: Broker) -> None:
    reader, writer = await raw(broker.server.address)
    try:
        writer.write(struct.pack(">I", MAX_FRAME + 1))
        await writer.drain()
        frame = decode_frame(await read_frame(reader))  # told why, then closed
        assert isinstance(frame.body, ErrorResponse)
        assert frame.body.code == "MESSAGE_TOO_LARGE"
        assert await reader.read() == b""  # EOF: a clean close, not a reset
    finally:
        writer.close()
    assert isinstance(await log_info(broker.server.address, 7), GetReplicaLogInfoResponse)


async def test_truncated_frame_closes_only_that_connection(broker: Broker) -> None:
    reader, writer = await raw(broker.server.address)
    writer.write(struct.pack(">I", 100) + b"only ten b")
    await writer.drain()
    writer.write_eof()
    assert await reader.read() == b""
    writer.close()
    assert isinstance(await log_info(broker.server.address, 7), GetReplicaLogInfoResponse)


async def test_stop_closes_idle_connections(broker: Broker) -> None:
    reader, writer = await raw(broker.server.address)
    await broker.server.stop()
    assert await reader.read() == b""
    writer.close()
