"""Bad input on the brokers' Kafka listener: any frame a client can send gets Kafka's
error or a closed connection, never a traceback, a wedge or a stored batch that fails its
CRC.

In process (fast, Hypothesis): for every API the broker serves (`BrokerKafkaApis.served`:
the image's, the data plane's, the forwarded admin ones) at every served version, kio
request entities with adversarial values (edge integers, negative and huge partition
indexes, offsets, byte limits, timeouts and acks, duplicate and empty topics, null names,
unknown topic ids, records that are valid batches, mutated batches or random bytes) are
framed with kio's writer, decoded as the listener decodes them and answered by a real
broker's `answer` (a `ReplicaManager` leading orders-0 on disk, the admin APIs over a
scripted controller that answers, refuses or answers the wrong message). Then the same
frames mutated (bits, bytes, edge int32s, truncated, extended, read at another version).
Every frame must be Malformed / NotServed, or get its response entity (None only for
acks=0) that encodes, within the time the request itself asks to wait; and every batch
the leader stored, in memory and on disk, must pass its CRC.

Real processes (slow): a few hundred mutated frames over TCP to one broker, which must
still answer ApiVersions and Metadata, take a librdkafka producer's records, and have
logged no traceback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import os
import struct
import time
import types
import typing
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.api_versions.v3.response import ApiVersionsResponse
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.produce.v9 import request as produce_v9
from kio.serial import entity_reader
from kio.static.primitive import Records, i32Timedelta, i64Timedelta

from brokers_stub import replica_log as rl
from brokers_stub.kafka.apis import METADATA_SERVED, BrokerKafkaApis
from brokers_stub.kafka.data import DATA_SERVED, MESSAGE_MAX_BYTES, KafkaData
from brokers_stub.kafka.forward import AdminForwarder
from brokers_stub.logctx import BrokerLog
from brokers_stub.replica_manager import ReplicaManager
from metactl.errors import (
    MetactlError,
    NotControllerError,
    PolicyViolationError,
)
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import PartitionRecord, RegisterBrokerRecord, TopicRecord
from protocol.admission import Peer
from protocol.kafka import framing as k
from protocol.kafka.admin import ADMIN_SERVED
from protocol.kafka.framing import (
    ApiVersionsTooNew,
    Malformed,
    NotServed,
    Request,
    decode_request,
    encode_response,
)
from protocol.kafka.metadata import api_versions_unsupported
from protocol.kafka.records import CRC_START, iter_batches
from protocol.messages.admin import CreateTopic, CreateTopicsRequest, CreateTopicsResponse, Envelope
from protocol.messages.base import ErrorResponse
from protocol.messages.unions import Message
from protocol.tls import ADMIN, VIEWER
from tests.brokers_stub.helpers import config
from tests.e2e.cluster import Cluster, free_port
from tests.kafka_wire import batch, connect, exchange, frame, read_frame
from tests.protocol.test_kafka_admin import Script
from tests.protocol.test_kafka_records import mutated, valid_batches

EXAMPLES = int(os.environ.get("METACTL_HYPOTHESIS_EXAMPLES", "300"))
EPOCH = 5  # broker 1's epoch (producer ids are issued from it)
TOPIC_ID = uuid.UUID("6c3f3b0e-0000-4000-8000-0000000000aa")
OTHER_ID = uuid.UUID("6c3f3b0e-0000-4000-8000-0000000000bb")
LED = ("orders", 0)
# How long an answer may take beyond what the request asks to wait (a Fetch's max_wait, a
# Produce's timeout): longer is a wedge. Waits asked for beyond WAIT_CAP are cut there.
GRACE_S = 2.0
WAIT_CAP_S = 0.3


def image() -> ClusterImage:
    """Brokers 1 and 2 with Kafka listeners; orders-0 led by 1 (ISR [1]), orders-1 by 2
    (broker 1 holds no replica of it); other-0 led by 2."""
    return replay(
        ClusterImage(),
        [
            *(
                RegisterBrokerRecord(
                    broker_id=b,
                    incarnation_id=f"i{b}",
                    broker_epoch=EPOCH,
                    endpoint=f"127.0.0.1:{10000 + b}",
                    kafka_endpoint=f"127.0.0.1:{19090 + b}",
                    fenced=False,
                )
                for b in (1, 2)
            ),
            TopicRecord(name="orders", topic_id=str(TOPIC_ID), partitions=2, min_isr=1),
            PartitionRecord(topic="orders", partition=0, replicas=[1], isr=[1], leader=1),
            PartitionRecord(topic="orders", partition=1, replicas=[2], isr=[2], leader=2),
            TopicRecord(name="other", topic_id=str(OTHER_ID), partitions=1, min_isr=1),
            PartitionRecord(topic="other", partition=0, replicas=[2], isr=[2], leader=2),
        ],
    )


# --- the controller the admin APIs are forwarded to ---------------------------------------

ANSWER, REFUSE, WRONG = "answer", "refuse", "wrong"


class Controller:
    """The forwarder's controller client: each envelope's request answered as the
    controller would (`Script`'s canned answers), refused with a MetactlError, or answered
    with a message of the wrong type, as `mode` says."""

    def __init__(self) -> None:
        self.mode = ANSWER
        self.forwarded = 0

    async def request(self, body: Message, timeout_s: float) -> Message:
        assert isinstance(body, Envelope)
        self.forwarded += 1
        if self.mode == REFUSE:
            raise PolicyViolationError("refused by the scripted controller")
        if self.mode == WRONG:
            return ErrorResponse(code="NOT_CONTROLLER", message="a stale answer")
        try:
            return await Script()(body.request)
        except AssertionError:  # a request the script has no answer for
            raise NotControllerError("the scripted controller does not answer this") from None


# --- the broker, in process ---------------------------------------------------------------


class Broker:
    """Broker 1's Kafka APIs over a real replica manager that leads orders-0 on disk."""

    def __init__(self, data_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.image = image()
        self.manager = ReplicaManager(
            config(data_dir, 1), BrokerLog(1), broker_epoch=lambda: EPOCH, controller=None
        )
        self.manager.load(lose_unflushed=False)
        self.manager.on_metadata(self.image, None, True)
        self.refused: list[tuple[str, str, MetactlError]] = []
        self.controller = Controller()
        data = KafkaData(
            self.manager,
            broker_epoch=lambda: EPOCH,
            tls=True,
            refused=lambda who, op, error: self.refused.append((who, op, error)),
            max_batch_bytes=MESSAGE_MAX_BYTES,
        )
        admin = AdminForwarder(1, lambda: self.image, self.controller, cluster_id="fuzz")  # type: ignore[arg-type]
        self.apis = BrokerKafkaApis(1, lambda: self.image, parts=(data, admin), cluster_id="fuzz")
        self.outcomes: dict[str, int] = {}
        self.well_formed = False  # every frame is a kio entity as written: none Malformed

    def close(self) -> None:
        self.loop.run_until_complete(self.manager.stop())
        self.loop.close()

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def handle(self, payload: bytes, peer: Peer) -> None:
        """What the listener does with `payload`, checked: only Malformed, NotServed, or
        a response of the request's API and version that encodes."""
        self.loop.run_until_complete(self._handle(payload, peer))

    async def _handle(self, payload: bytes, peer: Peer) -> None:
        decoded = decode_request(payload, self.apis.served)
        match decoded:
            case Malformed(reason) if self.well_formed:
                raise AssertionError(f"a kio entity as written is Malformed: {reason}")
            case Malformed() | NotServed():
                self.count(type(decoded).__name__)
                return
            case ApiVersionsTooNew(_, correlation_id):
                check_encodes(correlation_id, api_versions_unsupported(self.apis.served))
                self.count("ApiVersionsTooNew")
                return
        assert isinstance(decoded, Request)
        asked = requested_wait_s(decoded)
        try:
            async with asyncio.timeout(min(asked, WAIT_CAP_S) + GRACE_S):
                response = await self.apis.answer(decoded, peer)
        except TimeoutError:
            if asked > WAIT_CAP_S:  # a long poll the client asked for, cut short here
                self.count("long poll")
                return
            raise AssertionError(f"no answer within {GRACE_S} s: {decoded}") from None
        if response is None:
            assert decoded.api_key == k.PRODUCE and int(decoded.body.acks) == 0, decoded
            self.count("no answer (acks=0)")
            return
        expected = load_response_schema(decoded.api_key, decoded.api_version)
        assert type(response) is expected, (type(response), decoded)
        check_encodes(decoded.correlation_id, response)
        self.count(f"answered {decoded.api_key}")

    def check_stored_batches(self) -> int:
        """Every batch orders-0 stored passes its CRC, as held and as on disk after a
        flush; the number of batches."""
        log = self.manager.logs[LED]
        headers = log.batches()
        for h in headers:
            (chunk,) = self.manager.read(LED, h.base_offset, h.base_offset + 1, 1)
            assert chunk.base_offset == h.base_offset and chunk.data is not None
            assert crc32c(chunk.data[CRC_START:]) == h.crc, f"batch at {h.base_offset}"
        self.manager.flush_all()
        logs = list(self.manager.replicas_dir.glob("orders-0*.log"))  # the batches' file
        assert len(logs) == (1 if headers else 0), logs
        on_disk = logs[0].read_bytes() if headers else b""
        stored = list(iter_batches(on_disk))
        assert [h.base_offset for h in stored] == [h.base_offset for h in headers]
        assert sum(h.size for h in stored) == len(on_disk)
        pos = 0
        for h in stored:
            assert crc32c(on_disk[pos + CRC_START : pos + h.size]) == h.crc
            pos += h.size
        (reloaded,), _ = rl.load_all(self.manager.replicas_dir)
        assert reloaded.log_end_offset == log.log_end_offset
        assert [h.base_offset for h in reloaded.batches()] == [h.base_offset for h in headers]
        return len(headers)


def check_encodes(correlation_id: int, response: Any) -> None:
    """The response frames (as the listener frames it) and reads back with kio."""
    data = encode_response(correlation_id, response)
    assert struct.unpack_from(">i", data)[0] == len(data) - 4
    header, used = entity_reader(response.__header_schema__)(data[4:], 0)
    assert header.correlation_id == correlation_id
    entity_reader(type(response))(data[4:], used)


def requested_wait_s(request: Request) -> float:
    """How long the request itself asks the broker to wait at most (long poll, commit)."""
    body = request.body
    if request.api_key == k.FETCH:
        return max(0.0, float(body.max_wait.total_seconds()))
    if request.api_key == k.PRODUCE and int(body.acks) == -1:
        return max(0.0, float(body.timeout.total_seconds()))
    return 0.0


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path / "b1")
    try:
        yield b
    finally:
        b.close()


# --- kio entities, adversarial --------------------------------------------------------------

# What the broker serves (the test below checks it is `BrokerKafkaApis.served`).
SERVED = {**METADATA_SERVED, **DATA_SERVED, **ADMIN_SERVED}
VERSIONS = sorted((key, v) for key, (lo, hi) in SERVED.items() for v in range(lo, hi + 1))
NAMES = ("orders", "other", "missing", "", "__cluster_metadata", "min.insync.replicas")
STRINGS = st.sampled_from(NAMES) | st.text(max_size=12)
UUIDS = st.sampled_from([TOPIC_ID, OTHER_ID, uuid.UUID(int=0)]) | st.uuids()
# A timeout or max wait in ms: mostly none or short; the edges of int32 sometimes.
WAITS_MS = st.sampled_from([-(2**31), -1, 0, 0, 1, 5, 20, 2**31 - 1])
RECORDS = st.one_of(
    st.none(),
    st.just(b""),
    st.binary(max_size=80),
    valid_batches(),
    valid_batches(),
    mutated(),
    st.builds(lambda a, b: a + b, valid_batches(), valid_batches()),
    st.lists(st.binary(max_size=8), min_size=1, max_size=3).map(lambda vs: batch(list(vs))),
)


def ints(cls: Any) -> st.SearchStrategy[int]:
    low, high = cls.__low__, cls.__high__
    edges = [v for v in (low, high, -3, -2, -1, 0, 0, 0, 1, 1, 2, 3) if low <= v <= high]
    return st.sampled_from(edges) | st.integers(low, high)


# Fields whose values are drawn mostly from those that reach the broker's state (the led
# partition, acks it takes, no transactions), the rest adversarial.
BIASED: dict[str, st.SearchStrategy[Any]] = {
    "name": st.sampled_from(["orders"] * 4 + ["other"]) | STRINGS,
    "topic": st.sampled_from(["orders"] * 4 + ["other"]) | STRINGS,
    "acks": st.sampled_from([1, 1, -1, -1, 0]) | st.integers(-(2**15), 2**15 - 1),
    "transactional_id": st.none() | st.none() | st.none() | STRINGS,
}
PARTITIONS = st.sampled_from([0, 0, 0, 0, 1, 2, -1, 2**31 - 1, -(2**31)]) | st.integers(
    -(2**31), 2**31 - 1
)
# The values of a tame request: one that reaches the led partition's log (valid or not).
TAME: dict[str, st.SearchStrategy[Any]] = {
    "name": st.just("orders"),
    "topic": st.just("orders"),
    "topic_id": st.just(TOPIC_ID),
    "acks": st.sampled_from([1, -1, 0]),
    "transactional_id": st.none(),
    "replica_id": st.just(-1),
    "current_leader_epoch": st.sampled_from([-1, 0]),
}
for _name in ("index", "partition", "partition_index"):
    BIASED[_name] = PARTITIONS
    TAME[_name] = st.just(0)


def strategy(hint: Any, name: str = "", tame: bool = False) -> st.SearchStrategy[Any]:
    """Values of a kio field's type: adversarial, in the type's range (kio writes them);
    `tame`: those of a request that reaches the led partition."""
    biased = TAME if tame else BIASED
    if name in biased and not dataclasses.is_dataclass(hint):
        if typing.get_origin(hint) is tuple:
            return st.lists(biased[name], max_size=2).map(tuple)
        return biased[name]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        (inner,) = args
        return strategy(inner, name, tame) if tame else st.none() | strategy(inner, name)
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return st.lists(strategy(item, name, tame), max_size=3).map(tuple)
    if dataclasses.is_dataclass(hint):
        return entities(typing.cast(type, hint), tame)
    if hint is bool:
        return st.booleans()
    if isinstance(hint, type) and issubclass(hint, Records):
        return RECORDS
    if isinstance(hint, type) and issubclass(hint, (i32Timedelta, i64Timedelta)):
        return WAITS_MS.map(lambda ms: datetime.timedelta(milliseconds=ms))
    if isinstance(hint, type) and issubclass(hint, int) and hasattr(hint, "__low__"):
        return ints(hint)
    if isinstance(hint, type) and issubclass(hint, str):
        return STRINGS
    if hint is uuid.UUID:
        return UUIDS
    return st.from_type(hint)


_ENTITIES: dict[tuple[type, bool], st.SearchStrategy[Any]] = {}


def entities(cls: type, tame: bool = False) -> st.SearchStrategy[Any]:
    if (cls, tame) not in _ENTITIES:
        hints = typing.get_type_hints(cls)

        def field(hint: Any, name: str) -> st.SearchStrategy[Any]:
            return st.deferred(lambda: strategy(hint, name, tame))  # (entities nest)

        fields = {f.name: field(hints[f.name], f.name) for f in dataclasses.fields(cls)}
        _ENTITIES[cls, tame] = st.builds(cls, **fields)
    return _ENTITIES[cls, tame]


@st.composite
def requests(draw: st.DrawFn) -> tuple[int, int, Any]:
    key, version = draw(st.sampled_from(VERSIONS))
    tame = draw(st.booleans())
    return key, version, draw(entities(load_request_schema(key, version), tame))


def payload_of(request: Any, correlation_id: int) -> bytes:
    return frame(request, correlation_id)[4:]


PEERS = st.sampled_from(
    [Peer("127.0.0.1:40000", ADMIN)] * 4
    + [Peer("127.0.0.1:40001", VIEWER), Peer("127.0.0.1:40002", None)]
)
MODES = st.sampled_from([ANSWER, ANSWER, REFUSE, WRONG])
INT32_EDGES = [-(2**31), -2, -1, 0, 1, 2**31 - 1, 0x7FFF, 0x8000, 0x10000]


@st.composite
def mutated_payloads(draw: st.DrawFn) -> bytes:
    """A valid request's payload, mutated: bits, bytes, an edge int32 anywhere (lengths,
    counts), truncated, extended, bytes inserted, or the header's version changed (the
    body read at another version)."""
    _, _, request = draw(requests())
    data = bytearray(payload_of(request, draw(st.integers(-(2**31), 2**31 - 1))))
    # The api key and version are mutated by "version" alone (a flip there is NotServed).
    first = k.FIXED_HEADER.size
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(
            st.sampled_from(["flip", "byte", "int32", "truncate", "extend", "insert", "version"])
        )
        if kind == "flip" and len(data) > first:
            at = draw(st.integers(first, len(data) - 1))
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and len(data) > first:
            at = draw(st.integers(first, len(data) - 1))
            data[at] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
        elif kind == "int32" and len(data) >= first + 4:
            at = draw(st.integers(first, len(data) - 4))
            struct.pack_into(">i", data, at, draw(st.sampled_from(INT32_EDGES)))
        elif kind == "truncate":
            del data[draw(st.integers(0, len(data))) :]
        elif kind == "extend":
            data += draw(st.binary(min_size=1, max_size=16))
        elif kind == "insert":
            at = draw(st.integers(min(first, len(data)), len(data)))
            data[at:at] = draw(
                st.sampled_from([b"\xff\xff\xff\xff", b"\x80\x80\x80\x80\x0f", b"\x00", b"\xff"])
            )
        elif kind == "version" and len(data) >= 4:  # mostly another served version
            low, high = SERVED.get(struct.unpack_from(">h", data)[0], (0, 0))
            struct.pack_into(">h", data, 2, draw(st.integers(low - 1, high + 1)))
    return bytes(data)


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def test_every_served_request_gets_its_answer(broker: Broker) -> None:
    # A valid batch first, so that the CRC check below always has one to check.
    seed = produce_v9.ProduceRequest(
        transactional_id=None,
        acks=1,  # type: ignore[arg-type]
        timeout=datetime.timedelta(seconds=5),  # type: ignore[arg-type]
        topic_data=(
            produce_v9.TopicProduceData(
                name="orders",  # type: ignore[arg-type]
                partition_data=(produce_v9.PartitionProduceData(index=0, records=batch([b"x"])),),  # type: ignore[arg-type]
            ),
        ),
    )
    assert broker.apis.served == SERVED
    broker.handle(payload_of(seed, 1), Peer("127.0.0.1:1", ADMIN))
    broker.well_formed = True

    @FUZZ
    @given(
        request=requests(), peer=PEERS, mode=MODES, correlation_id=st.integers(-(2**31), 2**31 - 1)
    )
    def run(request: tuple[int, int, Any], peer: Peer, mode: str, correlation_id: int) -> None:
        broker.controller.mode = mode
        broker.handle(payload_of(request[2], correlation_id), peer)

    run()
    assert broker.check_stored_batches() >= 1


def test_every_mutated_frame_is_refused_or_answered(broker: Broker) -> None:
    @FUZZ
    @given(payload=mutated_payloads(), peer=PEERS, mode=MODES)
    def run(payload: bytes, peer: Peer, mode: str) -> None:
        broker.controller.mode = mode
        broker.handle(payload, peer)

    run()
    broker.check_stored_batches()


def header(api_key: int, version: int, *, flexible: bool) -> bytes:
    """A request header v1 (v2 for a flexible version): client id "t"."""
    return struct.pack(">hhih", api_key, version, 7, 1) + b"t" + (b"\0" if flexible else b"")


# Frames the fuzz found, kept as they are: each must be Malformed (and close the connection).
HOSTILE = {
    # kio reserves 8 bytes an item for an array's announced length before reading it: a
    # compact array of 2**32 - 2 topics aborted the process (a 32 GB allocation).
    "huge compact array": header(k.METADATA, 9, flexible=True) + b"\xff\xff\xff\xff\x0f",
    "huge legacy array": header(k.METADATA, 1, flexible=False) + b"\x7f\xff\xff\xff",
    "huge nested array": header(k.CREATE_TOPICS, 5, flexible=True)
    + b"\x02\x02a\x00\x00\x00\x01\x00\x01\xff\xff\xff\xff\x0f",
    # kio reads a null for any array: admin's IncrementalAlterConfigs iterated None.
    "null array": header(k.INCREMENTAL_ALTER_CONFIGS, 1, flexible=True) + b"\x00\x00\x00",
    "null item": header(k.DELETE_TOPICS, 3, flexible=False)
    + b"\x00\x00\x00\x01\xff\xff"
    + b"\x00\x00\x00\x00",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_frames_are_malformed(name: str) -> None:
    decoded = decode_request(HOSTILE[name], SERVED)
    assert isinstance(decoded, Malformed), decoded


# --- real processes ----------------------------------------------------------------------------

SMOKE_FRAMES = 300


@pytest.fixture
def one_broker(tmp_path: Path) -> Iterator[tuple[Cluster, str]]:
    cluster = Cluster(tmp_path, tls=False)
    try:
        cluster.start_controller()
        p = cluster.start_broker(1, "--kafka-listen", f"127.0.0.1:{free_port()}")
        yield cluster, p.field("kafka")
    finally:
        cluster.stop()


PROBE = frame(ApiVersionsRequest(client_software_name="t", client_software_version="1"), 99)


def send(address: str, payload: bytes) -> None:
    """One frame on a connection of its own: its answer, or the connection closed, within
    the time the request asks to wait (plus GRACE_S). An acks=0 Produce is followed by an
    ApiVersions, which must be the first answer."""
    decoded = decode_request(payload, SERVED)
    asked = requested_wait_s(decoded) if isinstance(decoded, Request) else 0.0
    unanswered = (
        isinstance(decoded, Request)
        and decoded.api_key == k.PRODUCE
        and int(decoded.body.acks) == 0
    )
    with connect(address) as sock:
        sock.settimeout(min(asked, WAIT_CAP_S) + GRACE_S)
        sock.sendall(struct.pack(">i", len(payload)) + payload + (PROBE if unanswered else b""))
        try:
            answer = read_frame(sock)
        except TimeoutError:
            assert asked > WAIT_CAP_S, f"no answer to {decoded}"
            return
        except ConnectionResetError:
            answer = b""
    if unanswered:
        assert answer[:4] in (b"", struct.pack(">i", 99)), decoded
    elif isinstance(decoded, (Request, ApiVersionsTooNew)):
        assert answer[:4] == struct.pack(">i", decoded.correlation_id), decoded
    else:
        assert answer == b"", decoded


async def create_topic(cluster: Cluster, name: str) -> None:
    await cluster.wait_until(
        lambda s: len(s.brokers) == 1 and not s.brokers[0].fenced, "broker 1 unfenced"
    )
    r = await cluster.request(
        CreateTopicsRequest(topics=[CreateTopic(name=name, assignments=[[1]], min_isr=1)])
    )
    assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None, r
    await cluster.wait_until(
        lambda s: any(p.topic == name and p.leader == 1 for p in s.partitions), f"{name}-0 led"
    )


@pytest.mark.slow
async def test_a_broker_keeps_serving_after_mutated_frames(
    one_broker: tuple[Cluster, str],
) -> None:
    cluster, address = one_broker
    await create_topic(cluster, "orders")  # for the fuzz (which may delete it: admin APIs)
    frames: list[bytes] = []

    @settings(max_examples=SMOKE_FRAMES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(payload=st.one_of(mutated_payloads(), requests().map(lambda r: payload_of(r[2], 7))))
    def collect(payload: bytes) -> None:
        frames.append(payload)

    collect()
    frames += HOSTILE.values()
    started = time.monotonic()
    for payload in frames:
        await asyncio.to_thread(send, address, payload)
    sent_s = time.monotonic() - started
    # Still serving: ApiVersions, Metadata, and a librdkafka producer's records (on a topic
    # of its own: the frames' admin requests went to the controller, deletions too).
    await create_topic(cluster, "after")
    with connect(address) as sock:
        versions = exchange(sock, ApiVersionsRequest(client_software_name="t",
                            client_software_version="1"), ApiVersionsResponse)  # fmt: skip
        assert int(versions.error_code) == 0 and versions.api_keys
        meta = exchange(
            sock,
            MetadataRequest(
                topics=(MetadataRequestTopic(topic_id=None, name="after"),),  # type: ignore[arg-type]
                allow_auto_topic_creation=False,
                include_topic_authorized_operations=False,
            ),
            MetadataResponse,
        )
        assert [t.name for t in meta.topics] == ["after"] and int(meta.topics[0].error_code) == 0
    producer = Producer({"bootstrap.servers": address, "acks": "all"})
    delivered: list[Any] = []
    for i in range(10):
        producer.produce("after", value=b"after %d" % i, partition=0,
                         on_delivery=lambda e, m: delivered.append(e or m.offset()))  # fmt: skip
    assert producer.flush(30) == 0
    assert len(delivered) == 10 and all(isinstance(o, int) for o in delivered), delivered
    log = (cluster.root / "logs" / "broker-1.log").read_text()
    assert "Traceback" not in log and "request failed" not in log
    assert sent_s < 60, sent_s
