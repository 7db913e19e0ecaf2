"""The broker's Kafka data APIs: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch,
InitProducerId, and FindCoordinator's refusal (docs/kafka.md has the versions and
every difference from Kafka). `KafkaData` serves them: it dispatches each request,
authorizes it, and answers Produce itself; Fetch is `fetch`'s, the others `offsets`'.

- Produce (acks 0, 1, all): each partition's records are one batch of magic 2,
  validated (`protocol.kafka.records.validate_produce_records`: CRC-32C, lengths, offset
  deltas; compressed batches unopened) and appended as they came through the data
  plane (`DataPlane.append_batch`: stamped with the base offset and leader epoch, the
  idempotent producer's sequence checked, acks=all answered once committed under the
  MinISR and ELR rules). acks=0 gets no answer, as in Kafka.

Who may: with TLS, `admin` produces and initialises producer ids, `admin` and `viewer`
read; a refusal is TOPIC_AUTHORIZATION_FAILED per partition (CLUSTER_AUTHORIZATION_FAILED
for InitProducerId), counted and logged as the broker's own refusals. Without TLS
(`--insecure`) there is no principal and no authorization.

It sees the replica manager only through `KafkaHost`; it must not frame bytes
(`protocol.kafka`) or change a replica itself (the data plane appends).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from brokers_stub.kafka.fetch import fetch
from brokers_stub.kafka.host import UNKNOWN_OFFSET, KafkaHost
from brokers_stub.kafka.offsets import (
    NO_COORDINATOR,
    ProducerIds,
    find_coordinator,
    list_offsets,
    offset_for_leader_epoch,
)
from metactl.errors import (
    ClusterAuthorizationFailedError,
    MetactlError,
    TopicAuthorizationFailedError,
)
from protocol.admission import Peer
from protocol.kafka import framing as k
from protocol.kafka.errors import kafka_code
from protocol.kafka.framing import Request, Served
from protocol.kafka.metadata import NO_THROTTLE, make, nested
from protocol.kafka.records import validate_produce_records
from protocol.tls import ADMIN, VIEWER

__all__ = ["DATA_SERVED", "MESSAGE_MAX_BYTES", "KafkaData", "KafkaHost", "Refused"]

# The data APIs and their versions (docs/kafka.md says why these).
DATA_SERVED: Final[Served] = {
    k.PRODUCE: (3, 9),
    k.FETCH: (4, 13),
    k.LIST_OFFSETS: (1, 7),
    k.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    k.INIT_PRODUCER_ID: (0, 4),
    k.FIND_COORDINATOR: (0, 4),
}

READERS: Final = (ADMIN, VIEWER)  # who may read (Fetch, ListOffsets, OffsetForLeaderEpoch)
MESSAGE_MAX_BYTES: Final = 1_048_588  # Kafka's message.max.bytes default: a batch's limit

Refused = Callable[[str, str, MetactlError], None]  # principal, operation, error


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
        self.tls = tls
        self.refused = refused
        self.max_batch_bytes = max_batch_bytes
        self.served = DATA_SERVED
        self.producer_ids = ProducerIds(broker_epoch)

    async def answer(self, request: Request, peer: Peer) -> Any:
        match request.api_key:
            case k.PRODUCE:
                return await self.produce(request, peer)
            case k.FETCH:
                return await fetch(self.host, request, self._refusal(peer, "fetch", READERS))
            case k.LIST_OFFSETS:
                denied = self._refusal(peer, "list_offsets", READERS)
                return list_offsets(self.host, request, denied)
            case k.OFFSET_FOR_LEADER_EPOCH:
                denied = self._refusal(peer, "offset_for_leader_epoch", READERS)
                return offset_for_leader_epoch(self.host, request, denied)
            case k.INIT_PRODUCER_ID:
                denied = self._refusal(peer, "init_producer_id", (ADMIN,))
                return self.producer_ids.answer(request, denied)
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
                    records = bytes(pd.records or b"")
                    try:
                        validate_produce_records(
                            records,
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
                                records,
                                acks=acks,
                                timeout_ms=timeout_ms,
                            )
                        )
                parts.append((index, task, error, message))
            jobs.append((topic.name, parts))
        # Partitions are appended in the request's order (each append_batch runs up to its
        # first wait before the next starts), then awaited together. Every outcome is
        # collected, and a Produce cancelled meanwhile (its connection gone, the broker
        # stopping) cancels its waits: no task is left with an error nobody reads.
        tasks = [t for _, parts in jobs for _, t, _, _ in parts if t is not None]
        try:
            outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            for t in tasks:
                t.cancel()
            raise
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, MetactlError):
                raise outcome  # a bug: the listener logs it and closes the connection
        response_cls: Any = load_response_schema(k.PRODUCE, version)
        topic_cls = nested(response_cls, "TopicProduceResponse")
        partition_cls = nested(response_cls, "PartitionProduceResponse")
        topics = []
        for name, parts in jobs:
            answers = []
            for index, task, refusal, why in parts:
                base, error, message = UNKNOWN_OFFSET, refusal, why
                if task is not None:
                    failure = task.exception()
                    if isinstance(failure, MetactlError):
                        error, message = kafka_code(failure), failure.message
                    else:
                        base = task.result()
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
