"""`metactl chaos run --client librdkafka`: a Kafka client nobody here wrote produces,
follows and reads back the chaos topic through the brokers' Kafka listeners
(`--kafka-listen`, docs/kafka.md).

- **Producers** (`produce`): `--producers` confluent-kafka `Producer`s, one thread each,
  acks=all with idempotence, a short `message.timeout.ms` so that a failure surfaces as
  a failed delivery report instead of waiting out the run. Each produces unique values
  (`p{partition}-{seq}`) to explicit partitions, at most `RATE` records a second and
  `IN_FLIGHT` records outstanding per partition. The delivery reports of one `poll` are
  written and fsynced in the acked log (one JSON line per record: partition, offset,
  value) and only then handed to `record` (the runner's count, under its lock), so an
  acknowledgement counts only once it is durable and every `bound` taken after the
  runner saw it comes from a metadata read that left after the record was logged. A
  failed delivery is counted by Kafka's error name; a fatal producer error
  (idempotence) replaces the producer.
- **Follower** (`follow`): one `Consumer` with `auto.offset.reset=error`, every
  partition assigned from offset 0, polled through the run. After a leader change
  librdkafka validates its position with OffsetForLeaderEpoch (KIP-320); a position past
  the new leader's end of its epoch is `_LOG_TRUNCATION` ("Partition log truncation
  detected ..."; with `auto.offset.reset=error` librdkafka 2.x delivers it as
  `_AUTO_OFFSET_RESET` carrying that text: both count), per partition, after which the
  follower seeks to the offset the error names (0 when it names none) and goes on. Any
  other `_AUTO_OFFSET_RESET` (a position beyond the log found without an epoch) is
  counted apart.
- **Read-back** (`read_back`): after healing, each readable partition from offset 0 to
  its high watermark through Kafka Fetch: offset -> (leader epoch of its batch, value),
  the input of `chaos.check.content_inputs`.

All of it blocks (librdkafka's calls): the runner runs it in threads. This module owns
the Kafka client side only: no processes, no metadata protocol, no verdict.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from chaos.check import TOPIC, KafkaLog

IN_FLIGHT = 200  # records per partition produced and not yet reported
# Records per second per partition. librdkafka alone would produce some 30,000 records/s
# here, and the checker keeps every acknowledged record and every record read back in
# memory (over 1 GB for a minute); the question is what becomes of each, not how many.
RATE = 500
MESSAGE_TIMEOUT_MS = 8000
POLL_S = 0.05
READ_STALL_S = 30.0  # a read-back that makes no progress this long gives up on the partition
EXAMPLES = 10
# librdkafka logs every refused connection to a killed broker at level 3 (error) on
# stderr; 2 keeps only the critical ones (delivery reports and errors still count).
LOG_LEVEL = 2
# With auto.offset.reset=error, librdkafka 2.x reports a truncation its OffsetForLeaderEpoch
# validation found as _AUTO_OFFSET_RESET whose text carries _LOG_TRUNCATION's ("Partition
# log truncation detected at offset O (leader epoch E): broker end offset is ...").
TRUNCATED = "log truncation detected"

Delivered = tuple[int, int, bytes]  # partition, offset, value


def producer_settings(bootstrap: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": MESSAGE_TIMEOUT_MS,
        "request.timeout.ms": 5000,
        "linger.ms": 5,
        "retry.backoff.ms": 100,
        "reconnect.backoff.max.ms": 1000,
        "topic.metadata.refresh.interval.ms": 1000,
        "compression.type": "none",
        "log_level": LOG_LEVEL,
    }


def consumer_settings(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "group.id": "metactl-chaos",  # never joined: partitions are assigned by hand
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "topic.metadata.refresh.interval.ms": 1000,
        "fetch.wait.max.ms": 100,
        "reconnect.backoff.max.ms": 1000,
        "log_level": LOG_LEVEL,
        **extra,
    }


class ValueLog:
    """The acked log of a librdkafka run: one JSON line per delivered record, fsynced
    before the records count."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._lock = threading.Lock()

    def append(self, records: list[Delivered]) -> None:
        lines = "".join(
            json.dumps(
                {"topic": TOPIC, "partition": p, "offset": o, "value": v.decode(), "acks": "all"},
                separators=(",", ":"),
            )
            + "\n"
            for p, o, v in records
        )
        with self._lock:
            self._file.write(lines)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._file.close()


@dataclass
class KafkaClients:
    bootstrap: str
    partitions: int
    producers: int
    log: ValueLog
    record: Callable[[list[Delivered]], None]  # after the durable write
    refused: Callable[[str], None]
    stop: threading.Event = field(default_factory=threading.Event)  # the producers
    stop_following: threading.Event = field(default_factory=threading.Event)
    truncations: Counter[int] = field(default_factory=Counter)
    offset_resets: Counter[int] = field(default_factory=Counter)
    consumer_errors: Counter[str] = field(default_factory=Counter)
    truncation_examples: list[str] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)  # the follower's next offsets
    producer_restarts: int = 0
    _seq: Counter[int] = field(default_factory=Counter)

    def groups(self) -> list[list[int]]:
        out: dict[int, list[int]] = {}
        for part in range(self.partitions):
            out.setdefault(part % self.producers, []).append(part)
        return list(out.values())

    # --- producing ----------------------------------------------------------------------

    def produce(self, parts: list[int]) -> None:
        """One producer thread's life: produce to `parts` until `stop`, then flush what
        is in flight (its reports count as the rest)."""
        outstanding: Counter[int] = Counter()
        delivered: list[Delivered] = []
        fatal = False
        tokens = dict.fromkeys(parts, 0.0)  # the rate limit: a bucket per partition
        last = time.monotonic()

        def on_delivery(err: KafkaError | None, msg: Message) -> None:
            nonlocal fatal
            part = msg.partition()
            assert part is not None
            outstanding[part] -= 1
            if err is None:
                offset, value = msg.offset(), msg.value()
                assert offset is not None and isinstance(value, bytes)
                delivered.append((part, offset, value))
            else:
                self.refused(err.name())
                fatal |= err.fatal()

        def settle() -> None:
            if delivered:
                batch = list(delivered)
                delivered.clear()
                self.log.append(batch)  # durable first ...
                self.record(batch)  # ... then it counts

        while True:
            producer = Producer(producer_settings(self.bootstrap))
            fatal = False
            outstanding.clear()
            while not self.stop.is_set() and not fatal:
                now = time.monotonic()
                for part in parts:
                    tokens[part] = min(tokens[part] + (now - last) * RATE, RATE * POLL_S * 2)
                last = now
                for part in parts:
                    while outstanding[part] < IN_FLIGHT and tokens[part] >= 1:
                        value = f"p{part}-{self._seq[part]}".encode()
                        try:
                            producer.produce(
                                TOPIC, value=value, partition=part, on_delivery=on_delivery
                            )
                        except BufferError:
                            break
                        except KafkaException as exc:
                            self.refused(exc.args[0].name() if exc.args else "KafkaException")
                            break
                        self._seq[part] += 1
                        outstanding[part] += 1
                        tokens[part] -= 1
                producer.poll(POLL_S)
                settle()
            if not fatal:
                producer.flush(MESSAGE_TIMEOUT_MS / 1000 + 5)
                settle()
                return
            settle()
            self.producer_restarts += 1  # a fatal error: this producer is done, a new one
            producer.purge()
            producer.flush(0)
            settle()

    # --- following ---------------------------------------------------------------------

    def follow(self) -> None:
        """Consume every partition from 0 until `stop_following`, counting the truncations
        librdkafka detects."""
        c = Consumer(consumer_settings(self.bootstrap, **{"auto.offset.reset": "error"}))
        try:
            c.assign([TopicPartition(TOPIC, p, 0) for p in range(self.partitions)])
            while not self.stop_following.is_set():
                for msg in c.consume(1000, 0.2):
                    err = msg.error()
                    part = msg.partition()
                    if err is None:
                        offset = msg.offset()
                        if part is not None and offset is not None:
                            self.positions[part] = offset + 1
                        continue
                    code = err.code()
                    if part is not None and (
                        code == KafkaError._LOG_TRUNCATION
                        or (code == KafkaError._AUTO_OFFSET_RESET and TRUNCATED in err.str())
                    ):
                        self.truncations[part] += 1
                    elif code == KafkaError._AUTO_OFFSET_RESET and part is not None:
                        self.offset_resets[part] += 1
                    else:
                        self.consumer_errors[err.name()] += 1
                        continue
                    if len(self.truncation_examples) < EXAMPLES:
                        self.truncation_examples.append(
                            f"{TOPIC}-{part} at {msg.offset()}: {err.name()}: {err.str()}"
                        )
                    # Go on from the offset the error names (the new leader's end of
                    # our epoch), or the start if it names none.
                    offset = msg.offset()
                    resume = offset if offset is not None and offset >= 0 else 0
                    self.positions[part] = resume
                    # The error stopped the partition's fetcher (auto.offset.reset=error):
                    # assign it again, from there.
                    c.incremental_unassign([TopicPartition(TOPIC, part)])
                    c.incremental_assign([TopicPartition(TOPIC, part, resume)])
        finally:
            c.close()

    def caught_up(self, logs: dict[int, KafkaLog]) -> bool:
        """Whether the follower has reached the end of every final log read back (a
        follower still past a truncation it has not detected has not)."""
        return all(self.positions.get(p, 0) == len(log) for p, log in logs.items())


def read_back(bootstrap: str, partitions: list[int]) -> tuple[dict[int, KafkaLog], dict[int, str]]:
    """Every partition's final log through Kafka Fetch, from 0 to its high watermark:
    offset -> (leader epoch of its batch, -1 if unknown; value). A partition that cannot
    be read is in the second dict, with why."""
    logs: dict[int, KafkaLog] = {}
    errors: dict[int, str] = {}
    c = Consumer(consumer_settings(bootstrap, **{"auto.offset.reset": "error"}))
    try:
        for part in partitions:
            try:
                _, high = c.get_watermark_offsets(TopicPartition(TOPIC, part), timeout=30)
            except KafkaException as exc:
                errors[part] = str(exc)
                continue
            log: KafkaLog = {}
            c.assign([TopicPartition(TOPIC, part, 0)])
            last = time.monotonic()
            while len(log) < high and time.monotonic() - last < READ_STALL_S:
                for msg in c.consume(5000, 0.5):
                    err = msg.error()
                    if err is not None:
                        errors[part] = f"{err.name()}: {err.str()}"
                        continue
                    offset = msg.offset()
                    if offset is None or offset >= high:
                        continue
                    epoch = msg.leader_epoch()
                    log[offset] = (-1 if epoch is None else epoch, msg.value())
                    last = time.monotonic()
            c.unassign()
            if len(log) < high:
                errors.setdefault(part, f"read {len(log)} of {high} records")
                continue
            errors.pop(part, None)
            logs[part] = log
    finally:
        c.close()
    return logs, errors
