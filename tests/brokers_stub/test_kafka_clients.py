"""Kafka clients nobody here wrote, producing and consuming through the brokers' Kafka
listeners over mutual TLS: confluent-kafka (librdkafka) with acks=all and idempotence,
aiokafka, and Debian's `kcat`; and kio-framed requests of our own for the answers a
client hides (Kafka's error codes, ListOffsets, OffsetForLeaderEpoch, FindCoordinator).

Real processes: a controller and three brokers (`tests/e2e/cluster.py`), one cluster for
the module. Waiting is on observable state, never a timed assertion.
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest
from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
from kio.schema.list_offsets.v7 import request as lo_req
from kio.schema.list_offsets.v7.response import ListOffsetsResponse
from kio.schema.offset_for_leader_epoch.v4 import request as ofle_req
from kio.schema.offset_for_leader_epoch.v4.response import OffsetForLeaderEpochResponse
from kio.schema.produce.v9 import request as produce_req
from kio.schema.produce.v9.response import ProduceResponse

from protocol.messages.admin import CreateTopic, CreateTopicsRequest, CreateTopicsResponse
from protocol.messages.data import ACKS_LEADER, ProduceRequest
from protocol.tls import VIEWER
from tests.e2e.cluster import Cluster, free_port
from tests.kafka_wire import (
    batch,
    client_context,
    connect,
    exchange,
    kcat_flags,
    librdkafka_tls,
)

pytestmark = pytest.mark.slow
KCAT = shutil.which("kcat")
BROKERS = (1, 2, 3)


class Kafka:
    def __init__(self, cluster: Cluster, addresses: dict[int, str]) -> None:
        self.cluster = cluster
        self.addresses = addresses
        self.bootstrap = ",".join(addresses[b] for b in BROKERS)
        self.tls = librdkafka_tls(cluster.certs)

    def producer(self, **extra: Any) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, **self.tls, **extra})

    def consumer(self, **extra: Any) -> Consumer:
        settings = {
            "bootstrap.servers": self.bootstrap,
            "group.id": "manual",  # never joined: partitions are assigned by hand
            "enable.auto.commit": False,
            **self.tls,
            **extra,
        }
        return Consumer(settings)


async def _setup(cluster: Cluster) -> None:
    await cluster.wait_until(
        lambda s: len(s.brokers) == 3 and not any(b.fenced for b in s.brokers), "3 brokers"
    )
    r = await cluster.request(
        CreateTopicsRequest(
            topics=[
                CreateTopic(name="t", assignments=[[1, 2, 3]], min_isr=2),
                CreateTopic(name="k", assignments=[[2, 3, 1], [3, 1, 2]], min_isr=2),
            ]
        )
    )
    assert isinstance(r, CreateTopicsResponse)
    assert [x.error_code for x in r.results] == [None, None]
    await cluster.wait_until(
        lambda s: all(len(p.isr) == 3 for p in s.partitions if p.topic in ("t", "k")), "full ISRs"
    )


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kafka]:
    cluster = Cluster(tmp_path_factory.mktemp("kafka-clients"))
    try:
        cluster.start_controller()
        addresses = {}
        for b in BROKERS:
            p = cluster.start_broker(b, "--kafka-listen", f"127.0.0.1:{free_port()}")
            addresses[b] = p.field("kafka")
        asyncio.run(_setup(cluster))
        yield Kafka(cluster, addresses)
    finally:
        cluster.stop()


def consume(consumer: Consumer, tp: TopicPartition, count: int) -> list[Any]:
    """`count` messages of `tp` from its assigned offset, in the order delivered."""
    consumer.assign([tp])
    got: list[Any] = []
    deadline = 600  # polls of up to 0.5 s: a bound on a stuck consumer, not a timing
    while len(got) < count and deadline > 0:
        deadline -= 1
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        got.append(msg)
    assert len(got) == count, f"{len(got)} of {count} messages"
    return got


# --- librdkafka -----------------------------------------------------------------------------


def test_librdkafka_idempotent_acks_all_round_trip(kafka: Kafka) -> None:
    reports: list[tuple[Any, Any]] = []
    producer = kafka.producer(
        **{"acks": "all", "enable.idempotence": True, "linger.ms": 5, "compression.type": "none"}
    )
    values = [f"value-{i}".encode() for i in range(500)]
    for i, v in enumerate(values):
        producer.produce(
            "t",
            value=v,
            key=str(i).encode(),
            partition=0,
            headers=[("h", b"x")],
            on_delivery=lambda err, msg: reports.append((err, msg)),
        )
    assert producer.flush(60) == 0
    assert [err for err, _ in reports if err is not None] == []
    offsets = sorted(msg.offset() for _, msg in reports)
    assert offsets == list(range(500))  # idempotence: no gap, no duplicate

    consumer = kafka.consumer()
    try:
        got = consume(consumer, TopicPartition("t", 0, 0), 500)
        assert [m.value() for m in got] == values
        assert [m.key() for m in got] == [str(i).encode() for i in range(500)]
        assert [m.offset() for m in got] == list(range(500))
        assert got[0].headers() == [("h", b"x")]
        low, high = consumer.get_watermark_offsets(TopicPartition("t", 0), timeout=30)
        assert (low, high) >= (0, 500)
    finally:
        consumer.close()


def test_compressed_batches_pass_through(kafka: Kafka) -> None:
    producer = kafka.producer(**{"acks": "all", "compression.type": "gzip", "linger.ms": 20})
    values = [b"z" * 100 + str(i).encode() for i in range(200)]
    errors: list[Any] = []
    for v in values:
        producer.produce("k", value=v, partition=1, on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(60) == 0
    assert [e for e in errors if e is not None] == []
    consumer = kafka.consumer()
    try:
        got = consume(consumer, TopicPartition("k", 1, 0), 200)
        assert [m.value() for m in got] == values
    finally:
        consumer.close()


def test_native_records_read_as_null_records(kafka: Kafka) -> None:
    """metactl's own producer sends no bytes: a Kafka consumer reads its records as
    records with a null key and value, at their offsets, between the real ones."""
    cluster = kafka.cluster
    leader = cluster.brokers[2].field("endpoint")  # k-0's leader
    producer = kafka.producer(acks="all")
    producer.produce("k", value=b"before", partition=0)
    assert producer.flush(30) == 0

    async def native() -> Any:
        client = cluster.security.broker_client(leader, 2, connect_timeout=5.0)
        try:
            req = ProduceRequest(topic="k", partition=0, acks=ACKS_LEADER, count=3)
            return await client.request(req, 10.0)
        finally:
            await client.close()

    r = asyncio.run(native())
    producer.produce("k", value=b"after", partition=0)
    assert producer.flush(30) == 0
    consumer = kafka.consumer()
    try:
        got = consume(consumer, TopicPartition("k", 0, 0), 5)
        assert [(m.offset(), m.value()) for m in got] == [
            (0, b"before"),
            (1, None),
            (2, None),
            (3, None),
            (4, b"after"),
        ]
        assert getattr(r, "base_offset", None) == 1
    finally:
        consumer.close()


# --- aiokafka and kcat ----------------------------------------------------------------------


def test_aiokafka_round_trip(kafka: Kafka) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AioTP

    ctx = client_context(kafka.cluster.certs)

    async def run() -> list[tuple[int, bytes | None]]:
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap,
            security_protocol="SSL",
            ssl_context=ctx,
            acks="all",
            enable_idempotence=True,
        )
        await producer.start()
        try:
            sent = [await producer.send_and_wait("k", f"aio-{i}".encode(), partition=1)
                    for i in range(20)]  # fmt: skip
        finally:
            await producer.stop()
        first = sent[0].offset
        assert [m.offset for m in sent] == list(range(first, first + 20))
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka.bootstrap,
            security_protocol="SSL",
            ssl_context=ctx,
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            tp = AioTP("k", 1)
            consumer.assign([tp])
            consumer.seek(tp, first)
            out: list[tuple[int, bytes | None]] = []
            while len(out) < 20:
                batch_ = await consumer.getmany(tp, timeout_ms=1000)
                out += [(m.offset, m.value) for m in batch_.get(tp, [])]
            end = (await consumer.end_offsets([tp]))[tp]
            assert end >= first + 20
            return out[:20]
        finally:
            await consumer.stop()

    out = asyncio.run(run())
    assert [v for _, v in out] == [f"aio-{i}".encode() for i in range(20)]


@pytest.mark.skipif(KCAT is None, reason="kcat missing: run `make system`")
def test_kcat_produce_and_consume(kafka: Kafka, tmp_path: Path) -> None:
    assert KCAT is not None
    flags = kcat_flags(kafka.tls)
    lines = [f"line {i}" for i in range(50)]
    subprocess.run(
        [KCAT, "-P", "-b", kafka.bootstrap, "-t", "k", "-p", "0", "-X", "acks=all", *flags],
        input="\n".join(lines) + "\n",
        text=True,
        check=True,
        timeout=60,
    )
    out = subprocess.run(
        [KCAT, "-C", "-b", kafka.bootstrap, "-t", "k", "-p", "0", "-o", "beginning", "-e",
         "-f", "%o %s\n", *flags],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    got = [line.split(" ", 1)[1] for line in out.stdout.splitlines() if " " in line]
    assert got[-50:] == lines


# --- Kafka's answers, with requests of our own ------------------------------------------------


def produce_request(topic: str, partition: int, records: bytes, acks: int = -1) -> Any:
    return produce_req.ProduceRequest(
        transactional_id=None,
        acks=acks,  # type: ignore[arg-type]
        timeout=datetime.timedelta(seconds=10),  # type: ignore[arg-type]
        topic_data=(
            produce_req.TopicProduceData(
                name=topic,  # type: ignore[arg-type]
                partition_data=(
                    produce_req.PartitionProduceData(index=partition, records=records),  # type: ignore[arg-type]
                ),
            ),
        ),
    )


def partition_answer(r: Any) -> Any:
    return r.responses[0].partition_responses[0]


def test_produce_errors_named_as_kafka_names_them(kafka: Kafka) -> None:
    ctx = client_context(kafka.cluster.certs)
    good = batch([b"a", b"b"])
    corrupt = bytearray(good)
    corrupt[-1] ^= 0xFF  # a record byte: the CRC no longer matches
    with connect(kafka.addresses[1], ctx) as sock:  # t-0's leader
        cases = [
            (produce_request("t", 0, bytes(corrupt)), ErrorCode.corrupt_message),
            (produce_request("t", 0, good + good), ErrorCode.invalid_record),  # two batches
            (produce_request("absent", 0, good), ErrorCode.unknown_topic_or_partition),
            (produce_request("k", 0, good), ErrorCode.not_leader_or_follower),  # led by 2
            (produce_request("t", 0, good), ErrorCode.none),
        ]
        for i, (request, code) in enumerate(cases):
            p = partition_answer(exchange(sock, request, ProduceResponse, correlation_id=i))
            assert p.error_code == code, (i, p)  # and the connection serves on
        assert p.base_offset >= 0
    viewer = client_context(kafka.cluster.certs, VIEWER)
    with connect(kafka.addresses[1], viewer) as sock:
        p = partition_answer(exchange(sock, produce_request("t", 0, good), ProduceResponse))
        assert p.error_code == ErrorCode.topic_authorization_failed
    log = (kafka.cluster.root / "logs" / "broker-1.log").read_text()
    assert "Traceback" not in log


def test_idempotent_sequence_checks(kafka: Kafka) -> None:
    ctx = client_context(kafka.cluster.certs)
    pid = 987_654_321
    first = batch([b"s0", b"s1"], producer_id=pid, producer_epoch=0, base_sequence=0)
    gap = batch([b"s5"], producer_id=pid, producer_epoch=0, base_sequence=5)
    with connect(kafka.addresses[1], ctx) as sock:
        a = partition_answer(exchange(sock, produce_request("t", 0, first), ProduceResponse))
        assert a.error_code == ErrorCode.none
        again = partition_answer(exchange(sock, produce_request("t", 0, first), ProduceResponse))
        assert (again.error_code, again.base_offset) == (ErrorCode.none, a.base_offset)
        out = partition_answer(exchange(sock, produce_request("t", 0, gap), ProduceResponse))
        assert out.error_code == ErrorCode.out_of_order_sequence_number
    consumer = kafka.consumer()
    try:  # the duplicate was not stored twice, the gap not at all
        got = consume(consumer, TopicPartition("t", 0, a.base_offset), 2)
        assert [m.value() for m in got] == [b"s0", b"s1"]
        _, high = consumer.get_watermark_offsets(TopicPartition("t", 0), timeout=30)
        assert high == a.base_offset + 2
    finally:
        consumer.close()


def test_list_offsets_offset_for_leader_epoch_and_find_coordinator(kafka: Kafka) -> None:
    ctx = client_context(kafka.cluster.certs)
    ts = 1_800_000_000_000
    with connect(kafka.addresses[3], ctx) as sock:  # k-1's leader
        p = partition_answer(
            exchange(
                sock, produce_request("k", 1, batch([b"x", b"y"], timestamp_ms=ts)), ProduceResponse
            )
        )
        assert p.error_code == ErrorCode.none
        lo = exchange(
            sock,
            lo_req.ListOffsetsRequest(
                replica_id=-1,  # type: ignore[arg-type]
                isolation_level=0,  # type: ignore[arg-type]
                topics=(
                    lo_req.ListOffsetsTopic(
                        name="k",  # type: ignore[arg-type]
                        partitions=tuple(
                            lo_req.ListOffsetsPartition(
                                partition_index=1,  # type: ignore[arg-type]
                                current_leader_epoch=-1,  # type: ignore[arg-type]
                                timestamp=t,  # type: ignore[arg-type]
                            )
                            for t in (-2, -1, ts, ts + 1)
                        ),
                    ),
                ),
            ),
            ListOffsetsResponse,
        )
        earliest, latest, at, after = lo.topics[0].partitions
        assert (earliest.error_code, earliest.offset) == (ErrorCode.none, 0)
        assert latest.offset == p.base_offset + 2
        assert (at.offset, at.timestamp) == (p.base_offset, ts)
        assert after.offset == -1  # no record that late
        of = exchange(
            sock,
            ofle_req.OffsetForLeaderEpochRequest(
                replica_id=-1,  # type: ignore[arg-type]
                topics=(
                    ofle_req.OffsetForLeaderTopic(
                        topic="k",  # type: ignore[arg-type]
                        partitions=(
                            ofle_req.OffsetForLeaderPartition(
                                partition=1,  # type: ignore[arg-type]
                                current_leader_epoch=-1,  # type: ignore[arg-type]
                                leader_epoch=latest.leader_epoch,  # type: ignore[arg-type]
                            ),
                        ),
                    ),
                ),
            ),
            OffsetForLeaderEpochResponse,
        )
        e = of.topics[0].partitions[0]
        assert (e.error_code, e.leader_epoch, e.end_offset) == (
            ErrorCode.none,
            latest.leader_epoch,
            latest.offset,
        )
        fc = exchange(
            sock,
            FindCoordinatorRequest(key_type=0, coordinator_keys=("g",)),  # type: ignore[arg-type]
            FindCoordinatorResponse,
        )
        (c,) = fc.coordinators
        assert c.error_code == ErrorCode.coordinator_not_available
        assert "consumer groups" in (c.error_message or "")


def test_acks_all_below_min_isr_is_refused(kafka: Kafka) -> None:
    """Last in the module: it stops two brokers."""
    cluster = kafka.cluster
    cluster.kill_broker(3)
    cluster.kill_broker(2)
    asyncio.run(
        cluster.wait_until(
            lambda s: next(p for p in s.partitions if p.topic == "t").isr == [1], "ISR [1]"
        )
    )
    ctx = client_context(cluster.certs)
    with connect(kafka.addresses[1], ctx) as sock:
        p = partition_answer(
            exchange(sock, produce_request("t", 0, batch([b"n"])), ProduceResponse)
        )
        assert p.error_code == ErrorCode.not_enough_replicas
        one = partition_answer(
            exchange(sock, produce_request("t", 0, batch([b"n"]), acks=1), ProduceResponse)
        )
        assert one.error_code == ErrorCode.none
    assert KafkaError.NOT_ENOUGH_REPLICAS == 19
