"""The Kafka listener: connections admitted by `protocol.admission` (TLS with a client
certificate from the cluster's CA by default, limits, parking; plaintext with
--insecure), then Kafka's frames read, decoded (`framing`) and answered by the owner's
`answer` (the broker's or the controller's APIs), one request at a time per connection,
in order (Kafka mutes a connection while its request is being handled).

What closes a connection, with one rate-limited line and never a traceback: an API the
listener does not advertise, a served API at a version outside its range (Kafka closes
both), a malformed frame, a size prefix out of range, a truncated frame, the idle
timeout, the frame deadline, and an answer that fails unexpectedly (a bug: logged with
its traceback, as a server error, never echoed to the client). ApiVersions above its
range is answered (v0 fallback). The connection's principal goes to `answer` with each
request: authorization is the owner's.

This module owns the serve loop of a Kafka connection; whom to admit is admission's,
what to answer the owner's.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from protocol.admission import Admission, Peer
from protocol.kafka.framing import (
    SIZE_BYTES,
    ApiVersionsTooNew,
    Malformed,
    NotServed,
    Request,
    Served,
    decode_request,
    encode_response,
    frame_size,
)
from protocol.kafka.metadata import api_versions_unsupported
from protocol.limits import ServerLimits
from protocol.rate_limited_log import Logger

# Kafka's socket.request.max.bytes default (100 MiB) is for a broker with a log on disk;
# ours holds a request in memory until it is answered: 8 MiB fits any batch the brokers
# accept (message.max.bytes, 1 MiB by default) many times over.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024

# The owner's answer to a request: a kio response entity, or None for none (Produce with
# acks=0, which Kafka never answers).
Answer = Callable[[Request, Peer], Awaitable[Any]]


class KafkaListener:
    def __init__(
        self,
        served: Served,
        answer: Answer,
        *,
        log: Logger | None = None,
        ssl: ssl.SSLContext | None = None,
        limits: ServerLimits | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self.served = served
        self.answer = answer
        self.max_request_bytes = max_request_bytes
        self.admission = Admission(self._serve, log=log, ssl=ssl, limits=limits)

    @property
    def address(self) -> str:
        return self.admission.address

    async def start(self, listen: str) -> str:
        """Bind and start accepting; return the real HOST:PORT (port 0 picks one)."""
        return await self.admission.start(listen)

    async def stop(self) -> None:
        await self.admission.stop()

    async def _read_frame(self, reader: asyncio.StreamReader, peer: Peer) -> bytes | None:
        """The next frame's payload, or None once the connection should close."""
        limits, throttled = self.admission.limits, self.admission.throttled
        closed = self.admission.stats.closed_total
        try:
            try:
                async with asyncio.timeout(limits.idle_timeout_s):
                    first = await reader.readexactly(1)
            except TimeoutError:
                closed["idle_timeout"] += 1
                throttled.info("kafka: idle connection closed", peer=peer.name)
                return None
            try:
                async with asyncio.timeout(limits.frame_deadline_s):
                    prefix = first + await reader.readexactly(SIZE_BYTES - 1)
                    size = frame_size(prefix, self.max_request_bytes)
                    if size is None:
                        closed["bad_frame_size"] += 1
                        throttled.warning(
                            "kafka: frame size out of range; closing",
                            peer=peer.name,
                            prefix=prefix.hex(),
                            max_bytes=self.max_request_bytes,
                        )
                        return None
                    return await reader.readexactly(size)
            except TimeoutError:
                closed["frame_deadline"] += 1
                throttled.warning("kafka: frame deadline exceeded; closing", peer=peer.name)
                return None
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                closed["truncated_frame"] += 1
                throttled.info("kafka: truncated frame; closing", peer=peer.name)
            return None
        except (ssl.SSLError, ConnectionError) as exc:
            throttled.info("kafka: connection error; closing", peer=peer.name, error=str(exc))
            return None

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: Peer
    ) -> None:
        throttled = self.admission.throttled
        while True:
            payload = await self._read_frame(reader, peer)
            if payload is None:
                return
            decoded = decode_request(payload, self.served)
            response: Any
            match decoded:
                case Malformed(reason):
                    self.admission.stats.bad_frames_total += 1
                    throttled.warning(
                        "kafka: malformed request; closing", peer=peer.name, error=reason
                    )
                    return
                case NotServed(api_key, api_version, _):
                    self.admission.stats.closed_total["api_not_served"] += 1
                    throttled.info(
                        "kafka: API not served; closing",
                        peer=peer.name,
                        api_key=api_key,
                        api_version=api_version,
                    )
                    return
                case ApiVersionsTooNew(_, correlation_id):
                    response = api_versions_unsupported(self.served)
                case _:
                    correlation_id = decoded.correlation_id
                    try:
                        response = await self.answer(decoded, peer)
                    except Exception:
                        throttled.exception(
                            "kafka: request failed; closing",
                            peer=peer.name,
                            api_key=decoded.api_key,
                            api_version=decoded.api_version,
                        )
                        return
            if response is None:
                continue  # Produce with acks=0: Kafka sends no answer at all
            writer.write(encode_response(correlation_id, response))
            await writer.drain()
