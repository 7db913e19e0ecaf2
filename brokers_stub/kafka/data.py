"""The broker's Kafka data APIs: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
InitProducerId, and FindCoordinator's refusal (docs/kafka.md has the versions and
every difference from Kafka).

- Produce (acks 0, 1, all): each partition's records are one batch of magic 2,
  validated (`protocol.kafka.records.validate_produce_records`: CRC-32C, lengths, offset
  deltas; compressed batches unopened) and appended as they came through the data
  plane (`DataPlane.append_batch`: stamped with the base offset and leader epoch, the
  idempotent producer's sequence checked, acks=all answered once committed under the
  MinISR and ELR rules). acks=0 gets no answer, as in Kafka.
- Fetch: long-polled (`max_wait`, `min_bytes`), up to the high watermark, from the
  partition's leader only; records as stored, and the offsets written by metactl's own
  producer (which sends no bytes) as batches of null records. A fetch that names its
  last fetched epoch (v12+) is told where the logs diverge (`diverging_epoch`).
- ListOffsets: earliest (0: no retention), latest (the high watermark), max timestamp
  (v7), and by timestamp.
- OffsetForLeaderEpoch: the end offset of an epoch, as Kafka's leader-epoch cache
  answers it (`end_offset_for_epoch`): what a consumer past an unclean recovery uses to
  see the truncation.
- InitProducerId: a new producer id for an idempotent producer (no transactions).
- FindCoordinator: COORDINATOR_NOT_AVAILABLE with a message saying why: there are no
  consumer groups (or transactions). A consumer with a manual assignment needs none.

Who may: with TLS, `admin` produces and initialises producer ids, `admin` and `viewer`
read; a refusal is TOPIC_AUTHORIZATION_FAILED per partition (CLUSTER_AUTHORIZATION_FAILED
for InitProducerId), counted and logged as the broker's own refusals. Without TLS
(`--insecure`) there is no principal and no authorization.

It sees the replica manager only through `KafkaHost`; it must not frame bytes
(`protocol.kafka`) or change a replica itself (the data plane appends).
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from brokers_stub.leader import LeaderState
from brokers_stub.produce import DataPlane
from brokers_stub.replica_log import NO_EPOCH, Chunk, ReplicaLog, epoch_at
from metactl.errors import (
    ClusterAuthorizationFailedError,
    FencedLeaderEpochError,
    InvalidRequestError,
    MetactlError,
    OffsetOutOfRangeError,
    TopicAuthorizationFailedError,
    UnknownLeaderEpochError,
)
from metadata_image.image import ClusterImage
from metadata_image.state import TopicPartition
from protocol.admission import Peer
from protocol.kafka import framing as k
from protocol.kafka.errors import kafka_code
from protocol.kafka.framing import Request, Served
from protocol.kafka.metadata import make, nested
from protocol.kafka.records import (
    null_records_batch,
    record_at_timestamp,
    validate_produce_records,
)
from protocol.tls import ADMIN, VIEWER

# The data APIs and their versions (docs/kafka.md says why these).
DATA_SERVED: Final[Served] = {
    k.PRODUCE: (3, 9),
    k.FETCH: (4, 13),
    k.LIST_OFFSETS: (1, 7),
    k.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    k.INIT_PRODUCER_ID: (0, 4),
    k.FIND_COORDINATOR: (0, 4),
}

NO_THROTTLE: Final = datetime.timedelta(0)
EARLIEST: Final = -2
LATEST: Final = -1
MAX_TIMESTAMP: Final = -3
NO_TIMESTAMP: Final = -1
UNKNOWN_OFFSET: Final = -1
NULL_BATCH_RECORDS: Final = 4096  # records per batch of null records (native offsets)
PRODUCER_IDS_PER_EPOCH: Final = 1 << 20
MESSAGE_MAX_BYTES: Final = 1_048_588  # Kafka's message.max.bytes default: a batch's limit
NO_COORDINATOR: Final = (
    "metactl has no group or transaction coordinator: consumer groups and transactions "
    "are not served; assign partitions and keep offsets yourself (docs/kafka.md)"
)


class KafkaHost(Protocol):
    """What the data APIs need of the broker's replica manager."""

    data: DataPlane
    logs: dict[TopicPartition, ReplicaLog]

    @property
    def image(self) -> ClusterImage | None: ...

    def read(
        self, tp: TopicPartition, from_offset: int, end_offset: int, max_bytes: int
    ) -> list[Chunk]:
        """The replica's batches and no-bytes ranges from `from_offset` (files.read)."""
        ...


Refused = Callable[[str, str, MetactlError], None]  # principal, operation, error


@dataclass
class _Read:
    """One partition's part of a Fetch answer."""

    error: ErrorCode = ErrorCode.none
    high_watermark: int = -1
    records: bytes = b""
    diverging: tuple[int, int] | None = None
    leader: LeaderState | None = None  # its leadership, to wait on (long poll)


class KafkaData:
    def __init__(
        self,
        host: KafkaHost,
        *,
        broker_epoch: Callable[[], int | None],
        tls: bool,
        refused: Refused,
        max_batch_bytes: int,
    ) -> None:
        self.host = host
        self.broker_epoch = broker_epoch
        self.tls = tls
        self.refused = refused
        self.max_batch_bytes = max_batch_bytes
        self.served = DATA_SERVED
        self._producer_ids = 0  # issued in the current broker epoch
        self._producer_ids_epoch: int | None = None

    async def answer(self, request: Request, peer: Peer) -> Any:
        match request.api_key:
            case k.PRODUCE:
                return await self.produce(request, peer)
            case k.FETCH:
                return await self.fetch(request, peer)
            case k.LIST_OFFSETS:
                return self.list_offsets(request, peer)
            case k.OFFSET_FOR_LEADER_EPOCH:
                return self.offset_for_leader_epoch(request, peer)
            case k.INIT_PRODUCER_ID:
                return self.init_producer_id(request, peer)
            case k.FIND_COORDINATOR:
                return find_coordinator(request)
        raise AssertionError(f"api_key {request.api_key} is not a data API")

    # --- authorization --------------------------------------------------------------

    def _refusal(self, peer: Peer, operation: str, allowed: tuple[str, ...]) -> ErrorCode | None:
        """None if `peer` may perform `operation`; else the refusal's code (counted and
        logged once per principal and period, as the broker's own refusals)."""
        if not self.tls or peer.principal in allowed:
            return None
        who = "no principal" if peer.principal is None else f"principal {peer.principal!r}"
        cls = (
            ClusterAuthorizationFailedError
            if operation == "init_producer_id"
            else TopicAuthorizationFailedError
        )
        error = cls(f"{who} may not {operation} over Kafka: needs {' or '.join(allowed)}")
        self.refused(peer.principal or "-", f"kafka_{operation}", error)
        return kafka_code(error)

    # --- Produce --------------------------------------------------------------------

    async def produce(self, request: Request, peer: Peer) -> Any:
        body, version = request.body, request.api_version
        acks = int(body.acks)
        denied = self._refusal(peer, "produce", (ADMIN,))
        timeout_ms = int(body.timeout.total_seconds() * 1000)
        jobs: list[tuple[str, list[tuple[int, asyncio.Task[int] | None, ErrorCode, str]]]] = []
        for topic in body.topic_data:
            parts = []
            for pd in topic.partition_data:
                index = int(pd.index)
                error, message = ErrorCode.none, ""
                task: asyncio.Task[int] | None = None
                if denied is not None:
                    error = denied
                elif acks not in (0, 1, -1):
                    error, message = ErrorCode.invalid_required_acks, f"acks {acks}"
                elif body.transactional_id is not None:
                    error, message = ErrorCode.transactional_id_authorization_failed, NO_COORDINATOR
                else:
                    try:
                        validate_produce_records(
                            bytes(pd.records or b""),
                            max_batch_bytes=self.max_batch_bytes,
                            produce_version=version,
                        )
                    except MetactlError as exc:
                        error, message = kafka_code(exc), exc.message
                    else:
                        task = asyncio.ensure_future(
                            self.host.data.append_batch(
                                topic.name,
                                index,
                                bytes(pd.records or b""),
                                acks=acks,
                                timeout_ms=timeout_ms,
                            )
                        )
                parts.append((index, task, error, message))
            jobs.append((topic.name, parts))
        # Partitions are appended in the request's order (each append_batch runs up to its
        # first wait before the next starts), then awaited together.
        response_cls: Any = load_response_schema(k.PRODUCE, version)
        topic_cls = nested(response_cls, "TopicProduceResponse")
        partition_cls = nested(response_cls, "PartitionProduceResponse")
        topics = []
        for name, parts in jobs:
            answers = []
            for index, task, refusal, why in parts:
                base, error, message = UNKNOWN_OFFSET, refusal, why
                if task is not None:
                    try:
                        base = await task
                    except MetactlError as exc:
                        error, message = kafka_code(exc), exc.message
                answers.append(
                    make(
                        partition_cls,
                        index=index,
                        error_code=error,
                        base_offset=base,
                        log_append_time=None,
                        log_start_offset=0 if error == ErrorCode.none else UNKNOWN_OFFSET,
                        record_errors=(),
                        error_message=message or None,
                    )
                )
            topics.append(make(topic_cls, name=name, partition_responses=tuple(answers)))
        if acks == 0:
            return None  # Kafka never answers acks=0
        return make(response_cls, responses=tuple(topics), throttle_time=NO_THROTTLE)

    # --- Fetch ----------------------------------------------------------------------

    async def fetch(self, request: Request, peer: Peer) -> Any:
        body, version = request.body, request.api_version
        image = self.host.image
        names = _topic_names_by_id(image) if version >= 13 else {}
        denied = self._refusal(peer, "fetch", (ADMIN, VIEWER))
        if getattr(body, "replica_id", -1) >= 0 and denied is None:
            denied = ErrorCode.not_leader_or_follower  # a broker's fetch: not on this listener
        max_wait_s = max(0.0, body.max_wait.total_seconds())
        min_bytes = max(0, int(body.min_bytes))
        max_bytes = int(getattr(body, "max_bytes", 0x7FFFFFFF))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_s
        while True:
            reads = self._read_all(body, version, names, denied, max_bytes)
            total = sum(len(r.records) for _, _, r in reads)
            waiting = [r.leader for _, _, r in reads if r.leader is not None]
            errors = any(r.error != ErrorCode.none for _, _, r in reads)
            remaining = deadline - loop.time()
            if total >= min_bytes or errors or not waiting or remaining <= 0:
                break
            await _any_moved(waiting, remaining)
        return self._fetch_response(version, reads)

    def _read_all(
        self,
        body: Any,
        version: int,
        names: dict[uuid.UUID, str],
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
                    read = self._read(name, part, version, budget, first=budget == max_bytes)
                    budget -= len(read.records)
                out.append((topic, part, read))
        return out

    def _read(self, topic: str, part: Any, version: int, budget: int, *, first: bool) -> _Read:
        try:
            p, st, log = self.host.data.led(topic, int(part.partition))
            _check_current_epoch(getattr(part, "current_leader_epoch", -1), p.leader_epoch)
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
        records = self._records(p.tp, log, offset, hw, max(1, limit))
        return _Read(high_watermark=hw, records=records, leader=st)

    def _records(
        self, tp: TopicPartition, log: ReplicaLog, offset: int, end: int, limit: int
    ) -> bytes:
        """The stored batches from `offset` below `end` within `limit` bytes (at least one
        batch), the offsets without bytes as batches of null records."""
        out = bytearray()
        for base, count, data in self.host.read(tp, offset, end, limit):
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

    def _fetch_response(self, version: int, reads: list[tuple[Any, Any, _Read]]) -> Any:
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

    # --- ListOffsets ----------------------------------------------------------------

    def list_offsets(self, request: Request, peer: Peer) -> Any:
        body, version = request.body, request.api_version
        denied = self._refusal(peer, "list_offsets", (ADMIN, VIEWER))
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
                        ts, offset, epoch = self._offset_for(topic.name, index, part)
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

    def _offset_for(self, topic: str, partition: int, part: Any) -> tuple[int, int, int]:
        """(timestamp, offset, leader epoch) of a ListOffsets partition."""
        p, _, log = self.host.data.led(topic, partition)
        _check_current_epoch(getattr(part, "current_leader_epoch", -1), p.leader_epoch)
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
            data = self._batch_bytes(p.tp, h.base_offset)
            found = record_at_timestamp(data, target) if data is not None else None
            if found is not None:
                ts, offset = found
                return ts, offset, _epoch_or_none(log, offset)
        return NO_TIMESTAMP, UNKNOWN_OFFSET, NO_EPOCH

    def _batch_bytes(self, tp: TopicPartition, base_offset: int) -> bytes | None:
        for chunk in self.host.read(tp, base_offset, base_offset + 1, 1):
            if chunk.base_offset == base_offset:
                return chunk.data
        return None

    # --- OffsetForLeaderEpoch -------------------------------------------------------

    def offset_for_leader_epoch(self, request: Request, peer: Peer) -> Any:
        body, version = request.body, request.api_version
        denied = self._refusal(peer, "offset_for_leader_epoch", (ADMIN, VIEWER))
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
                        p, _, log = self.host.data.led(topic.topic, index)
                        _check_current_epoch(part.current_leader_epoch, p.leader_epoch)
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

    # --- InitProducerId -------------------------------------------------------------

    def init_producer_id(self, request: Request, peer: Peer) -> Any:
        """A new producer id, epoch 0 (Kafka's answer to an idempotent producer, which
        also asks again, with its old id, to bump its epoch after an error: it gets a new
        id, as from Kafka). Ids are unique across the cluster and over time without the
        controller: the broker's epoch (the offset of its registration, never reused)
        times 2**20, plus a counter of this registration's ids."""
        body, version = request.body, request.api_version
        response_cls: Any = load_response_schema(k.INIT_PRODUCER_ID, version)
        error = self._refusal(peer, "init_producer_id", (ADMIN,))
        producer_id = -1
        if error is None and body.transactional_id is not None:
            error = ErrorCode.coordinator_not_available  # no transactions (docs/kafka.md)
        if error is None:
            epoch = self.broker_epoch()
            if epoch != self._producer_ids_epoch:
                self._producer_ids_epoch, self._producer_ids = epoch, 0
            if epoch is None or self._producer_ids >= PRODUCER_IDS_PER_EPOCH:
                # Not registered yet, or this registration's ids are spent: another broker
                # (or this one, registered again) issues them; the client retries.
                error = ErrorCode.coordinator_not_available
            else:
                producer_id = epoch * PRODUCER_IDS_PER_EPOCH + self._producer_ids
                self._producer_ids += 1
        return make(
            response_cls,
            throttle_time=NO_THROTTLE,
            error_code=error or ErrorCode.none,
            producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else -1,
        )


# --- pure helpers -------------------------------------------------------------------------


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


def end_offset_for_epoch(log: ReplicaLog, requested: int) -> tuple[int, int]:
    """Kafka's LeaderEpochFileCache.endOffsetFor: (the largest epoch <= `requested`, the
    offset where it ends); the newest epoch ends at the log end. (-1, -1) for -1 or an
    epoch newer than any known; an epoch older than every one known ends where the first
    known starts (Kafka's answer: nothing of it is left)."""
    history, leo = log.leader_epochs, log.log_end_offset
    if requested < 0 or not history or requested > history[-1][0]:
        return NO_EPOCH, UNKNOWN_OFFSET
    if requested == history[-1][0]:
        return requested, leo
    for i in range(len(history) - 1, -1, -1):
        epoch, _ = history[i]
        if epoch <= requested:
            return epoch, history[i + 1][1]
    return requested, history[0][1]


def _check_current_epoch(current: int, leader_epoch: int) -> None:
    """A client's `current_leader_epoch` (-1: none) against the partition's."""
    current = int(current)
    if current < 0:
        return
    if current < leader_epoch:
        raise FencedLeaderEpochError(
            f"the client is at leader epoch {current}, the partition at {leader_epoch}"
        )
    if current > leader_epoch:
        raise UnknownLeaderEpochError(
            f"the client is at leader epoch {current}, this broker knows {leader_epoch}"
        )


def _epoch_or_none(log: ReplicaLog, offset: int) -> int:
    epoch = epoch_at(log.leader_epochs, offset)
    return NO_EPOCH if epoch is None or offset >= log.log_end_offset else epoch


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
