"""The frame server: metactl's own frames in, one handler call per request, frames out.

Used by the controller service and by brokers. `FrameServer` reads frames from every
connection its `Admission` (protocol/admission.py: accepting, TLS handshakes, parking,
per-address turns, connection limits) establishes, decodes them with the codec, awaits
`handler(message, peer)` and writes its answer under the request's correlation id; one
connection carries one request at a time, answered in order. It never crashes on bad
input or a failing handler:

- the handler raises a `MetactlError`: the answer is an `ErrorResponse` with its code;
- the handler raises anything else: UNKNOWN_SERVER_ERROR, logged with its traceback;
- an undecodable frame: INVALID_REQUEST with correlation id 0 (frame boundaries are
  intact, so the connection keeps serving); a message version the codec refuses:
  UNSUPPORTED_VERSION under the frame's correlation id;
- an oversized frame: MESSAGE_TOO_LARGE, then the connection is closed (the stream
  cannot be resynchronised); a truncated frame (EOF mid-frame) closes it, logged.

Bounds on every established connection (`ServerLimits`, with admission's):

- `idle_timeout_s` without a request closes a connection; once a frame's first byte has
  arrived, the whole frame must arrive within `frame_deadline_s` (slowloris); no deadline
  runs while a request is answered. One timer per connection keeps both (`_Deadline`:
  moving it is an assignment, not a timer-heap entry added and cancelled per read);
- requests in flight per connection: one. The loop reads the next frame only after
  answering the previous one, as Kafka's broker mutes a channel until its response is
  sent, so a pipelining client fills its own socket buffer, not the server's memory.

Every per-connection log line (bad and oversized frames, idle connections, ...) is
rate-limited, as admission's are (`protocol.rate_limited_log`).

This module owns the framing and the serve loop of an established connection; whom to
admit is admission's, and what to answer, and whether a principal may ask it, is the
handler's business.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable

from metactl.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    MetactlError,
    UnsupportedVersionError,
)
from protocol.admission import Admission, Peer
from protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER_BYTES,
    decode_frame,
    encode_frame,
    frame_length,
)
from protocol.limits import ServerLimits, ServerStats
from protocol.messages.base import ErrorResponse, error_response
from protocol.messages.unions import Message
from protocol.rate_limited_log import Logger

Handler = Callable[[Message, Peer], Awaitable[Message]]


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
        self.max_frame_bytes = max_frame_bytes
        self.admission = Admission(self._serve_frames, log=log, ssl=ssl, limits=limits)

    @property
    def address(self) -> str:
        """HOST:PORT once started ("" before)."""
        return self.admission.address

    @property
    def limits(self) -> ServerLimits:
        """The limits in force (lowered at start to fit the descriptor limit)."""
        return self.admission.limits

    @property
    def stats(self) -> ServerStats:
        return self.admission.stats

    async def start(self, listen: str) -> str:
        """Bind and start accepting; return the real HOST:PORT (port 0 picks one)."""
        return await self.admission.start(listen)

    def close(self, *, keep_bound: bool = False) -> None:
        """Stop accepting new connections (open ones keep serving until `stop`). With
        `keep_bound` the listening sockets stay bound, accepting nothing, until
        `release_listeners` (`protocol.listener.Listener.close`: a graceful stop of an
        active controller is not taken for its death)."""
        self.admission.close(keep_bound=keep_bound)

    def release_listeners(self) -> None:
        """Close the listening sockets `close(keep_bound=True)` kept (connections waiting
        in their backlog are reset)."""
        self.admission.release_listeners()

    async def stop(self, *, keep_bound: bool = False) -> None:
        """Stop accepting, end every open connection, and wait for their tasks (the
        listening sockets stay bound with `keep_bound`: see `close`)."""
        await self.admission.stop(keep_bound=keep_bound)

    # --- frames ---------------------------------------------------------------------------

    async def _read_frame(
        self, reader: asyncio.StreamReader, peer: Peer, deadline: _Deadline
    ) -> bytes | None:
        """The next frame's payload, or None once the connection should close: EOF, idle
        timeout, frame deadline, or a truncated frame. FrameTooLargeError propagates."""
        limits = self.admission.limits
        try:
            try:
                deadline.start(limits.idle_timeout_s)
                first = await reader.readexactly(1)
            except asyncio.CancelledError:
                if not deadline.expired():
                    raise
                self.admission.stats.closed_total["idle_timeout"] += 1
                self.admission.throttled.info("idle connection closed", peer=peer.name)
                return None
            try:
                deadline.start(limits.frame_deadline_s)
                header = first + await reader.readexactly(HEADER_BYTES - 1)
                length = frame_length(header, self.max_frame_bytes)
                return await reader.readexactly(length)
            except asyncio.CancelledError:
                if not deadline.expired():
                    raise
                self.admission.stats.closed_total["frame_deadline"] += 1
                self.admission.throttled.warning("frame deadline exceeded; closing", peer=peer.name)
                return None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                self.admission.stats.closed_total["truncated_frame"] += 1
                self.admission.throttled.info("truncated frame; closing", peer=peer.name)
            return None
        except ssl.SSLError as exc:
            self.admission.throttled.info("TLS error; closing", peer=peer.name, error=str(exc))
            return None
        finally:
            deadline.stop()  # no deadline while the request is answered

    async def _serve_frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        deadline = _Deadline()
        try:
            await self._serve_loop(reader, writer, peer, deadline)
        finally:
            deadline.close()

    async def _serve_loop(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: Peer,
        deadline: _Deadline,
    ) -> None:
        transport = writer.transport
        while True:
            try:
                payload = await self._read_frame(reader, peer, deadline)
            except FrameTooLargeError as exc:
                self.admission.stats.closed_total["oversized_frame"] += 1
                self.admission.throttled.warning(
                    "oversized frame; closing", peer=peer.name, error=exc.message
                )
                await _send(writer, 0, error_response(exc))
                return
            if payload is None:
                return
            try:
                frame = decode_frame(payload)
            except UnsupportedVersionError as exc:
                self.admission.stats.bad_frames_total += 1
                self.admission.throttled.warning(
                    "unsupported message version", peer=peer.name, error=exc.message
                )
                await _send(writer, exc.correlation_id, error_response(exc))
                continue
            except InvalidRequestError as exc:
                self.admission.stats.bad_frames_total += 1
                self.admission.throttled.warning(
                    "undecodable frame", peer=peer.name, error=exc.message
                )
                await _send(writer, 0, error_response(exc))
                continue
            # The handler is awaited here rather than through a helper: one coroutine less
            # per request, each heartbeat's.
            try:
                answer = await self.handler(frame.body, peer)
            except MetactlError as exc:
                answer = error_response(exc)
            except Exception as exc:
                answer = self._failed(frame.body, peer, exc)
            data = encode_frame(frame.correlation_id, answer)
            if len(data) - HEADER_BYTES > self.max_frame_bytes:
                # The handlers bound their answers up front (caps, pages); one that is not
                # (a bug) reaches the client as a named error, never as a frame it could
                # not read. Measured here, where every answer is encoded once anyway.
                self.admission.throttled.error(
                    "answer over the frame limit; refused",
                    peer=peer.name,
                    request=type(frame.body).__name__,
                    bytes=len(data) - HEADER_BYTES,
                    limit=self.max_frame_bytes,
                )
                data = encode_frame(
                    frame.correlation_id,
                    error_response(
                        FrameTooLargeError(
                            f"the {type(answer).__name__} ({len(data) - HEADER_BYTES:,} "
                            f"bytes) exceeds the {self.max_frame_bytes:,}-byte frame limit"
                        )
                    ),
                )
            writer.write(data)
            if transport.get_write_buffer_size():
                # Only what the socket did not take waits: `drain` returns at once below
                # the high-water mark, and is a coroutine call per answer to learn so.
                await writer.drain()

    def _failed(self, body: Message, peer: Peer, exc: Exception) -> Message:
        """The answer to a request whose handler failed unexpectedly (logged)."""
        self.admission.throttled.exception(
            "request handler failed", peer=peer.name, request=type(body).__name__
        )
        return ErrorResponse(code=MetactlError.code, message=type(exc).__name__)


async def _send(writer: asyncio.StreamWriter, correlation_id: int, body: Message) -> None:
    writer.write(encode_frame(correlation_id, body))
    await writer.drain()


class _Deadline:
    """The read deadline of one connection's serve loop (the idle timeout, then the frame
    deadline), moved twice a frame at the cost of an assignment: one timer per
    connection, re-armed only when it fires before the deadline or the deadline comes
    sooner than it, where `asyncio.timeout` adds a timer-heap entry and cancels it for
    each read. When the deadline passes while the loop awaits a read, the task is
    cancelled, and `expired` tells that cancellation from any other, as
    `asyncio.timeout` does (`Task.uncancel`)."""

    __slots__ = ("_at", "_cancelling", "_fired", "_handle", "_loop", "_task")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._at: float | None = None  # loop time; None: no deadline (answering)
        self._handle: asyncio.TimerHandle | None = None
        self._fired = False

    def start(self, seconds: float) -> None:
        """The read that follows must end within `seconds`."""
        at = self._at = self._loop.time() + seconds
        handle = self._handle
        if handle is None or handle.when() > at:
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(at, self._check)

    def stop(self) -> None:
        self._at = None

    def close(self) -> None:
        """The connection is done: its timer goes."""
        self._at = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def expired(self) -> bool:
        """Whether the CancelledError being handled is this deadline's (consumed: the
        serve loop handles it), not another's (the server stopping: re-raise)."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._cancelling

    def _check(self) -> None:
        self._handle = None
        at = self._at
        if at is None:  # answering a request: the next read sets its own deadline
            return
        if self._loop.time() < at:  # moved later since the timer was set
            self._handle = self._loop.call_at(at, self._check)
            return
        self._fired = True
        self._task.cancel()
