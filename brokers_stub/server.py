"""The broker's TCP listener: frames in, one handler call per request, frames out.

Serves the requests other parties send to a broker (the controller's GetReplicaLogInfo,
followers' ReplicaFetch) by passing each decoded body to a handler. It never crashes on
bad input: an undecodable frame gets an `ErrorResponse` INVALID_REQUEST and the
connection keeps serving; an oversized frame gets one and the connection is closed (the
stream cannot be resynchronised); a truncated frame closes the connection; a handler
that fails unexpectedly yields UNKNOWN_SERVER_ERROR. Each case is logged.

This module owns sockets and framing for incoming requests. It must not interpret
requests: what to answer is the handler's business.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from brokers_stub.logctx import BrokerLog
from metactl.errors import InvalidRequestError, MetactlError
from protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    ErrorResponse,
    FrameTooLargeError,
    Message,
    decode_frame,
    encode_frame,
    error_response,
    parse_address,
    read_frame,
)

Handler = Callable[[Message], Awaitable[Message]]


class BrokerServer:
    def __init__(
        self,
        handler: Handler,
        log: BrokerLog,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.handler = handler
        self.log = log
        self.max_frame_bytes = max_frame_bytes
        self.address = ""
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, listen: str) -> str:
        """Bind and start accepting; return the real HOST:PORT (port 0 picks one)."""
        host, port = parse_address(listen)
        self._server = await asyncio.start_server(self._serve, host, port)
        sock = self._server.sockets[0].getsockname()
        self.address = f"{sock[0]}:{sock[1]}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
            self.log.exception("listener connection failed", peer=peer)
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
                writer.write(encode_frame(0, error_response(exc)))
                await writer.drain()
                return
            try:
                frame = decode_frame(payload)
            except InvalidRequestError as exc:
                self.log.warning("malformed frame", peer=peer, error=exc.message)
                writer.write(encode_frame(0, error_response(exc)))
                await writer.drain()
                continue
            body = await self._answer(frame.body, peer)
            writer.write(encode_frame(frame.correlation_id, body))
            await writer.drain()

    async def _answer(self, body: Message, peer: str) -> Message:
        try:
            return await self.handler(body)
        except MetactlError as exc:
            return error_response(exc)
        except Exception as exc:
            self.log.exception("request handler failed", peer=peer, request=type(body).__name__)
            return ErrorResponse(code="UNKNOWN_SERVER_ERROR", message=f"{type(exc).__name__}")


def unsupported(body: Message) -> MetactlError:
    return InvalidRequestError(f"a broker does not handle {type(body).__name__}")
