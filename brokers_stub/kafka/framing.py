"""Kafka's frames: a 4-byte big-endian size, then the request header and the request body
at the header's API version (kio's entities, generated from Kafka's message schemas).

`decode_request` says what a frame is, without raising for anything a client can send:

- `Request`: an API and version the listener serves, header and body decoded;
- `ApiVersionsTooNew`: ApiVersions at a version above the served range (Kafka answers it
  at v0 with UNSUPPORTED_VERSION, so that a newer client can retry at a version known);
- `NotServed`: an API key the listener does not advertise, or a served API at a version
  outside its range (Kafka closes the connection for both);
- `Malformed`: anything else (too short, a header or body kio cannot read).

`encode_response` frames an answer under its request's correlation id, with the response
header version kio's entity names (v0 for every ApiVersions answer, as Kafka's rule).

Sans-IO: this module reads and writes bytes only.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

API_VERSIONS: Final = 18
METADATA: Final = 3
DESCRIBE_TOPIC_PARTITIONS: Final = 75

# The APIs served and their version ranges (docs/kafka.md says why these).
SERVED: Final[dict[int, tuple[int, int]]] = {
    API_VERSIONS: (0, 3),
    METADATA: (0, 12),
    DESCRIBE_TOPIC_PARTITIONS: (0, 0),
}

SIZE_BYTES: Final = 4
# api_key (int16), api_version (int16), correlation_id (int32): every request header's start.
FIXED_HEADER: Final = struct.Struct(">hhi")


@dataclass(frozen=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request entity of (api_key, api_version)


@dataclass(frozen=True)
class ApiVersionsTooNew:
    api_version: int
    correlation_id: int


@dataclass(frozen=True)
class NotServed:
    api_key: int
    api_version: int
    correlation_id: int


@dataclass(frozen=True)
class Malformed:
    reason: str


Decoded = Request | ApiVersionsTooNew | NotServed | Malformed


def frame_size(prefix: bytes, max_bytes: int) -> int | None:
    """The size a frame's 4-byte prefix announces; None if it is not in 1..max_bytes."""
    (size,) = struct.unpack(">i", prefix)
    return size if 0 < size <= max_bytes else None


def decode_request(payload: bytes) -> Decoded:
    if len(payload) < FIXED_HEADER.size:
        return Malformed(f"a request of {len(payload)} bytes has no header")
    api_key, version, correlation_id = FIXED_HEADER.unpack_from(payload)
    served = SERVED.get(api_key)
    if served is None:
        return NotServed(api_key, version, correlation_id)
    low, high = served
    if api_key == API_VERSIONS and version > high:
        return ApiVersionsTooNew(version, correlation_id)
    if not low <= version <= high:
        return NotServed(api_key, version, correlation_id)
    schema: Any = load_request_schema(api_key, version)
    try:
        header, used = entity_reader(schema.__header_schema__)(payload, 0)
        body, _ = entity_reader(schema)(payload, used)
    except Exception as exc:  # kio's readers raise several types for bytes that do not parse
        return Malformed(f"api_key {api_key} v{version}: {type(exc).__name__}: {exc}"[:200])
    return Request(api_key, version, correlation_id, header.client_id, body)


def encode_response(correlation_id: int, response: Any) -> bytes:
    """The frame of `response` (a kio response entity) for the request `correlation_id`."""
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    header_schema: Any = response.__header_schema__
    entity_writer(header_schema)(buf, header_schema(correlation_id=correlation_id))
    entity_writer(type(response))(buf, response)
    frame = buf.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - SIZE_BYTES)
    return bytes(frame)
