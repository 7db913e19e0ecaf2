"""A real FrameServer on 127.0.0.1 port 0 whose handler a test scripts."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from protocol.admission import Peer
from protocol.messages.unions import Message
from protocol.server import FrameServer


class Scripted:
    """Answers each request with the next scripted outcome (a Message to return or an
    exception to raise); once the script is spent, defers to `default`. Records every
    request it was asked."""

    def __init__(self) -> None:
        self.script: list[Message | BaseException] = []
        self.requests: list[Message] = []
        self.peers: list[Peer] = []
        self.default: Callable[[Message], Awaitable[Message]] | None = None

    async def __call__(self, body: Message, peer: Peer) -> Message:
        self.requests.append(body)
        self.peers.append(peer)
        if self.script:
            outcome = self.script.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        assert self.default is not None, f"unscripted request {body!r}"
        return await self.default(body)


@pytest.fixture
async def handler() -> Scripted:
    return Scripted()


@pytest.fixture
async def server(handler: Scripted) -> AsyncIterator[FrameServer]:
    srv = FrameServer(handler, max_frame_bytes=4096)
    await srv.start("127.0.0.1:0")
    try:
        yield srv
    finally:
        await srv.stop()
