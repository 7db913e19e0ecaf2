"""The sans-IO wire codec: length-prefixed frames of versioned msgspec messages.

A frame is a 4-byte big-endian length followed by that many bytes of MessagePack: a
`Frame` with a correlation id and one tagged message of `protocol.messages.unions.Message`.
Every error travels as an `ErrorResponse` with a stable code. See docs/protocol.md.

This module turns bytes into frames and back, and nothing else: no sockets, no asyncio,
no rules. Every malformed input becomes a coded `MetactlError`, never another exception:
`InvalidRequestError` for bytes that do not decode, `UnsupportedVersionError` for a
message at a version its class does not accept, `FrameTooLargeError` for a length over
the limit.
"""

from __future__ import annotations

import struct
from typing import Final

import msgspec

from metactl.errors import FrameTooLargeError, InvalidRequestError, UnsupportedVersionError
from protocol.messages.unions import Message

DEFAULT_MAX_FRAME_BYTES: Final = 8 * 1024 * 1024
HEADER_BYTES: Final = 4
_LEN: Final = struct.Struct(">I")


class Frame(msgspec.Struct, frozen=True, array_like=True):
    correlation_id: int
    body: Message


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(Frame)

# Everything msgspec (or the interpreter under it) raises for hostile bytes: malformed
# MessagePack or a shape mismatch (DecodeError, ValidationError), invalid UTF-8
# (UnicodeDecodeError, a ValueError), nesting too deep for the stack (RecursionError),
# integers out of range (OverflowError), and anything else a decoder might surface.
_UNDECODABLE: Final = (msgspec.DecodeError, ValueError, RecursionError, TypeError, OverflowError)


def encode_frame(correlation_id: int, body: Message) -> bytes:
    """The whole frame: length header and payload."""
    payload = _encoder.encode(Frame(correlation_id, body))
    return _LEN.pack(len(payload)) + payload


def frame_length(header: bytes, max_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> int:
    """The payload length a 4-byte header announces; FrameTooLargeError over `max_bytes`."""
    (length,) = _LEN.unpack(header)
    if length > max_bytes:
        raise FrameTooLargeError(f"frame of {length} bytes exceeds the {max_bytes}-byte limit")
    return int(length)


def decode_frame(payload: bytes) -> Frame:
    """One frame's payload (without its header) as a Frame whose message version is
    supported. Raises InvalidRequestError or UnsupportedVersionError, nothing else."""
    try:
        frame: Frame = _decoder.decode(payload)
    except _UNDECODABLE as exc:
        raise InvalidRequestError(f"undecodable frame: {type(exc).__name__}: {exc}") from None
    check_version(frame)
    return frame


def check_version(frame: Frame) -> None:
    """Raise UnsupportedVersionError if the body's `v` is not one its class accepts."""
    body = frame.body
    if body.v not in body.VERSIONS:
        raise UnsupportedVersionError(
            f"{type(body).__name__} version {body.v} is not supported "
            f"(supported: {', '.join(map(str, sorted(body.VERSIONS)))})",
            correlation_id=frame.correlation_id,
        )
