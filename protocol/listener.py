"""Listening sockets and the accept loop (`Listener`), whatever the listener frames.

`Listener` binds every address a host resolves to, accepts connections in batches
(`ACCEPTS_PER_WAKEUP` a wakeup of the loop, so that handshakes and requests run in
between) and hands each accepted socket to its `admit` callable, which admits it at once
(taking the socket) or says how long to wait: the listener then holds that socket back
and pauses accepting until then, so that a burst of connects cannot cycle a pool within
one wakeup. accept() failures (e.g. out of file descriptors) pause accepting for a
second, logged at most once a second with a count. `close(keep_bound=True)` keeps the
sockets bound, accepting nothing, for a graceful stop (see `close`).

Owns the listening sockets only: what to do with an accepted connection is the
`admit` callable's (`protocol.admission`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from collections.abc import Callable
from typing import Final

from metactl.errors import ListenError
from protocol.address import parse_address
from protocol.limits import ServerStats
from protocol.rate_limited_log import RateLimitedLog
from protocol.sockets import bind, format_address

ACCEPTS_PER_WAKEUP: Final = 128  # then other callbacks (handshakes, requests) run
ACCEPT_PAUSE_S: Final = 1.0  # as asyncio's own server, after EMFILE and the like
_RESOURCE_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

# An accepted socket and its HOST:PORT -> None once admitted (the socket is taken), or
# how long to wait before offering it again (accepting pauses meanwhile).
Admit = Callable[[socket.socket, str], float | None]


class Listener:
    def __init__(self, admit: Admit, stats: ServerStats, log: RateLimitedLog) -> None:
        self.admit = admit
        self.stats = stats
        self.log = log
        self.address = ""
        self.sockets: list[socket.socket] = []
        self._bound: list[socket.socket] = []  # closed, kept bound (`close(keep_bound=True)`)
        self._paused: set[socket.socket] = set()
        self._deferred: dict[socket.socket, tuple[socket.socket, str]] = {}
        # Accept wakeups so far: a connection admitted in the current one has not yet had
        # a chance to speak (`protocol.admission`).
        self.wakeups = 0
        self._resume: dict[socket.socket, asyncio.TimerHandle] = {}

    async def start(self, listen: str) -> str:
        """Bind and start accepting; return the real HOST:PORT (port 0 picks one)."""
        host, port = parse_address(listen)
        loop = asyncio.get_running_loop()
        try:
            self.sockets = await bind(loop, host, port)
        except OSError as exc:
            reason = exc.strerror or (os.strerror(exc.errno) if exc.errno else str(exc))
            raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
        for lsock in self.sockets:
            loop.add_reader(lsock.fileno(), self._accept, lsock)
        sock = self.sockets[0].getsockname()
        self.address = f"{sock[0]}:{sock[1]}"
        return self.address

    def _accept(self, lsock: socket.socket) -> None:
        """The listener is readable (or a pause ended): accept a batch, each connection
        offered to `admit` at once. When it is to wait, accepting pauses until then, the
        held-back connection offered first."""
        self.wakeups += 1
        for _ in range(ACCEPTS_PER_WAKEUP):
            deferred = self._deferred.pop(lsock, None)
            if deferred is not None:
                sock, address = deferred
            else:
                try:
                    sock, peername = lsock.accept()
                except (BlockingIOError, InterruptedError):
                    return
                except ConnectionAbortedError:
                    continue
                except OSError as exc:
                    self._accept_failed(lsock, exc)
                    return
                sock.setblocking(False)
                self.stats.accepted_total += 1
                address = format_address(peername)
            wait = self.admit(sock, address)
            if wait is not None:
                self._deferred[lsock] = (sock, address)
                self._pause(lsock, wait)
                return

    def _pause(self, lsock: socket.socket, delay: float) -> None:
        """Stop accepting on `lsock` for `delay` seconds; then accept again (the
        deferred connection first, even if no new one is waiting)."""
        if lsock in self._paused:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(lsock.fileno())
        self._paused.add(lsock)

        def resume() -> None:
            self._paused.discard(lsock)
            self._resume.pop(lsock, None)
            if lsock in self.sockets:
                loop.add_reader(lsock.fileno(), self._accept, lsock)
                self._accept(lsock)

        self._resume[lsock] = loop.call_later(delay, resume)

    def _accept_failed(self, lsock: socket.socket, exc: OSError) -> None:
        """accept() failed: out of descriptors or memory pauses accepting for a second (as
        asyncio's own server does), logged at most once a second with a count."""
        self.stats.closed_total["accept_error"] += 1
        self.log.warning("accept failed; pausing accepts", error=repr(exc))
        if exc.errno in _RESOURCE_ERRNOS:
            self._pause(lsock, ACCEPT_PAUSE_S)

    def close(self, *, keep_bound: bool = False) -> None:
        """Stop accepting new connections. With `keep_bound` the listening sockets stay
        bound, accepting nothing, until `release`: a connect to the port still succeeds
        (in the kernel's backlog) instead of being refused, so a standby watching this
        active controller (`controller.runtime.dead_active`) does not take a graceful
        stop for a death while the log drains and the leadership is resigned."""
        listeners, self.sockets = self.sockets, []
        with contextlib.suppress(RuntimeError):  # the loop is gone: nothing to unregister
            loop = asyncio.get_running_loop()
            for lsock in listeners:
                if lsock not in self._paused:
                    loop.remove_reader(lsock.fileno())
        for handle in self._resume.values():
            handle.cancel()
        self._resume.clear()
        self._paused.clear()
        for lsock in listeners:
            if keep_bound:
                self._bound.append(lsock)
            else:
                lsock.close()
        for sock, _ in self._deferred.values():
            sock.close()
        self._deferred.clear()

    def release(self) -> None:
        """Close the listening sockets `close(keep_bound=True)` kept (connections waiting
        in their backlog are reset)."""
        bound, self._bound = self._bound, []
        for lsock in bound:
            lsock.close()
