"""A librdkafka consumer past a truncation sees it, and says so (KIP-320 over KIP-966).

Broker 1 holds records its ISR alone acknowledged (MinISR 1), a consumer reads them all,
broker 1 is killed, and the operator elects broker 2, which never had them (an unclean
election: a potential data-loss event, recorded as such). After the leader change the
consumer validates its position with OffsetForLeaderEpoch: broker 2's log ends before
it, and with `auto.offset.reset=error` librdkafka reports the truncation to the
application ("Partition log truncation detected") instead of skipping to whatever offset 10 becomes.

Real processes (`tests/e2e/cluster.py`), mutual TLS; waiting is on observable state.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from metadata_log.records import UncleanRecoveryRecord
from protocol.messages.admin import (
    CreateTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    ElectLeader,
)
from tests.e2e.cluster import Cluster, free_port
from tests.kafka_wire import librdkafka_tls

pytestmark = pytest.mark.slow


def part(s: Any) -> Any:
    return next(p for p in s.partitions if p.topic == "u")


async def test_consumer_past_an_unclean_election_reports_the_truncation(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    consumer: Consumer | None = None
    try:
        cluster.start_controller()
        kafka = {
            b: cluster.start_broker(b, "--kafka-listen", f"127.0.0.1:{free_port()}").field("kafka")
            for b in (1, 2)
        }
        await cluster.wait_until(
            lambda s: len(s.brokers) == 2 and not any(b.fenced for b in s.brokers), "2 brokers"
        )
        r = await cluster.request(
            CreateTopicsRequest(topics=[CreateTopic(name="u", assignments=[[1, 2]], min_isr=1)])
        )
        assert isinstance(r, CreateTopicsResponse) and r.results[0].error_code is None
        await cluster.wait_until(lambda s: part(s).isr == [1, 2], "ISR [1, 2]")
        cluster.kill_broker(2)
        await cluster.wait_until(lambda s: part(s).isr == [1], "ISR [1]")

        tls = librdkafka_tls(cluster.certs)
        bootstrap = ",".join(kafka.values())
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **tls})
        for i in range(10):
            producer.produce("u", value=f"a{i}".encode(), partition=0)
        assert producer.flush(30) == 0  # acknowledged by the ISR [1] (MinISR 1)

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "manual",
                "enable.auto.commit": False,
                "auto.offset.reset": "error",
                "topic.metadata.refresh.interval.ms": 500,
                **tls,
            }
        )
        consumer.assign([TopicPartition("u", 0, 0)])
        seen: list[bytes] = []
        for _ in range(200):  # polls of up to 0.5 s: a bound on a stuck consumer
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen.append(msg.value())
                if len(seen) == 10:
                    break
        assert seen == [f"a{i}".encode() for i in range(10)]

        before = (await cluster.describe()).committed_offset
        cluster.kill_broker(1, signal.SIGKILL)
        await cluster.wait_until(lambda s: part(s).leader == -1, "no leader")
        cluster.start_broker(2, "--kafka-listen", kafka[2])
        await cluster.wait_until(
            lambda s: any(b.broker_id == 2 and not b.fenced for b in s.brokers), "broker 2 back"
        )
        await cluster.request(
            ElectLeader(topic="u", partition=0, election_type="unclean", replica=2)
        )
        await cluster.wait_until(lambda s: part(s).leader == 2, "broker 2 elected")
        _, rec = await cluster.wait_for_record(
            lambda r: isinstance(r, UncleanRecoveryRecord) and r.topic == "u",
            "the unclean recovery's record",
            from_offset=before,
        )
        assert isinstance(rec, UncleanRecoveryRecord) and rec.potential_data_loss

        truncation: KafkaError | None = None
        for _ in range(240):  # polls of up to 0.5 s
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None and "truncation detected" in msg.error().str():
                truncation = msg.error()
                break
            assert msg.error() is not None or msg.offset() < 10, "read past a truncation"
        assert truncation is not None, "the consumer never saw the truncation"
        # librdkafka hands the application the reset it could not make (auto.offset.reset
        # =error), naming the truncation: offset 10 of leader epoch 0, the log ending at 0.
        assert truncation.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError._LOG_TRUNCATION)
        assert "at offset 10" in truncation.str() and "end offset is 0" in truncation.str()

        # The new leader stamps what it appends with its own leader epoch: a consumer
        # validating a later position names that epoch.
        epoch = part(await cluster.describe()).leader_epoch
        producer.produce("u", value=b"b0", partition=0)
        assert producer.flush(30) == 0
        consumer.assign([TopicPartition("u", 0, 0)])
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None
        assert (msg.offset(), msg.value(), msg.leader_epoch()) == (0, b"b0", epoch)
    finally:
        if consumer is not None:
            consumer.close()
        cluster.stop()
