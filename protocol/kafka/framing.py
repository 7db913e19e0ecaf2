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

Which APIs and versions a listener serves is its own (`Served`): the brokers' and the
controller's differ. Sans-IO: this module reads and writes bytes only.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_request_schema
from kio.serial import entity_reader, entity_writer

# Kafka's API keys (clients/src/main/resources/common/message/*Request.json).
PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
API_VERSIONS: Final = 18
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
INIT_PRODUCER_ID: Final = 22
OFFSET_FOR_LEADER_EPOCH: Final = 23
DESCRIBE_CONFIGS: Final = 32
CREATE_PARTITIONS: Final = 37
ELECT_LEADERS: Final = 43
INCREMENTAL_ALTER_CONFIGS: Final = 44
ALTER_PARTITION_REASSIGNMENTS: Final = 45
LIST_PARTITION_REASSIGNMENTS: Final = 46
DESCRIBE_QUORUM: Final = 55
UPDATE_FEATURES: Final = 57
DESCRIBE_CLUSTER: Final = 60
DESCRIBE_TOPIC_PARTITIONS: Final = 75

Served = dict[int, tuple[int, int]]  # api key -> (min version, max version)

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


def decode_request(payload: bytes, served: Served) -> Decoded:
    """What `payload` is to a listener that serves the APIs and versions of `served`."""
    if len(payload) < FIXED_HEADER.size:
        return Malformed(f"a request of {len(payload)} bytes has no header")
    api_key, version, correlation_id = FIXED_HEADER.unpack_from(payload)
    versions = served.get(api_key)
    if versions is None:
        return NotServed(api_key, version, correlation_id)
    low, high = versions
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
