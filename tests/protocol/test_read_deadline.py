"""The frame server's read deadlines (`protocol.server._Deadline`): one timer per
connection, moved with each read, never running while a request is answered, and never
taken for the server's own cancellation."""

from __future__ import annotations

import asyncio

from protocol.address import parse_address
from protocol.codec import encode_frame
from protocol.limits import ServerLimits
from protocol.messages.admin import DescribeClusterRequest, DescribeClusterResponse
from protocol.messages.unions import Message
from protocol.server import FrameServer
from protocol.transport import read_frame
from tests.protocol.conftest import Scripted

EMPTY = DescribeClusterResponse(brokers=[], partitions=[], end_offset=0, committed_offset=0)


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read(1) == b""
    except ConnectionError:
        return True


async def test_a_connection_speaking_within_its_idle_timeout_stays_open(
    handler: Scripted,
) -> None:
    """Each request moves the deadline later than the timer armed for the first: the
    timer re-arms instead of closing the connection."""

    async def answer(body: Message) -> Message:
        return EMPTY

    handler.default = answer
    srv = FrameServer(handler, limits=ServerLimits(idle_timeout_s=0.15, frame_deadline_s=0.1))
    await srv.start("127.0.0.1:0")
    try:
        reader, writer = await asyncio.open_connection(*parse_address(srv.address))
        for i in range(12):  # 0.6 s in all: four idle timeouts
            writer.write(encode_frame(i, DescribeClusterRequest()))
            await writer.drain()
            await read_frame(reader)
            await asyncio.sleep(0.05)
        assert len(handler.requests) == 12
        assert srv.stats.closed_total["idle_timeout"] == 0
        assert await _closed_by_server(reader)  # and then, silent, it is closed
        assert srv.stats.closed_total["idle_timeout"] == 1
        writer.close()
    finally:
        await srv.stop()


async def test_no_deadline_runs_while_a_request_is_answered(handler: Scripted) -> None:
    async def slow(body: Message) -> Message:
        await asyncio.sleep(0.3)  # past both deadlines
        return EMPTY

    handler.default = slow
    srv = FrameServer(handler, limits=ServerLimits(idle_timeout_s=0.1, frame_deadline_s=0.05))
    await srv.start("127.0.0.1:0")
    try:
        reader, writer = await asyncio.open_connection(*parse_address(srv.address))
        writer.write(encode_frame(7, DescribeClusterRequest()))
        await writer.drain()
        assert await read_frame(reader)
        assert srv.stats.closed_total["idle_timeout"] == 0
        assert srv.stats.closed_total["frame_deadline"] == 0
        writer.close()
    finally:
        await srv.stop()


async def test_a_frame_deadline_shorter_than_the_idle_timeout_cuts_in(
    handler: Scripted,
) -> None:
    """The frame deadline comes sooner than the timer armed for the idle timeout."""
    srv = FrameServer(handler, limits=ServerLimits(idle_timeout_s=30, frame_deadline_s=0.05))
    await srv.start("127.0.0.1:0")
    try:
        reader, writer = await asyncio.open_connection(*parse_address(srv.address))
        writer.write(encode_frame(1, DescribeClusterRequest())[:3])
        await writer.drain()
        async with asyncio.timeout(5):
            assert await _closed_by_server(reader)
        assert srv.stats.closed_total["frame_deadline"] == 1
        writer.close()
    finally:
        await srv.stop()


async def test_stopping_the_server_is_no_timeout(handler: Scripted) -> None:
    srv = FrameServer(handler, limits=ServerLimits(idle_timeout_s=30))
    await srv.start("127.0.0.1:0")
    reader, writer = await asyncio.open_connection(*parse_address(srv.address))
    await asyncio.sleep(0.05)  # the server waits for its first byte
    await srv.stop()
    assert await _closed_by_server(reader)
    assert srv.stats.closed_total["idle_timeout"] == 0
    assert srv.stats.open_connections == 0
    writer.close()
