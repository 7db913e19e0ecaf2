"""The one server loop: coded errors, unexpected exceptions, bad frames, versions."""

from __future__ import annotations

import asyncio
import struct

import msgspec
from structlog.testing import capture_logs

from metactl.errors import StaleBrokerEpochError
from protocol.address import parse_address
from protocol.codec import decode_frame, encode_frame
from protocol.messages.admin import (
    DescribeClusterRequest,
    DescribeClusterResponse,
    PartitionState,
)
from protocol.messages.base import ErrorResponse
from protocol.messages.unions import Message
from protocol.server import FrameServer
from protocol.transport import read_frame
from tests.protocol.conftest import Scripted

EMPTY = DescribeClusterResponse(brokers=[], partitions=[], end_offset=0, committed_offset=0)


async def raw(server: FrameServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*parse_address(server.address))


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> Message:
    writer.write(data)
    await writer.drain()
    return decode_frame(await read_frame(reader)).body


async def test_answers_keep_the_correlation_id(server: FrameServer, handler: Scripted) -> None:
    handler.script = [EMPTY]
    reader, writer = await raw(server)
    writer.write(encode_frame(77, DescribeClusterRequest()))
    await writer.drain()
    frame = decode_frame(await read_frame(reader))
    assert (frame.correlation_id, frame.body) == (77, EMPTY)
    writer.close()


async def test_a_coded_error_is_answered_with_its_code(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [StaleBrokerEpochError("old epoch"), EMPTY]
    reader, writer = await raw(server)
    body = await ask(reader, writer, encode_frame(1, DescribeClusterRequest()))
    assert body == ErrorResponse(code="STALE_BROKER_EPOCH", message="old epoch", retriable=False)
    assert await ask(reader, writer, encode_frame(2, DescribeClusterRequest())) == EMPTY
    writer.close()


async def test_an_unexpected_exception_is_logged_and_the_connection_keeps_serving(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [ZeroDivisionError("oops"), EMPTY]
    reader, writer = await raw(server)
    with capture_logs() as logs:
        body = await ask(reader, writer, encode_frame(1, DescribeClusterRequest()))
    assert isinstance(body, ErrorResponse) and body.code == "UNKNOWN_SERVER_ERROR"
    failed = [e for e in logs if e["event"] == "request handler failed"]
    assert failed and failed[0]["log_level"] == "error" and failed[0]["exc_info"] is True
    assert await ask(reader, writer, encode_frame(2, DescribeClusterRequest())) == EMPTY
    writer.close()


async def test_undecodable_frames_get_a_coded_error_and_keep_the_connection(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [EMPTY]
    reader, writer = await raw(server)
    for junk in (
        bytes.fromhex("920182a474797065af4465736372696265436c7573746572a5746f706963a2fffe"),
        b"\x92\x01\x82\xa4type\xafDescribeCluster\xa2zz" + b"\x91" * 1000 + b"\xc0",
        b"not msgpack at all",
    ):
        body = await ask(reader, writer, struct.pack(">I", len(junk)) + junk)
        assert isinstance(body, ErrorResponse) and body.code == "INVALID_REQUEST"
    assert await ask(reader, writer, encode_frame(5, DescribeClusterRequest())) == EMPTY
    assert len(handler.requests) == 1
    writer.close()


async def test_an_unsupported_version_is_answered_under_its_correlation_id(
    server: FrameServer, handler: Scripted
) -> None:
    handler.script = [EMPTY]
    reader, writer = await raw(server)
    payload = msgspec.msgpack.encode([31, {"type": "DescribeCluster", "v": 99}])
    writer.write(struct.pack(">I", len(payload)) + payload)
    await writer.drain()
    frame = decode_frame(await read_frame(reader))
    assert frame.correlation_id == 31
    assert isinstance(frame.body, ErrorResponse) and frame.body.code == "UNSUPPORTED_VERSION"
    assert handler.requests == []
    assert await ask(reader, writer, encode_frame(32, DescribeClusterRequest())) == EMPTY
    writer.close()


async def test_an_oversized_frame_is_answered_then_closed(server: FrameServer) -> None:
    reader, writer = await raw(server)
    body = await ask(reader, writer, struct.pack(">I", 4097))
    assert isinstance(body, ErrorResponse) and body.code == "MESSAGE_TOO_LARGE"
    assert await reader.read() == b""
    writer.close()


async def test_an_answer_over_the_frame_limit_is_refused_by_name_and_the_connection_serves_on(
    server: FrameServer, handler: Scripted
) -> None:
    """A handler's answer larger than the frame limit (4,096 bytes here) never leaves as a
    frame the client could not read: MESSAGE_TOO_LARGE under the request's correlation id,
    one log line, and the next request on the connection is answered."""
    partition = PartitionState(
        topic="t" * 200, partition=0, replicas=[1], leader=1, leader_epoch=0,
        partition_epoch=0, isr=[1],
    )  # fmt: skip
    big = msgspec.structs.replace(EMPTY, partitions=[partition] * 40)
    assert len(encode_frame(5, big)) > 4096
    handler.script = [big, EMPTY]
    reader, writer = await raw(server)
    with capture_logs() as logs:
        writer.write(encode_frame(5, DescribeClusterRequest()))
        await writer.drain()
        frame = decode_frame(await read_frame(reader))
    assert frame.correlation_id == 5
    assert isinstance(frame.body, ErrorResponse) and frame.body.code == "MESSAGE_TOO_LARGE"
    assert "DescribeClusterResponse" in frame.body.message
    assert [e["event"] for e in logs] == ["answer over the frame limit; refused"]
    assert await ask(reader, writer, encode_frame(6, DescribeClusterRequest())) == EMPTY
    writer.close()


async def test_stop_ends_open_connections(server: FrameServer, handler: Scripted) -> None:
    started = asyncio.Event()

    async def hang(body: Message) -> Message:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    handler.default = hang
    reader, writer = await raw(server)
    writer.write(encode_frame(1, DescribeClusterRequest()))
    await writer.drain()
    await started.wait()
    await server.stop()
    assert await reader.read() == b""
    writer.close()
