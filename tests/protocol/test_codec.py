"""The sans-IO codec: frames round-trip, every malformed input is a coded error, and a
message version the receiver does not support is refused by name."""

from __future__ import annotations

import struct
import sys

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metactl.errors import (
    FrameTooLargeError,
    InvalidRequestError,
    MetactlError,
    UnsupportedVersionError,
)
from protocol import codec
from protocol.codec import Frame, decode_frame, encode_frame, frame_length
from protocol.messages.admin import CreateTopic, CreateTopicsRequest, DescribeClusterRequest
from protocol.messages.broker_controller import AlterPartition, IsrMember, RegisterBroker

BAD_UTF8 = bytes.fromhex("920182a474797065af4465736372696265436c7573746572a5746f706963a2fffe")
DEEP = b"\x92\x01\x82\xa4type\xafDescribeCluster\xa2zz" + b"\x91" * 1000 + b"\xc0"


def payload(frame: bytes) -> bytes:
    return frame[codec.HEADER_BYTES :]


def test_the_codec_does_no_io() -> None:
    imported = {name for name in vars(codec).values() if isinstance(name, type(sys))}
    assert {m.__name__ for m in imported}.isdisjoint({"asyncio", "socket", "selectors"})


@pytest.mark.parametrize(
    "body",
    [
        DescribeClusterRequest(topic="t"),
        RegisterBroker(broker_id=1, incarnation_id="i", previous_epoch=7, endpoint="h:1"),
        AlterPartition(
            topic="t",
            partition=0,
            leader=1,
            broker_epoch=3,
            partition_epoch=2,
            isr=[IsrMember(broker_id=1, broker_epoch=3)],
        ),
        CreateTopicsRequest(topics=[CreateTopic(name="t", partitions=3, min_isr=2)]),
    ],
)
def test_frames_round_trip(body: msgspec.Struct) -> None:
    frame = encode_frame(42, body)  # type: ignore[arg-type]
    assert frame_length(frame[:4]) == len(frame) - 4
    assert decode_frame(payload(frame)) == Frame(42, body)  # type: ignore[arg-type]


def test_wire_names_are_those_of_the_protocol_document() -> None:
    reg = msgspec.msgpack.decode(payload(encode_frame(1, RegisterBroker(
        broker_id=1, incarnation_id="i", previous_epoch=4))))[1]  # fmt: skip
    assert reg == {"type": "BrokerRegistration", "broker_id": 1, "incarnation_id": "i",
                   "previous_broker_epoch": 4}  # fmt: skip
    spec = CreateTopic(name="t", min_isr=2, recovery_strategy="manual")
    topics = msgspec.msgpack.decode(payload(encode_frame(1, CreateTopicsRequest(topics=[spec]))))
    assert topics[1]["topics"][0]["min_insync_replicas"] == 2
    assert topics[1]["topics"][0]["unclean_recovery_strategy"] == "manual"


@pytest.mark.parametrize(
    "raw",
    [BAD_UTF8, DEEP, b"", b"\xc1", b"\x92\x01\x81\xa4type\xa5Bogus", b"\x92\x01\x80", b"\x91"],
    ids=[
        "invalid-utf8",
        "nested-1000-deep",
        "empty",
        "reserved-byte",
        "unknown-tag",
        "no-tag",
        "short-array",
    ],
)
def test_malformed_payloads_are_invalid_request(raw: bytes) -> None:
    with pytest.raises(InvalidRequestError) as e:
        decode_frame(raw)
    assert e.value.code == "INVALID_REQUEST"


def test_an_unsupported_version_is_refused_with_the_frames_correlation_id() -> None:
    raw = msgspec.msgpack.encode([9, {"type": "DescribeCluster", "v": 3}])
    with pytest.raises(UnsupportedVersionError) as e:
        decode_frame(raw)
    assert e.value.code == "UNSUPPORTED_VERSION"
    assert e.value.correlation_id == 9
    assert "DescribeClusterRequest version 3" in e.value.message


def test_the_version_is_read_on_arrival() -> None:
    raw = msgspec.msgpack.encode([3, {"type": "DescribeCluster", "v": 1, "topic": "t"}])
    assert decode_frame(raw).body.v == 1


def test_an_oversized_length_is_refused() -> None:
    with pytest.raises(FrameTooLargeError) as e:
        frame_length(struct.pack(">I", 1025), max_bytes=1024)
    assert e.value.code == "MESSAGE_TOO_LARGE"
    assert isinstance(e.value, InvalidRequestError)
    assert frame_length(struct.pack(">I", 1024), max_bytes=1024) == 1024


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=256))
def test_any_bytes_decode_to_a_frame_or_a_coded_error(raw: bytes) -> None:
    try:
        assert isinstance(decode_frame(raw), Frame)
    except MetactlError as exc:
        assert exc.code in {"INVALID_REQUEST", "UNSUPPORTED_VERSION"}


_PREFIX = st.sampled_from([b"\x92\x01", b"\x92\x01\x82\xa4type\xafDescribeCluster", b"\x92"])


@settings(max_examples=300, deadline=None)
@given(_PREFIX, st.binary(max_size=256))
def test_near_valid_bytes_decode_to_a_frame_or_a_coded_error(prefix: bytes, tail: bytes) -> None:
    try:
        assert isinstance(decode_frame(prefix + tail), Frame)
    except MetactlError as exc:
        assert exc.code in {"INVALID_REQUEST", "UNSUPPORTED_VERSION"}
