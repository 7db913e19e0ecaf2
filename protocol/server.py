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

This module owns sockets for incoming requests. What to answer is the handler's business.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

from metactl.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    MetactlError,
    UnsupportedVersionError,
)
from protocol.codec import DEFAULT_MAX_FRAME_BYTES, decode_frame, encode_frame, parse_address
from protocol.messages import ErrorResponse, Message, error_response
from protocol.transport import read_frame

Handler = Callable[[Message], Awaitable[Message]]


class Logger(Protocol):
    def warning(self, event: str, **kw: Any) -> Any: ...
    def exception(self, event: str, **kw: Any) -> Any: ...


class FrameServer:
    def __init__(
        self,
        handler: Handler,
        *,
        log: Logger | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.handler = handler
        self.log: Logger = log if log is not None else structlog.get_logger("metactl.protocol")
        self.max_frame_bytes = max_frame_bytes
        self.address = ""
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[Any]] = set()

    async def start(self, listen: str) -> str:
        """Bind and start accepting; return the real HOST:PORT (port 0 picks one)."""
        host, port = parse_address(listen)
        self._server = await asyncio.start_server(self.serve_connection, host, port)
        sock = self._server.sockets[0].getsockname()
        self.address = f"{sock[0]}:{sock[1]}"
        return self.address

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

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        peer = str(writer.get_extra_info("peername"))
        try:
            await self._serve_frames(reader, writer, peer)
        except (ConnectionError, OSError):
            pass  # the peer went away mid-answer
        except asyncio.CancelledError:
            pass  # the server is stopping
        except Exception:  # never let one connection take the listener down
            self.log.exception("connection failed", peer=peer)
        finally:
            if task is not None:
                self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: str
    ) -> None:
        while True:
            try:
                payload = await read_frame(reader, self.max_frame_bytes)
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    self.log.warning(
                        "truncated frame; closing", peer=peer, received=len(exc.partial)
                    )
                return
            except FrameTooLargeError as exc:
                self.log.warning("oversized frame; closing", peer=peer, error=exc.message)
                await _send(writer, 0, error_response(exc))
                return
            try:
                frame = decode_frame(payload)
            except UnsupportedVersionError as exc:
                self.log.warning("unsupported message version", peer=peer, error=exc.message)
                await _send(writer, exc.correlation_id, error_response(exc))
                continue
            except InvalidRequestError as exc:
                self.log.warning("undecodable frame", peer=peer, error=exc.message)
                await _send(writer, 0, error_response(exc))
                continue
            await _send(writer, frame.correlation_id, await self._answer(frame.body, peer))

    async def _answer(self, body: Message, peer: str) -> Message:
        try:
            return await self.handler(body)
        except MetactlError as exc:
            return error_response(exc)
        except Exception as exc:
            self.log.exception("request handler failed", peer=peer, request=type(body).__name__)
            return ErrorResponse(code=MetactlError.code, message=type(exc).__name__)


async def _send(writer: asyncio.StreamWriter, correlation_id: int, body: Message) -> None:
    writer.write(encode_frame(correlation_id, body))
    await writer.drain()
