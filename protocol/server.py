"""The one server loop: frames in, one handler call per request, frames out.

Used by the controller service and by brokers. `FrameServer` accepts connections, reads
frames, decodes them with the codec, awaits `handler(message)` and writes its answer
under the request's correlation id; one connection carries one request at a time,
answered in order. It never crashes on bad input or a failing handler:

- the handler raises a `MetactlError`: the answer is an `ErrorResponse` with its code;
- the handler raises anything else: UNKNOWN_SERVER_ERROR, logged with its traceback;
- an undecodable frame: INVALID_REQUEST with correlation id 0 (frame boundaries are
  intact, so the connection keeps serving); a message version the codec refuses:
  UNSUPPORTED_VERSION under the frame's correlation id;
- an oversized frame: MESSAGE_TOO_LARGE, then the connection is closed (the stream
  cannot be resynchronised); a truncated frame (EOF mid-frame) closes it, logged.

Every connection is bounded (`ServerLimits`, each a flag of the processes that serve):

- at most `max_connections` open (lowered to fit the file-descriptor limit), and
  `max_connections_per_peer` per principal (under TLS) or per address (without, and
  during a TLS handshake): one over is closed at once, counted, and logged at most once
  a second. TLS starts only after a connection is admitted, and a handshake must finish
  within `handshake_timeout_s`, so connections that never authenticate cannot hold
  descriptors for long;
- `idle_timeout_s` without a request closes a connection; once a frame's first byte has
  arrived, the whole frame must arrive within `frame_deadline_s` (slowloris);
- requests in flight per connection: one. The loop reads the next frame only after
  answering the previous one, as Kafka's broker mutes a channel until its response is
  sent, so a pipelining client fills its own socket buffer, not the server's memory;
- accept() failures (e.g. out of file descriptors) are logged at most once a second with
  a count, never as a traceback per attempt; a burst's held-back count is told one
  second later even if nothing else happens.

With an `ssl` context (protocol/tls.py) every connection is mutual TLS and the handler
learns the peer's principal from its certificate; without one the principal is None.

This module owns sockets for incoming requests. What to answer, and whether a principal
may ask it, is the handler's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import resource
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import structlog

from metactl.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    ListenError,
    MetactlError,
    UnsupportedVersionError,
)
from protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_BYTES,
    decode_frame,
    encode_frame,
    frame_length,
    parse_address,
)
from protocol.messages import ErrorResponse, Message, error_response
from protocol.tls import principal_of


@dataclass(frozen=True)
class Peer:
    """Who sent a request: the remote address, and the principal its verified certificate
    names (None without TLS)."""

    address: str
    principal: str | None = None

    @property
    def name(self) -> str:
        """The principal, or the address when there is none (for limits and logs)."""
        return self.principal if self.principal is not None else self.address.rsplit(":", 1)[0]


Handler = Callable[[Message, Peer], Awaitable[Message]]


class Logger(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...
    def exception(self, event: str, **kw: Any) -> Any: ...


DEFAULT_MAX_CONNECTIONS: Final = 1000
DEFAULT_MAX_CONNECTIONS_PER_PEER: Final = 200
DEFAULT_IDLE_TIMEOUT_S: Final = 600.0  # Kafka's connections.max.idle.ms
DEFAULT_FRAME_DEADLINE_S: Final = 30.0
DEFAULT_HANDSHAKE_TIMEOUT_S: Final = 10.0
CLOSE_WAIT_S: Final = 1.0
FD_RESERVE: Final = 64  # descriptors kept for the log, outgoing clients and listeners


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_peer: int = DEFAULT_MAX_CONNECTIONS_PER_PEER
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    frame_deadline_s: float = DEFAULT_FRAME_DEADLINE_S
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_connections_per_peer) < 1 or (
            min(self.idle_timeout_s, self.frame_deadline_s, self.handshake_timeout_s) <= 0
        ):
            raise ValueError(f"invalid server limits {self}")


@dataclass
class ServerStats:
    """Counters a metrics module reads (the server itself exports nothing)."""

    open_connections: int = 0
    accepted_total: int = 0
    # reason -> count: "max_connections", "max_connections_per_peer", "handshake_failed",
    # "handshake_timeout", "no_principal", "idle_timeout", "frame_deadline",
    # "oversized_frame", "truncated_frame", "accept_error"
    closed_total: Counter[str] = field(default_factory=Counter)
    bad_frames_total: int = 0


class _RateLimitedLog:
    """At most one line a second per event, with the count it stands for. What is held
    back is still told: a summary line (`count` of the held-back ones, the latest
    fields) follows one period after the first line of a burst, even if nothing more
    happens."""

    def __init__(self, log: Logger, period_s: float = 1.0) -> None:
        self.log = log
        self.period_s = period_s
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()
        self._fields: dict[str, dict[str, Any]] = {}
        self._flush: dict[str, asyncio.TimerHandle] = {}

    def warning(self, event: str, **kw: Any) -> None:
        now = time.monotonic()
        last = self._last.get(event, -1e9)
        if now - last < self.period_s:
            self._suppressed[event] += 1
            self._fields[event] = kw
            if event not in self._flush:
                with contextlib.suppress(RuntimeError):  # no running loop: next line tells
                    loop = asyncio.get_running_loop()
                    self._flush[event] = loop.call_later(
                        last + self.period_s - now, self._summary, event
                    )
            return
        self._emit(event, now, kw)

    def _emit(self, event: str, now: float, kw: dict[str, Any]) -> None:
        self._last[event] = now
        handle = self._flush.pop(event, None)
        if handle is not None:
            handle.cancel()
        self._fields.pop(event, None)
        count = self._suppressed.pop(event, 0) + 1
        self.log.warning(event, count=count, **kw)

    def _summary(self, event: str) -> None:
        self._flush.pop(event, None)
        held = self._suppressed.pop(event, 0)
        if held:
            self._last[event] = time.monotonic()
            self.log.warning(event, count=held, **self._fields.pop(event, {}))


class FrameServer:
    def __init__(
        self,
        handler: Handler,
        *,
        log: Logger | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        ssl: ssl.SSLContext | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.handler = handler
        self.log: Logger = log if log is not None else structlog.get_logger("metactl.protocol")
        self.max_frame_bytes = max_frame_bytes
        self.ssl = ssl
        self.limits = limits if limits is not None else ServerLimits()
        self.stats = ServerStats()
        self.address = ""
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()
        self._per_peer: Counter[str] = Counter()
        self._throttled = _RateLimitedLog(self.log)

    async def start(self, listen: str) -> str:
        """Bind and start accepting; return the real HOST:PORT (port 0 picks one)."""
        host, port = parse_address(listen)
        self._install_accept_error_handler()
        self._clamp_to_descriptor_limit()
        # TLS is started per connection (`_handshake`), after admission, so a connection
        # that never completes its handshake still counts against the limits.
        try:
            self._server = await asyncio.start_server(self.serve_connection, host, port)
        except OSError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise ListenError(f"cannot listen on {host}:{port}: {reason}") from None
        sock = self._server.sockets[0].getsockname()
        self.address = f"{sock[0]}:{sock[1]}"
        return self.address

    def _clamp_to_descriptor_limit(self) -> None:
        """Keep `max_connections` below the process's file-descriptor limit, with room for
        the log, clients and listeners, so a flood meets the server's own cap (closed and
        counted) rather than EMFILE at accept()."""
        try:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        except (OSError, ValueError):  # pragma: no cover - every POSIX has it
            return
        if soft == resource.RLIM_INFINITY:
            return
        room = max(1, soft - FD_RESERVE)
        if self.limits.max_connections > room:
            self.log.warning(
                "max connections lowered to fit the file-descriptor limit",
                configured=self.limits.max_connections,
                effective=room,
                nofile=soft,
            )
            self.limits = dataclasses.replace(
                self.limits,
                max_connections=room,
                max_connections_per_peer=min(room, self.limits.max_connections_per_peer),
            )

    def _install_accept_error_handler(self) -> None:
        """asyncio reports a failed accept() (EMFILE, ENFILE, ENOBUFS, ENOMEM) to the loop's
        exception handler, whose default logs a traceback per attempt; it then pauses
        accepting for a second. Log those at most once a second, with a count; pass
        everything else on."""
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()
        if getattr(previous, "_metactl_accept_errors", False):
            return

        def handle(lp: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            message = str(context.get("message", ""))
            if message.startswith("socket.accept() out of system resource"):
                self.stats.closed_total["accept_error"] += 1
                exc = context.get("exception")
                self._throttled.warning("accept failed; pausing accepts", error=repr(exc))
                return
            if previous is not None:
                previous(lp, context)
            else:
                lp.default_exception_handler(context)

        handle._metactl_accept_errors = True  # type: ignore[attr-defined]
        loop.set_exception_handler(handle)

    def close(self) -> None:
        """Stop accepting new connections (open ones keep serving until `stop`)."""
        if self._server is not None:
            self._server.close()

    async def stop(self) -> None:
        """Stop accepting, end every open connection, and wait for their tasks."""
        self.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def _refuse(self, key: str) -> str | None:
        """None if one more connection counted under `key` fits, else the limit it breaks."""
        if self.stats.open_connections >= self.limits.max_connections:
            return "max_connections"
        if self._per_peer[key] >= self.limits.max_connections_per_peer:
            return "max_connections_per_peer"
        return None

    def _release_peer(self, key: str) -> None:
        """One connection fewer under `key`; a key with none left is forgotten, so that
        the table holds only peers with open connections."""
        self._per_peer[key] -= 1
        if self._per_peer[key] <= 0:
            del self._per_peer[key]

    async def _handshake(self, writer: asyncio.StreamWriter, peer: Peer) -> Peer | None:
        """Mutual TLS on an admitted connection, within the handshake timeout; the peer
        with its principal, or None (failure, timeout, or a certificate naming nobody)."""
        assert self.ssl is not None
        try:
            async with asyncio.timeout(self.limits.handshake_timeout_s):
                await writer.start_tls(self.ssl)
        except (TimeoutError, OSError) as exc:  # ssl.SSLError is an OSError
            reason = "handshake_timeout" if isinstance(exc, TimeoutError) else "handshake_failed"
            self.stats.closed_total[reason] += 1
            self._throttled.warning(f"TLS {reason.replace('_', ' ')}", peer=peer.name)
            return None
        principal = principal_of(writer.get_extra_info("peercert"))
        if principal is None:
            self.stats.closed_total["no_principal"] += 1
            self._throttled.warning("TLS certificate names no principal", peer=peer.name)
            return None
        return Peer(peer.address, principal)

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        peer = Peer(_format_address(writer.get_extra_info("peername")))
        key = peer.name  # the address until a certificate names a principal
        refused = self._refuse(key)
        if refused is not None:
            self.stats.closed_total[refused] += 1
            self._throttled.warning(f"connection refused: {refused}", peer=key)
            await _close(writer)
            return
        if task is not None:
            self._connections.add(task)
        self.stats.accepted_total += 1
        self.stats.open_connections += 1
        self._per_peer[key] += 1
        try:
            if self.ssl is not None:
                authenticated = await self._handshake(writer, peer)
                if authenticated is None:
                    return
                peer = authenticated
                self._release_peer(key)
                refused = self._refuse(peer.name)
                key = peer.name
                self._per_peer[key] += 1
                if refused == "max_connections_per_peer":
                    self.stats.closed_total[refused] += 1
                    self._throttled.warning(f"connection refused: {refused}", peer=key)
                    return
            await self._serve_frames(reader, writer, peer)
        except (ConnectionError, OSError):
            pass  # the peer went away mid-answer
        except asyncio.CancelledError:
            pass  # the server is stopping
        except Exception:  # never let one connection take the listener down
            self.log.exception("connection failed", peer=peer.name)
        finally:
            self.stats.open_connections -= 1
            self._release_peer(key)
            if task is not None:
                self._connections.discard(task)
            await _close(writer)

    async def _read_frame(self, reader: asyncio.StreamReader, peer: Peer) -> bytes | None:
        """The next frame's payload, or None once the connection should close: EOF, idle
        timeout, frame deadline, or a truncated frame. FrameTooLargeError propagates."""
        limits = self.limits
        try:
            try:
                async with asyncio.timeout(limits.idle_timeout_s):
                    first = await reader.readexactly(1)
            except TimeoutError:
                self.stats.closed_total["idle_timeout"] += 1
                self.log.info("idle connection closed", peer=peer.name)
                return None
            try:
                async with asyncio.timeout(limits.frame_deadline_s):
                    header = first + await reader.readexactly(HEADER_BYTES - 1)
                    length = frame_length(header, self.max_frame_bytes)
                    return await reader.readexactly(length)
            except TimeoutError:
                self.stats.closed_total["frame_deadline"] += 1
                self._throttled.warning("frame deadline exceeded; closing", peer=peer.name)
                return None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                self.stats.closed_total["truncated_frame"] += 1
                self.log.info("truncated frame; closing", peer=peer.name)
            return None
        except ssl.SSLError as exc:
            self.log.info("TLS error; closing", peer=peer.name, error=str(exc))
            return None

    async def _serve_frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        while True:
            try:
                payload = await self._read_frame(reader, peer)
            except FrameTooLargeError as exc:
                self.stats.closed_total["oversized_frame"] += 1
                self.log.warning("oversized frame; closing", peer=peer.name, error=exc.message)
                await _send(writer, 0, error_response(exc))
                return
            if payload is None:
                return
            try:
                frame = decode_frame(payload)
            except UnsupportedVersionError as exc:
                self.stats.bad_frames_total += 1
                self._throttled.warning(
                    "unsupported message version", peer=peer.name, error=exc.message
                )
                await _send(writer, exc.correlation_id, error_response(exc))
                continue
            except InvalidRequestError as exc:
                self.stats.bad_frames_total += 1
                self._throttled.warning("undecodable frame", peer=peer.name, error=exc.message)
                await _send(writer, 0, error_response(exc))
                continue
            await _send(writer, frame.correlation_id, await self._answer(frame.body, peer))

    async def _answer(self, body: Message, peer: Peer) -> Message:
        try:
            return await self.handler(body, peer)
        except MetactlError as exc:
            return error_response(exc)
        except Exception as exc:
            self.log.exception(
                "request handler failed", peer=peer.name, request=type(body).__name__
            )
            return ErrorResponse(code=MetactlError.code, message=type(exc).__name__)


def _format_address(peername: Any) -> str:
    if isinstance(peername, tuple) and len(peername) >= 2:
        return f"{peername[0]}:{peername[1]}"
    return str(peername)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close and wait a little, swallowing a cancellation too: a connection task must not
    end cancelled, since Python 3.11's stream callback then logs a traceback for it. The
    wait is bounded because after a failed `start_tls` the stream's protocol never hears
    that the transport closed, so `wait_closed` would wait forever."""
    writer.close()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await writer.wait_closed()


async def _send(writer: asyncio.StreamWriter, correlation_id: int, body: Message) -> None:
    writer.write(encode_frame(correlation_id, body))
    await writer.drain()
