"""Kafka's Fetch on the broker: a consumer's (or tool's) read of partitions it names,
from each partition's leader only, up to the high watermark, long-polled (`max_wait`,
`min_bytes`: it waits on the leaderships' logs and high watermarks to move). Records are
sent as stored, and the offsets written by metactl's own producer (which sends no bytes)
as batches of null records (one leader epoch each). A fetch that names its last fetched
epoch (v12+) is told where the logs diverge (`diverging_epoch`). There are no fetch
sessions: every fetch is a full one. A broker's fetch (`replica_id` >= 0) is not served
on this listener.

It reads through `KafkaHost` only; it must not authorize (`data` passes the refusal in),
frame bytes (`protocol.kafka`) or change a replica.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from dataclasses import dataclass
from typing import Any, Final

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from brokers_stub.kafka.host import (
    NO_TIMESTAMP,
    KafkaHost,
    check_current_epoch,
    end_offset_for_epoch,
)
from brokers_stub.leader import LeaderState
from brokers_stub.replica_log import NO_EPOCH, ReplicaLog, epoch_at
from metactl.errors import MetactlError, OffsetOutOfRangeError
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from protocol.kafka import framing as k
from protocol.kafka.errors import kafka_code
from protocol.kafka.framing import Request
from protocol.kafka.metadata import NO_THROTTLE, make, nested
from protocol.kafka.records import null_records_batch

NULL_BATCH_RECORDS: Final = 4096  # records per batch of null records (native offsets)


@dataclass
class _Read:
    """One partition's part of a Fetch answer."""

    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    records: bytes = b""
    diverging: tuple[int, int] | None = None
    leader: LeaderState | None = None  # its leadership, to wait on (long poll)


async def fetch(host: KafkaHost, request: Request, denied: ErrorCode | None) -> Any:
    """Fetch's answer (`denied`: the principal's refusal, or None): long-polled until
    `min_bytes` are read, a partition fails, or `max_wait` passes."""
    body, version = request.body, request.api_version
    image = host.image
    names = _topic_names_by_id(image) if version >= 13 else {}
    if getattr(body, "replica_id", -1) >= 0 and denied is None:
        denied = ErrorCode.not_leader_or_follower  # a broker's fetch: not on this listener
    max_wait_s = max(0.0, body.max_wait.total_seconds())
    min_bytes = max(0, int(body.min_bytes))
    max_bytes = int(getattr(body, "max_bytes", 0x7FFFFFFF))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_s
    while True:
        reads = _read_all(host, body, version, names, denied=denied, max_bytes=max_bytes)
        total = sum(len(r.records) for _, _, r in reads)
        waiting = [r.leader for _, _, r in reads if r.leader is not None]
        errors = any(r.error != ErrorCode.none for _, _, r in reads)
        remaining = deadline - loop.time()
        if total >= min_bytes or errors or not waiting or remaining <= 0:
            break
        await _any_moved(waiting, remaining)
    return _fetch_response(version, reads)


def _read_all(
    host: KafkaHost,
    body: Any,
    version: int,
    names: dict[uuid.UUID, str],
    *,
    denied: ErrorCode | None,
    max_bytes: int,
) -> list[tuple[Any, Any, _Read]]:
    out: list[tuple[Any, Any, _Read]] = []
    budget = max_bytes
    for topic in body.topics:
        name = names.get(topic.topic_id) if version >= 13 else topic.topic
        for part in topic.partitions:
            if denied is not None:
                read = _Read(error=denied)
            elif name is None:
                read = _Read(error=ErrorCode.unknown_topic_id)
            else:
                read = _read(host, name, part, version, budget, first=budget == max_bytes)
                budget -= len(read.records)
            out.append((topic, part, read))
    return out


def _read(
    host: KafkaHost, topic: str, part: Any, version: int, budget: int, *, first: bool
) -> _Read:
    try:
        p, st, log = host.data.led(topic, int(part.partition))
        check_current_epoch(getattr(part, "current_leader_epoch", -1), p.leader_epoch)
    except MetactlError as exc:
        return _Read(error=kafka_code(exc))
    hw = log.high_watermark
    offset = int(part.fetch_offset)
    last_fetched = int(getattr(part, "last_fetched_epoch", -1))
    if version >= 12 and last_fetched >= 0:
        epoch, end = end_offset_for_epoch(log, last_fetched)
        if epoch != last_fetched or end < offset:
            return _Read(high_watermark=hw, diverging=(epoch, end), leader=None)
    if offset < 0 or offset > log.log_end_offset:
        out_of_range = OffsetOutOfRangeError(
            f"{log.name}: offset {offset} is outside 0..{log.log_end_offset}"
        )
        return _Read(error=kafka_code(out_of_range), high_watermark=hw)
    limit = min(int(part.partition_max_bytes), budget)
    if offset >= hw or (limit <= 0 and not first):
        return _Read(high_watermark=hw, leader=st)
    records = _records(host, p.tp, log, offset, hw, limit=max(1, limit))
    return _Read(high_watermark=hw, records=records, leader=st)


def _records(
    host: KafkaHost, tp: TopicPartition, log: ReplicaLog, offset: int, end: int, *, limit: int
) -> bytes:
    """The stored batches from `offset` below `end` within `limit` bytes (at least one
    batch), the offsets without bytes as batches of null records."""
    out = bytearray()
    for base, count, data in host.read(tp, offset, end, limit):
        if out and len(out) >= limit:
            break
        if data is not None:
            out += data
            continue
        for b, n, epoch in _null_spans(log, base, count):
            out += null_records_batch(b, n, epoch, NO_TIMESTAMP)
            if len(out) >= limit:
                break
    return bytes(out)


def _fetch_response(version: int, reads: list[tuple[Any, Any, _Read]]) -> Any:
    response_cls: Any = load_response_schema(k.FETCH, version)
    topic_cls = nested(response_cls, "FetchableTopicResponse")
    partition_cls = nested(response_cls, "PartitionData")
    extra: dict[str, Any] = {}
    if version >= 12:
        epoch_cls = nested(response_cls, "EpochEndOffset")
        leader_cls = nested(response_cls, "LeaderIdAndEpoch")
        snapshot_cls = nested(response_cls, "SnapshotId")
        extra = {
            "current_leader": leader_cls(leader_id=-1, leader_epoch=-1),
            "snapshot_id": snapshot_cls(end_offset=-1, epoch=-1),
        }
    topics: list[Any] = []
    current: Any = None
    parts: list[Any] = []
    for topic, part, read in reads:
        if topic is not current:
            if current is not None:
                topics.append(_fetch_topic(topic_cls, current, parts))
            current, parts = topic, []
        fields = dict(extra)
        if version >= 12:
            epoch, end = read.diverging or (-1, -1)
            fields["diverging_epoch"] = epoch_cls(epoch=epoch, end_offset=end)
        parts.append(
            make(
                partition_cls,
                partition_index=int(part.partition),
                error_code=read.error,
                high_watermark=read.high_watermark,
                last_stable_offset=read.high_watermark,
                log_start_offset=0 if read.error == ErrorCode.none else -1,
                aborted_transactions=(),
                preferred_read_replica=-1,
                records=read.records,
                **fields,
            )
        )
    if current is not None:
        topics.append(_fetch_topic(topic_cls, current, parts))
    return make(
        response_cls,
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=0,  # no fetch sessions: every fetch is a full one (Kafka's answer)
        responses=tuple(topics),
    )


# --- pure helpers ----------------------------------------------------------------------


def _null_spans(log: ReplicaLog, base: int, count: int) -> list[tuple[int, int, int]]:
    """A range of offsets without bytes as (base, count, leader epoch) spans: one epoch
    each (a batch has one), at most NULL_BATCH_RECORDS records each."""
    end = base + count
    cuts = sorted({base, end, *(s for _, s in log.leader_epochs if base < s < end)})
    spans = []
    for lo, hi in itertools.pairwise(cuts):
        epoch = epoch_at(log.leader_epochs, lo)
        for b in range(lo, hi, NULL_BATCH_RECORDS):
            spans.append((b, min(NULL_BATCH_RECORDS, hi - b), NO_EPOCH if epoch is None else epoch))
    return spans


def _topic_names_by_id(image: ClusterImage | None) -> dict[uuid.UUID, str]:
    if image is None:
        return {}
    return {uuid.UUID(t.topic_id): name for name, t in image.topics.items()}


def _fetch_topic(topic_cls: Any, topic: Any, parts: list[Any]) -> Any:
    return make(
        topic_cls,
        topic=getattr(topic, "topic", None),
        topic_id=getattr(topic, "topic_id", None),
        partitions=tuple(parts),
    )


async def _any_moved(leaders: list[LeaderState], wait_s: float) -> None:
    """Return when any of the leaderships' logs or high watermarks moves, or after
    `wait_s` seconds."""
    unique = {id(st): st for st in leaders}.values()
    tasks = [asyncio.ensure_future(st.until_moved()) for st in unique]
    try:
        await asyncio.wait(tasks, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
