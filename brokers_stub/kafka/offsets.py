"""Kafka's offset and producer-id APIs on the broker: ListOffsets, OffsetForLeaderEpoch,
InitProducerId, and FindCoordinator's refusal.

- ListOffsets: earliest (0: no retention), latest (the high watermark), max timestamp
  (v7), and by timestamp (the stored batches' timestamps; offsets without bytes have
  none).
- OffsetForLeaderEpoch: the end offset of an epoch, as Kafka's leader-epoch cache
  answers it (`host.end_offset_for_epoch`): what a consumer past an unclean recovery
  uses to see the truncation.
- InitProducerId (`ProducerIds`): a new producer id for an idempotent producer (no
  transactions), unique across the cluster without the controller.
- FindCoordinator: COORDINATOR_NOT_AVAILABLE with a message saying why: there are no
  consumer groups (or transactions). A consumer with a manual assignment needs none.

It reads through `KafkaHost` only; it must not authorize (`data` passes the refusal in),
frame bytes (`protocol.kafka`) or change a replica.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from brokers_stub.kafka.host import (
    NO_TIMESTAMP,
    UNKNOWN_OFFSET,
    KafkaHost,
    check_current_epoch,
    end_offset_for_epoch,
)
from brokers_stub.replica_log import NO_EPOCH, ReplicaLog, epoch_at
from metactl.errors import InvalidRequestError, MetactlError
from metadata_image.state import TopicPartition
from protocol.kafka import framing as k
from protocol.kafka.errors import kafka_code
from protocol.kafka.framing import Request
from protocol.kafka.metadata import NO_THROTTLE, make, nested
from protocol.kafka.records import record_at_timestamp

EARLIEST: Final = -2
LATEST: Final = -1
MAX_TIMESTAMP: Final = -3
PRODUCER_IDS_PER_EPOCH: Final = 1 << 20
NO_COORDINATOR: Final = (
    "metactl has no group or transaction coordinator: consumer groups and transactions "
    "are not served; assign partitions and keep offsets yourself (docs/kafka.md)"
)


# --- ListOffsets ------------------------------------------------------------------------


def list_offsets(host: KafkaHost, request: Request, denied: ErrorCode | None) -> Any:
    """ListOffsets' answer (`denied`: the principal's refusal, or None)."""
    body, version = request.body, request.api_version
    response_cls: Any = load_response_schema(k.LIST_OFFSETS, version)
    topic_cls = nested(response_cls, "ListOffsetsTopicResponse")
    partition_cls = nested(response_cls, "ListOffsetsPartitionResponse")
    topics = []
    for topic in body.topics:
        parts = []
        for part in topic.partitions:
            index = int(part.partition_index)
            error, ts, offset, epoch = ErrorCode.none, NO_TIMESTAMP, UNKNOWN_OFFSET, NO_EPOCH
            if denied is not None:
                error = denied
            else:
                try:
                    ts, offset, epoch = _offset_for(host, topic.name, index, part)
                except MetactlError as exc:
                    error = kafka_code(exc)
            parts.append(
                make(
                    partition_cls,
                    partition_index=index,
                    error_code=error,
                    timestamp=ts,
                    offset=offset,
                    leader_epoch=epoch,
                )
            )
        topics.append(make(topic_cls, name=topic.name, partitions=tuple(parts)))
    return make(response_cls, throttle_time=NO_THROTTLE, topics=tuple(topics))


def _offset_for(host: KafkaHost, topic: str, partition: int, part: Any) -> tuple[int, int, int]:
    """(timestamp, offset, leader epoch) of a ListOffsets partition."""
    p, _, log = host.data.led(topic, partition)
    check_current_epoch(getattr(part, "current_leader_epoch", -1), p.leader_epoch)
    hw = log.high_watermark
    target = int(part.timestamp)
    if target == LATEST:
        return NO_TIMESTAMP, hw, log.last_leader_epoch
    if target == EARLIEST:
        return NO_TIMESTAMP, 0, _epoch_or_none(log, 0)
    if target < MAX_TIMESTAMP:
        raise InvalidRequestError(f"timestamp {target} is not a ListOffsets target")
    batches = [h for h in log.batches() if h.next_offset <= hw]
    if target == MAX_TIMESTAMP:
        if not batches:
            return NO_TIMESTAMP, UNKNOWN_OFFSET, NO_EPOCH
        best = max(batches, key=lambda h: (h.max_timestamp, -h.base_offset))
        target = best.max_timestamp
        candidates = [best]
    else:
        candidates = [h for h in batches if h.max_timestamp >= target][:1]
    for h in candidates:
        data = _batch_bytes(host, p.tp, h.base_offset)
        found = record_at_timestamp(data, target) if data is not None else None
        if found is not None:
            ts, offset = found
            return ts, offset, _epoch_or_none(log, offset)
    return NO_TIMESTAMP, UNKNOWN_OFFSET, NO_EPOCH


def _batch_bytes(host: KafkaHost, tp: TopicPartition, base_offset: int) -> bytes | None:
    for chunk in host.read(tp, base_offset, base_offset + 1, 1):
        if chunk.base_offset == base_offset:
            return chunk.data
    return None


def _epoch_or_none(log: ReplicaLog, offset: int) -> int:
    epoch = epoch_at(log.leader_epochs, offset)
    return NO_EPOCH if epoch is None or offset >= log.log_end_offset else epoch


# --- OffsetForLeaderEpoch ---------------------------------------------------------------


def offset_for_leader_epoch(host: KafkaHost, request: Request, denied: ErrorCode | None) -> Any:
    """OffsetForLeaderEpoch's answer (`denied`: the principal's refusal, or None)."""
    body, version = request.body, request.api_version
    response_cls: Any = load_response_schema(k.OFFSET_FOR_LEADER_EPOCH, version)
    topic_cls = nested(response_cls, "OffsetForLeaderTopicResult")
    partition_cls = nested(response_cls, "EpochEndOffset")
    topics = []
    for topic in body.topics:
        parts = []
        for part in topic.partitions:
            index = int(part.partition)
            error, epoch, end = ErrorCode.none, NO_EPOCH, UNKNOWN_OFFSET
            if denied is not None:
                error = denied
            else:
                try:
                    p, _, log = host.data.led(topic.topic, index)
                    check_current_epoch(part.current_leader_epoch, p.leader_epoch)
                    epoch, end = end_offset_for_epoch(log, int(part.leader_epoch))
                except MetactlError as exc:
                    error = kafka_code(exc)
            parts.append(
                make(
                    partition_cls,
                    error_code=error,
                    partition=index,
                    leader_epoch=epoch,
                    end_offset=end,
                )
            )
        topics.append(make(topic_cls, topic=topic.topic, partitions=tuple(parts)))
    return make(response_cls, throttle_time=NO_THROTTLE, topics=tuple(topics))


# --- InitProducerId ---------------------------------------------------------------------


class ProducerIds:
    """The producer ids this broker issues, in its current registration."""

    def __init__(self, broker_epoch: Callable[[], int | None]) -> None:
        self._broker_epoch = broker_epoch
        self._issued = 0  # issued in the current broker epoch
        self._epoch: int | None = None

    def answer(self, request: Request, denied: ErrorCode | None) -> Any:
        """A new producer id, epoch 0 (Kafka's answer to an idempotent producer, which
        also asks again, with its old id, to bump its epoch after an error: it gets a new
        id, as from Kafka). Ids are unique across the cluster and over time without the
        controller: the broker's epoch (the offset of its registration, never reused)
        times 2**20, plus a counter of this registration's ids."""
        body, version = request.body, request.api_version
        response_cls: Any = load_response_schema(k.INIT_PRODUCER_ID, version)
        error = denied
        producer_id = -1
        if error is None and body.transactional_id is not None:
            error = ErrorCode.coordinator_not_available  # no transactions (docs/kafka.md)
        if error is None:
            epoch = self._broker_epoch()
            if epoch != self._epoch:
                self._epoch, self._issued = epoch, 0
            if epoch is None or self._issued >= PRODUCER_IDS_PER_EPOCH:
                # Not registered yet, or this registration's ids are spent: another broker
                # (or this one, registered again) issues them; the client retries.
                error = ErrorCode.coordinator_not_available
            else:
                producer_id = epoch * PRODUCER_IDS_PER_EPOCH + self._issued
                self._issued += 1
        return make(
            response_cls,
            throttle_time=NO_THROTTLE,
            error_code=error or ErrorCode.none,
            producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else -1,
        )


# --- FindCoordinator --------------------------------------------------------------------


def find_coordinator(request: Request) -> Any:
    """No group or transaction coordinator: COORDINATOR_NOT_AVAILABLE, saying why."""
    body, version = request.body, request.api_version
    response_cls: Any = load_response_schema(k.FIND_COORDINATOR, version)
    fields = {
        "error_code": ErrorCode.coordinator_not_available,
        "error_message": NO_COORDINATOR,
        "node_id": -1,
        "host": "",
        "port": -1,
    }
    if version >= 4:
        coordinator_cls = nested(response_cls, "Coordinator")
        coordinators = tuple(
            make(coordinator_cls, key=key, **fields) for key in body.coordinator_keys
        )
        return make(response_cls, throttle_time=NO_THROTTLE, coordinators=coordinators)
    return make(response_cls, throttle_time=NO_THROTTLE, **fields)
