"""A reconnecting request/response client over the wire protocol.

One client per purpose (heartbeats, metadata fetches, AlterPartition, one per leader a
follower fetches from), each with one request in flight. It connects lazily, and drops
the connection on any transport or framing failure (and on a timeout or cancellation,
after which the stream is out of step), so the next request reconnects: the peer may be
SIGKILLed and restarted on the same address. Transport failures surface as
`NetworkError`; a peer's `ErrorResponse` surfaces as the coded error it names and keeps
the connection.

This module owns sockets and framing for outgoing requests only: no retries, no
backoff, no decisions about what to send.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from metactl.errors import InvalidRequestError, MetactlError, error_for_code
from protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    ErrorResponse,
    Message,
    decode_frame,
    encode_frame,
    parse_address,
    read_frame,
)


class NetworkError(MetactlError):
    """The peer could not be reached, or the connection broke mid-request."""

    code = "NETWORK_EXCEPTION"
    retriable = True


class RpcClient:
    def __init__(
        self,
        address: str | Callable[[], str],
        *,
        connect_timeout: float = 5.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self._address = address
        self.connect_timeout = connect_timeout
        self.max_frame_bytes = max_frame_bytes
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._connected_to: str | None = None
        self._next_id = 1
        self._lock = asyncio.Lock()

    @property
    def address(self) -> str:
        return self._address() if callable(self._address) else self._address

    @property
    def connected(self) -> bool:
        return self._writer is not None

    async def request(self, body: Message, timeout_s: float) -> Message:
        """Send `body`, return the response body; raise the peer's coded error, or
        `NetworkError` when the exchange failed (the connection is then dropped)."""
        async with self._lock:
            cid = self._next_id
            self._next_id += 1
            try:
                async with asyncio.timeout(timeout_s):
                    reader, writer = await self._connection()
                    writer.write(encode_frame(cid, body))
                    await writer.drain()
                    frame = decode_frame(await read_frame(reader, self.max_frame_bytes))
            except (OSError, EOFError, TimeoutError, InvalidRequestError) as exc:
                self._drop()
                raise NetworkError(f"{self.address}: {type(exc).__name__}: {exc}") from None
            except BaseException:
                self._drop()  # cancelled mid-exchange: the stream is out of step
                raise
            if frame.correlation_id != cid:
                self._drop()
                raise NetworkError(
                    f"{self.address}: response correlation id {frame.correlation_id} "
                    f"does not match {cid}"
                )
        if isinstance(frame.body, ErrorResponse):
            raise error_for_code(frame.body.code, frame.body.message)
        return frame.body

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        address = self.address
        if self._writer is not None and self._connected_to != address:
            self._drop()  # the peer moved (e.g. re-registered with a new endpoint)
        if self._reader is None or self._writer is None:
            host, port = parse_address(address)
            async with asyncio.timeout(self.connect_timeout):
                self._reader, self._writer = await asyncio.open_connection(host, port)
            self._connected_to = address
        return self._reader, self._writer

    def _drop(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()

    async def close(self) -> None:
        writer = self._writer
        self._drop()
        if writer is not None:
            with contextlib.suppress(Exception):
                await writer.wait_closed()
