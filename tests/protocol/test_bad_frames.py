"""Bad frames against a real controller service over TCP (issue 11).

Each bad frame gets a coded error answer (a decode failure: INVALID_REQUEST under
correlation id 0), the same connection then answers a valid DescribeCluster, the log end
offset does not move, and the service's log output (its own JSON lines, as
`metactl.logs.configure` renders them, and stdlib logging) holds no traceback. Lengths
the stream cannot recover from (over the limit, or EOF mid-frame) close the connection,
and the service keeps serving others.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import struct
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest

from controller.runtime.clock import VirtualClock
from controller.runtime.service import ControllerService
from metactl.logs import configure
from protocol.address import parse_address
from protocol.codec import Frame, decode_frame, encode_frame
from protocol.messages.admin import (
    DescribeClusterRequest,
    DescribeClusterResponse,
    ElectLeader,
    PartitionState,
)
from protocol.messages.base import ErrorResponse
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.data import ProduceRequest
from protocol.messages.replication import ReplicaFetchRequest
from protocol.transport import read_frame

MAX_FRAME = 64 * 1024

# The two frames of issue 11 that once closed the connection with a logged traceback.
ISSUE_BAD_UTF8 = bytes.fromhex("920182a474797065af4465736372696265436c7573746572a5746f706963a2fffe")
ISSUE_DEEP = b"\x92\x01\x82\xa4type\xafDescribeCluster\xa2zz" + b"\x91" * 1000 + b"\xc0"


def mp(obj: object) -> bytes:
    return msgspec.msgpack.encode(obj)


def body(message: msgspec.Struct, correlation_id: int) -> bytes:
    return encode_frame(correlation_id, message)[4:]  # type: ignore[arg-type]


# (payload, the code it is answered with, the correlation id of the answer)
UNDECODABLE = {
    "issue-invalid-utf8": ISSUE_BAD_UTF8,
    "issue-nested-1000-deep": ISSUE_DEEP,
    "nested-60000-deep": b"\x92\x01" + b"\x91" * 60_000 + b"\xc0",
    "not-msgpack": b"\xc1\xc1\xc1",
    "empty": b"",
    "trailing-bytes": mp([3, {"type": "DescribeCluster"}]) + b"\x00",
    "unknown-tag": mp([3, {"type": "Bogus", "topic": "t"}]),
    "internal-tag-FenceBroker": mp([3, {"type": "FenceBroker", "broker_id": 1}]),
    "no-tag": mp([3, {"topic": "t"}]),
    "frame-not-an-array": mp({"type": "DescribeCluster"}),
    "correlation-id-a-string": mp(["3", {"type": "DescribeCluster"}]),
    "correlation-id-a-float": mp([1.5, {"type": "DescribeCluster"}]),
    "broker-id-a-string": mp(
        [3, {"type": "BrokerRegistration", "broker_id": "1", "incarnation_id": "a"}]
    ),
    "epoch-a-list": mp(
        [3, {"type": "BrokerHeartbeat", "broker_id": 1, "broker_epoch": [0], "metadata_offset": 1}]
    ),
    "missing-field": mp([3, {"type": "BrokerHeartbeat", "broker_id": 1}]),
    "topics-not-a-list": mp([3, {"type": "CreateTopics", "topics": "t"}]),
    "election-type-unknown": mp(
        [3, {"type": "ElectLeaders", "topic": "t", "partition": 0, "election_type": "sideways"}]
    ),
    "version-a-string": mp([3, {"type": "DescribeCluster", "v": "1"}]),
    "bytes-for-a-string": mp([3, {"type": "DescribeCluster", "topic": b"t"}]),
}
DECODABLE_BUT_REFUSED = {
    "unsupported-version": (
        mp(
            [
                8,
                {
                    "type": "BrokerHeartbeat",
                    "v": 7,
                    "broker_id": 1,
                    "broker_epoch": 0,
                    "metadata_offset": 1,
                },
            ]
        ),
        "UNSUPPORTED_VERSION",
        8,
    ),
    "response-as-request-DescribeClusterResponse": (
        body(
            DescribeClusterResponse(brokers=[], partitions=[], end_offset=0, committed_offset=0), 9
        ),
        "INVALID_REQUEST",
        9,
    ),
    "response-as-request-PartitionState": (
        body(
            PartitionState(
                topic="t",
                partition=0,
                replicas=[1],
                leader=1,
                leader_epoch=0,
                partition_epoch=0,
                isr=[1],
            ),
            10,
        ),
        "INVALID_REQUEST",
        10,
    ),
    "response-as-request-RegisterBrokerResponse": (
        body(RegisterBrokerResponse(broker_epoch=0, clean=True), 11),
        "INVALID_REQUEST",
        11,
    ),
    "response-as-request-Error": (
        body(ErrorResponse(code="STALE_BROKER_EPOCH"), 12),
        "INVALID_REQUEST",
        12,
    ),
    "not-served-Produce": (body(ProduceRequest(topic="t", partition=0), 13), "INVALID_REQUEST", 13),
    "not-served-ReplicaFetch": (
        body(
            ReplicaFetchRequest(
                topic="t",
                partition=0,
                follower_id=1,
                follower_broker_epoch=0,
                fetch_offset=0,
                last_fetched_epoch=-1,
            ),
            14,
        ),
        "INVALID_REQUEST",
        14,
    ),
    "unknown-broker-heartbeat": (
        body(BrokerHeartbeatRequest(broker_id=42, broker_epoch=0, metadata_offset=1), 15),
        "BROKER_ID_NOT_REGISTERED",
        15,
    ),
    "elect-unknown-topic": (
        body(ElectLeader(topic="nope", partition=0, election_type="preferred"), 16),
        "UNKNOWN_TOPIC_OR_PARTITION",
        16,
    ),
}
CASES = {name: (p, "INVALID_REQUEST", 0) for name, p in UNDECODABLE.items()}
CASES.update(DECODABLE_BUT_REFUSED)


@pytest.fixture
def log_output(caplog: pytest.LogCaptureFixture) -> Iterator[io.StringIO]:
    """What the service writes to its log, rendered as in production (JSON lines)."""
    out = io.StringIO()
    configure(json=True, level=logging.DEBUG, stream=out)
    caplog.set_level(logging.WARNING)
    yield out  # the suite's autouse fixture resets structlog afterwards


@pytest.fixture
async def service(tmp_path: Path, log_output: io.StringIO) -> AsyncIterator[ControllerService]:
    svc = ControllerService(
        tmp_path, "127.0.0.1:0", clock=VirtualClock(1_000_000), max_frame_bytes=MAX_FRAME
    )
    await svc.start()
    reader, writer = await connect(svc)
    reply = await ask(reader, writer, body(RegisterBroker(broker_id=1, incarnation_id="a"), 1))
    assert isinstance(reply.body, RegisterBrokerResponse)  # some state to keep
    writer.close()
    yield svc
    await svc.stop()


async def connect(svc: ControllerService) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*parse_address(svc.address))


async def ask(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: bytes) -> Frame:
    writer.write(struct.pack(">I", len(payload)) + payload)
    await writer.drain()
    return decode_frame(await read_frame(reader))


def log_end(svc: ControllerService) -> tuple[int, int]:
    assert svc.store is not None
    return svc.store.end_offset, svc.controller.image.end_offset


async def still_describes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    reply = await ask(reader, writer, body(DescribeClusterRequest(), 42))
    assert reply.correlation_id == 42 and isinstance(reply.body, DescribeClusterResponse)
    assert [b.broker_id for b in reply.body.brokers] == [1]


def assert_no_traceback(
    out: io.StringIO, caplog: pytest.LogCaptureFixture
) -> list[dict[str, object]]:
    """Every line the service logged is one JSON object, none carries an exception or a
    stack, and stdlib logging (asyncio's loop errors) got no error. Returns the events."""
    text = out.getvalue()
    events = [json.loads(line) for line in text.splitlines()]
    assert events, "the service logged nothing: the capture is not working"
    assert not [e for e in events if {"exception", "exc_info", "stack"} & e.keys()]
    assert "Traceback" not in text
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    return events


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
async def test_a_bad_frame_is_answered_and_the_connection_keeps_serving(
    service: ControllerService,
    log_output: io.StringIO,
    caplog: pytest.LogCaptureFixture,
    case: tuple[bytes, str, int],
) -> None:
    payload, code, correlation_id = case
    before = log_end(service)
    reader, writer = await connect(service)
    reply = await ask(reader, writer, payload)
    assert isinstance(reply.body, ErrorResponse)
    assert (reply.body.code, reply.correlation_id) == (code, correlation_id)
    await still_describes(reader, writer)
    assert log_end(service) == before
    writer.close()
    events = assert_no_traceback(log_output, caplog)
    if correlation_id == 0:
        assert any(e["event"] == "undecodable frame" for e in events)


async def test_every_bad_frame_on_one_connection(
    service: ControllerService, log_output: io.StringIO, caplog: pytest.LogCaptureFixture
) -> None:
    before = log_end(service)
    reader, writer = await connect(service)
    for payload, code, correlation_id in CASES.values():
        reply = await ask(reader, writer, payload)
        assert isinstance(reply.body, ErrorResponse)
        assert (reply.body.code, reply.correlation_id) == (code, correlation_id)
    await still_describes(reader, writer)
    assert log_end(service) == before
    assert service.server is not None
    assert service.server.stats.bad_frames_total == len(UNDECODABLE) + 1  # + the version
    writer.close()
    assert_no_traceback(log_output, caplog)


@pytest.mark.parametrize(
    "length",
    [0xFFFF_FFFF, 0x8000_0000, MAX_FRAME + 1],
    ids=["minus-1-as-int32", "int32-min", "limit-plus-1"],
)
async def test_an_oversized_or_negative_length_is_refused_then_closed(
    service: ControllerService,
    log_output: io.StringIO,
    caplog: pytest.LogCaptureFixture,
    length: int,
) -> None:
    before = log_end(service)
    reader, writer = await connect(service)
    writer.write(struct.pack(">I", length) + b"\x92\x01")
    await writer.drain()
    reply = decode_frame(await read_frame(reader))
    assert isinstance(reply.body, ErrorResponse) and reply.body.code == "MESSAGE_TOO_LARGE"
    assert await reader.read() == b""  # closed: the stream cannot be resynchronised
    writer.close()
    reader, writer = await connect(service)
    await still_describes(reader, writer)
    writer.close()
    assert log_end(service) == before
    assert_no_traceback(log_output, caplog)


async def test_a_zero_length_frame_is_invalid_and_the_connection_keeps_serving(
    service: ControllerService, log_output: io.StringIO, caplog: pytest.LogCaptureFixture
) -> None:
    reader, writer = await connect(service)
    reply = await ask(reader, writer, b"")
    assert isinstance(reply.body, ErrorResponse) and reply.body.code == "INVALID_REQUEST"
    await still_describes(reader, writer)
    writer.close()
    assert_no_traceback(log_output, caplog)


@pytest.mark.parametrize(
    ("sent", "truncated"),
    [(b"\x00\x00", 1), (struct.pack(">I", 100) + b"0123456789", 1), (struct.pack(">I", 5), None)],
    ids=["mid-header", "mid-payload", "after-header"],
)
async def test_eof_mid_frame_closes_without_an_answer_and_the_service_keeps_serving(
    service: ControllerService,
    log_output: io.StringIO,
    caplog: pytest.LogCaptureFixture,
    sent: bytes,
    truncated: int | None,
) -> None:
    before = log_end(service)
    reader, writer = await connect(service)
    writer.write(sent)
    writer.write_eof()
    assert await reader.read() == b""  # no answer; the server closed its side
    writer.close()
    assert service.server is not None
    if truncated is not None:  # the server counts a frame cut after some of its bytes
        assert service.server.stats.closed_total["truncated_frame"] == truncated
    reader, writer = await connect(service)
    await still_describes(reader, writer)
    writer.close()
    assert log_end(service) == before
    assert_no_traceback(log_output, caplog)
