"""Kafka's frames: a 4-byte big-endian size, then the request header and the request body
at the header's API version (kio's entities, generated from Kafka's message schemas).

`decode_request` says what a frame is, without raising for anything a client can send:

- `Request`: an API and version the listener serves, header and body decoded;
- `ApiVersionsTooNew`: ApiVersions at a version above the served range (Kafka answers it
  at v0 with UNSUPPORTED_VERSION, so that a newer client can retry at a version known);
- `NotServed`: an API key the listener does not advertise, or a served API at a version
  outside its range (Kafka closes the connection for both);
- `Malformed`: anything else (too short, a header or body kio cannot read, an array
  announcing more items than bytes left (Kafka's rule; checked before kio reads, whose
  native reader reserves 8 bytes an announced item and aborts the process on a length
  near 2**32), a null where the schema has no null: kio reads a null array or string
  for any field, Kafka refuses the request).

`encode_response` frames an answer under its request's correlation id, with the response
header version kio's entity names (v0 for every ApiVersions answer, as Kafka's rule).

Which APIs and versions a listener serves is its own (`Served`): the brokers' and the
controller's differ. Sans-IO: this module reads and writes bytes only.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import struct
import types
import typing
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
        # kio's reader reserves room for an array's announced length before reading it
        # (8 bytes an item): a length near 2**32 aborts the process. Kafka's rule first.
        _check_lengths(schema, payload, used, len(payload))
        body, _ = entity_reader(schema)(payload, used)
    except Exception as exc:  # kio's readers raise several types for bytes that do not parse
        return Malformed(f"api_key {api_key} v{version}: {type(exc).__name__}: {exc}"[:200])
    null = _null_field(body)
    if null is not None:
        return Malformed(f"api_key {api_key} v{version}: {null} is null, which it may not be")
    return Request(api_key, version, correlation_id, header.client_id, body)


# --- lengths, before kio reads them ---------------------------------------------------------

_FIXED: Final = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8,
    "float64": 8, "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16,
}  # fmt: skip
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")


class _Overrun(ValueError):
    pass


# A field's plan: (kafka type, "" for an entity or "?" for a nullable one (KIP-893: an
# int8 marker first), an array, the entity's class or None).
_Item = tuple[str, bool, Any]
_Plan = tuple[_Item, ...]


@functools.cache
def _plan(cls: Any) -> tuple[_Plan, dict[int, _Item]]:
    """The fields of `cls` in wire order, and its tagged fields by tag."""
    hints = typing.get_type_hints(cls)
    fields, tagged = [], {}
    for f in dataclasses.fields(cls):
        nullable, inner = _optional(hints[f.name])
        array = _is_tuple(inner)
        if array:
            _, inner = _optional(typing.get_args(inner)[0])
        entity = inner if dataclasses.is_dataclass(inner) else None
        kind = f.metadata["kafka_type"] if entity is None else "?" if nullable and not array else ""
        item = (kind, array, entity)
        if "tag" in f.metadata:
            tagged[int(f.metadata["tag"])] = item
        else:
            fields.append(item)
    return tuple(fields), tagged


def _uvarint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 28:
            raise _Overrun(f"a bad varint at byte {pos}")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _length(
    buf: bytes, pos: int, end: int, flexible: bool, legacy: struct.Struct
) -> tuple[int, int]:
    """A length (-1: null) and where what it counts starts."""
    if flexible:
        n, pos = _uvarint(buf, pos, end)
        return n - 1, pos
    if pos + legacy.size > end:
        raise _Overrun(f"a length past the end at byte {pos}")
    return legacy.unpack_from(buf, pos)[0], pos + legacy.size


def _skip_value(buf: bytes, pos: int, end: int, item: _Item, flexible: bool) -> int:
    kind, _, entity = item
    if kind == "?":  # a nullable struct: -1 for null, else 1 and the struct
        if pos >= end:
            raise _Overrun(f"a struct's marker past the end at byte {pos}")
        if buf[pos] == 0xFF:
            return pos + 1
        pos += 1
    if entity is not None:
        return _check_lengths(entity, buf, pos, end)
    size = _FIXED.get(kind)
    if size is None:  # string, bytes, records
        size, pos = _length(buf, pos, end, flexible, _I16 if kind == "string" else _I32)
        size = max(size, 0)
    if pos + size > end:
        raise _Overrun(f"a {kind} of {size} bytes past the end at byte {pos}")
    return pos + size


def _check_lengths(cls: Any, buf: bytes, pos: int, end: int) -> int:
    """Walk an entity of `cls` at `pos` without reading it: every array's length must be
    at most the bytes left (Kafka's generated readers refuse more), every string's and
    bytes' within them; _Overrun otherwise. Where the entity ends."""
    flexible = cls.__flexible__
    fields, tagged = _plan(cls)
    for item in fields:
        pos = _skip_field(buf, pos, end, item, flexible)
    if flexible:
        count, pos = _uvarint(buf, pos, end)
        if count > end - pos:
            raise _Overrun(f"{count} tagged fields, {end - pos} bytes left")
        for _ in range(count):
            tag, pos = _uvarint(buf, pos, end)
            size, pos = _uvarint(buf, pos, end)
            if pos + size > end:
                raise _Overrun(f"a tagged field of {size} bytes past the end at byte {pos}")
            if tag in tagged:
                _skip_field(buf, pos, pos + size, tagged[tag], flexible)
            pos += size
    return pos


def _skip_field(buf: bytes, pos: int, end: int, item: _Item, flexible: bool) -> int:
    if not item[1]:
        return _skip_value(buf, pos, end, item, flexible)
    n, pos = _length(buf, pos, end, flexible, _I32)
    if n > end - pos:
        raise _Overrun(f"an array of {n} items, {end - pos} bytes left at byte {pos}")
    for _ in range(n):
        pos = _skip_value(buf, pos, end, item, flexible)
    return pos


# --- nulls where the schema has none ------------------------------------------------------

_OptionalArgs = tuple[bool, Any]  # (None allowed, the type without None)


def _is_tuple(hint: Any) -> bool:
    origin: Any = typing.get_origin(hint)
    return origin is tuple


def _optional(hint: Any) -> _OptionalArgs:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(hint) if a is not type(None)]
        return len(rest) < len(typing.get_args(hint)), rest[0] if len(rest) == 1 else hint
    return False, hint


# A field of an entity: (name, None allowed, an array, None allowed in the array, the
# entity class of the value or of its items, if it is one).
_Field = tuple[str, bool, bool, bool, Any]


@functools.cache
def _fields(cls: Any) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        nullable, inner = _optional(hints[f.name])
        array, items_nullable = _is_tuple(inner), False
        if array:
            items_nullable, inner = _optional(typing.get_args(inner)[0])
        entity = inner if dataclasses.is_dataclass(inner) else None
        out.append((f.name, nullable, array, items_nullable, entity))
    return tuple(out)


def _null_field(entity: Any) -> str | None:
    """The name of a field of `entity` (or of an entity in it) that is None although its
    schema has no null, or None if there is none."""
    cls: Any = type(entity)
    for name, nullable, array, items_nullable, nested in _fields(cls):
        value = getattr(entity, name)
        if value is None:
            if nullable:
                continue
            return name
        if array:
            for item in value:
                if item is None:
                    if not items_nullable:
                        return f"an item of {name}"
                elif nested is not None and (inner := _null_field(item)) is not None:
                    return f"{name}.{inner}"
        elif nested is not None and (inner := _null_field(value)) is not None:
            return f"{name}.{inner}"
    return None


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
