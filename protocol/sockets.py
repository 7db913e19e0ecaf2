"""A listener's socket plumbing, whatever it frames: listening sockets on every address
(`bind`), asyncio streams over an accepted socket, after a server-side TLS handshake
(`streams`), and ending connections: with a reset (`abort`, `linger_reset`), after a
failed or cancelled handshake (`let_go`, `unlink`), or closing streams within a bound
(`close`).

Owns no policy: whom to admit, and when to close, is `protocol.admission`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
import traceback
from collections.abc import Callable
from typing import Any, Final

from protocol.limits import DEFAULT_HANDSHAKE_TIMEOUT_S

CLOSE_WAIT_S: Final = 1.0
# An established TLS connection being closed waits this long for the peer's close_notify
# (asyncio's default is 30 s, holding the connection's buffers all along).
SSL_SHUTDOWN_TIMEOUT_S: Final = 2.0
LISTEN_BACKLOG: Final = 1024


async def bind(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address `host` resolves to (as asyncio.start_server)."""
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, type_, proto, _, sockaddr in dict.fromkeys(infos):
            s = socket.socket(family, type_, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(sockaddr)
            s.listen(LISTEN_BACKLOG)
            s.setblocking(False)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


class TellingProtocol(asyncio.StreamReaderProtocol):
    """A StreamReaderProtocol that hands its transport to `on_made` as it is made."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        loop: asyncio.AbstractEventLoop,
        on_made: Callable[[asyncio.BaseTransport], None] | None,
    ) -> None:
        super().__init__(reader, loop=loop)
        self._on_made = on_made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._on_made is not None:
            self._on_made(transport)
        super().connection_made(transport)


async def streams(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    ctx: ssl.SSLContext | None,
    handshake_timeout_s: float | None = None,
    on_made: Callable[[asyncio.BaseTransport], None] | None = None,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Streams over an accepted socket, after a server-side TLS handshake with `ctx`;
    `on_made` is told the transport as soon as it exists."""
    reader = asyncio.StreamReader(loop=loop)
    protocol = TellingProtocol(reader, loop, on_made)
    if ctx is None:
        transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock)
    else:
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol,
            sock,
            ssl=ctx,
            # asyncio.timeout bounds it; this only keeps asyncio's own 60 s out of the way.
            ssl_handshake_timeout=(handshake_timeout_s or DEFAULT_HANDSHAKE_TIMEOUT_S) + 1.0,
            ssl_shutdown_timeout=SSL_SHUTDOWN_TIMEOUT_S,
        )
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def format_address(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return str(peername)


def unlink(exc: BaseException) -> None:
    """Break the reference cycle a failed handshake leaves: the exception's traceback holds
    asyncio's frames, one of which holds the future that holds the exception. Left to the
    cyclic garbage collector, each cycle keeps the connection's SSL state (about 270 KB)
    alive until a full collection, which a quiet process may not run for a long time."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)  # running frames are skipped
            e.__traceback__ = None
        todo += [e.__cause__, e.__context__]


def linger_reset(sock: socket.socket) -> None:
    """Make the socket's close send a reset rather than a FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def let_go(sock: socket.socket, made: list[asyncio.BaseTransport]) -> None:
    """A handshake's connection once it failed or was cancelled: its transport, if the
    handshake made one, is aborted (a reset; the transport closes the socket); else the
    socket is left to whatever transport asyncio built during the handshake
    (`leave_to_transport`)."""
    if made:
        linger_reset(sock)
        made[0].abort()  # type: ignore[attr-defined]
    else:
        leave_to_transport(sock)


def leave_to_transport(sock: socket.socket) -> None:
    """A handshake's socket once the handshake failed or was cancelled: asyncio's
    transport closes it (at once after an abort, within SSL_SHUTDOWN_TIMEOUT_S after a
    flush), with a reset. Closing it here could close a descriptor that a live transport
    still polls, and whose number a new connection may then get. Should no transport
    have taken it, it is closed a little later (closing a closed socket does nothing)."""
    linger_reset(sock)
    with contextlib.suppress(RuntimeError):
        loop = asyncio.get_running_loop()
        loop.call_later(SSL_SHUTDOWN_TIMEOUT_S + CLOSE_WAIT_S, abort, sock)


def abort(sock: socket.socket) -> None:
    linger_reset(sock)
    with contextlib.suppress(OSError):
        sock.close()


async def close(writer: asyncio.StreamWriter) -> None:
    """Close and wait a little, swallowing a cancellation too: a connection task must not
    end cancelled. The wait is bounded (a TLS peer may never answer the close)."""
    writer.close()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await writer.wait_closed()
