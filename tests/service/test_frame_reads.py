"""The frame server's reads (`protocol.server`): requests sent together, or a request
cut anywhere across writes, are each answered once, in order; the frame deadline runs
from a frame's first byte however the frame trickles in; and a pipelining client that
does not read its answers stops the server reading (it waits for the socket to take an
answer before it reads the next request, draining only when the socket left bytes
behind), so the requests pile up in the client's buffers, not as answers in the
server's memory."""

from __future__ import annotations

import asyncio
import contextlib

from protocol.address import parse_address
from protocol.admission import Peer
from protocol.codec import decode_frame, encode_frame
from protocol.limits import ServerLimits
from protocol.messages.admin import DescribeClusterRequest
from protocol.messages.base import ErrorResponse
from protocol.messages.unions import Message
from protocol.server import FrameServer
from protocol.transport import read_frame

REQUESTS = 2_000
ANSWER_BYTES = 32 * 1024  # 2,000 of them: 64 MiB, far past any socket buffer
# Answers that can be on their way at once: the server transport's high-water mark (64
# KiB) and the two sockets' buffers (a few MiB on loopback) hold a few hundred of them.
IN_FLIGHT = 600


async def test_a_client_that_does_not_read_stops_the_server_reading() -> None:
    handled = 0

    async def handler(body: Message, peer: Peer) -> Message:
        nonlocal handled
        handled += 1
        return ErrorResponse(code="NONE", message=f"{handled:08d}" + "x" * ANSWER_BYTES)

    server = FrameServer(handler, max_frame_bytes=1 << 20)
    await server.start("127.0.0.1:0")
    reader, writer = await asyncio.open_connection(*parse_address(server.address))
    try:
        request = encode_frame(0, DescribeClusterRequest())
        for _ in range(REQUESTS):
            writer.write(request)  # the client pipelines every request before reading
        await writer.drain()
        numbers = []
        for read in range(REQUESTS):
            # The server reads a request only once the socket took the previous answer:
            # never more than the buffers hold ahead of what the client has read.
            assert handled <= read + IN_FLIGHT
            body = decode_frame(await read_frame(reader, 1 << 20)).body
            assert isinstance(body, ErrorResponse)
            numbers.append(int(body.message[:8]))
        assert numbers == list(range(1, REQUESTS + 1)) and handled == REQUESTS
    finally:
        writer.close()
        await server.stop()


async def counting_server(**limits: float) -> tuple[FrameServer, list[int]]:
    """A server answering each request with its number (1, 2, ...)."""
    seen: list[int] = []

    async def handler(body: Message, peer: Peer) -> Message:
        seen.append(len(seen) + 1)
        return ErrorResponse(code="NONE", message=str(len(seen)))

    server = FrameServer(handler, limits=ServerLimits(**limits))
    await server.start("127.0.0.1:0")
    return server, seen


async def test_frames_sent_together_or_cut_anywhere_are_each_answered_in_order() -> None:
    server, seen = await counting_server()
    reader, writer = await asyncio.open_connection(*parse_address(server.address))
    try:
        frames = b"".join(encode_frame(i, DescribeClusterRequest()) for i in range(1, 7))
        writer.write(frames[:1])  # the first byte alone
        await writer.drain()
        writer.write(frames[1:3])  # more of the header, not all of it
        await writer.drain()
        writer.write(frames[3:-5])  # the first frame's end, four more, half of the last
        await writer.drain()
        writer.write(frames[-5:])
        await writer.drain()
        answers = [decode_frame(await read_frame(reader)) for _ in range(6)]
        assert [a.correlation_id for a in answers] == [1, 2, 3, 4, 5, 6]
        assert [a.body.message for a in answers if isinstance(a.body, ErrorResponse)] == [
            str(i) for i in range(1, 7)
        ]
        assert seen == [1, 2, 3, 4, 5, 6]
    finally:
        writer.close()
        await server.stop()


async def test_the_frame_deadline_runs_from_the_first_byte_however_the_frame_trickles_in() -> None:
    """Each byte arrives well within the deadline, the frame as a whole does not: the
    connection is closed (a read does not restart the frame's deadline)."""
    server, seen = await counting_server(idle_timeout_s=30, frame_deadline_s=0.3)
    reader, writer = await asyncio.open_connection(*parse_address(server.address))
    try:
        frame = encode_frame(1, DescribeClusterRequest())
        closed = False
        for i in range(len(frame)):
            try:
                writer.write(frame[i : i + 1])
                await writer.drain()
            except ConnectionError:
                closed = True
                break
            await asyncio.sleep(0.1)  # pacing: a byte per 0.1 s, the frame takes seconds
        if not closed:
            with contextlib.suppress(ConnectionError):  # a reset is a close too
                assert await reader.read() == b""
        assert server.stats.closed_total["frame_deadline"] == 1
        assert seen == []
    finally:
        writer.close()
        await server.stop()
