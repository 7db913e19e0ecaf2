"""The wire protocol: length-prefixed frames of versioned msgspec messages over TCP.

A frame is a 4-byte big-endian length followed by that many bytes of MessagePack: a
`Frame` with a correlation id and one tagged message. Requests and responses share the
union so that one decoder serves both ends (the controller also *sends* GetReplicaLogInfo
to brokers). Every error travels as an `ErrorResponse` with a stable code.

This module owns framing and message shapes only; it has no sockets of its own beyond
the two stream helpers, and no rules. See docs/protocol.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Final, Literal

import msgspec

from metactl.errors import InvalidRequestError, MetactlError
from metadata_log.records import MetadataRecord
from protocol.requests import IsrMember

DEFAULT_MAX_FRAME_BYTES: Final = 8 * 1024 * 1024
_LEN: Final = struct.Struct(">I")


class FrameTooLargeError(InvalidRequestError):
    pass


class _Msg(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    v: int = 1


# --- broker -> controller ---------------------------------------------------------------


class BrokerRegistrationRequest(_Msg, tag="BrokerRegistration", frozen=True):
    broker_id: int
    incarnation_id: str
    previous_broker_epoch: int | None = None
    rack: str | None = None
    endpoint: str = ""  # host:port where the broker answers GetReplicaLogInfo


class BrokerRegistrationResponse(_Msg, tag="BrokerRegistrationResponse", frozen=True):
    broker_epoch: int
    clean: bool


class BrokerHeartbeatRequest(_Msg, tag="BrokerHeartbeat", frozen=True):
    broker_id: int
    broker_epoch: int
    metadata_offset: int  # the broker has applied every record below this offset
    want_fence: bool = False
    want_shutdown: bool = False


class BrokerHeartbeatResponse(_Msg, tag="BrokerHeartbeatResponse", frozen=True):
    is_fenced: bool
    in_controlled_shutdown: bool
    should_shut_down: bool  # controlled shutdown done: the broker leads nothing


class AlterPartitionRequest(_Msg, tag="AlterPartition", frozen=True):
    topic: str
    partition: int
    leader: int
    broker_epoch: int
    partition_epoch: int
    isr: list[IsrMember]
    leader_epoch: int | None = None
    recovered: bool = True


class PartitionState(_Msg, tag="PartitionState", frozen=True):
    topic: str
    partition: int
    replicas: list[int]
    leader: int  # -1: none
    leader_epoch: int
    partition_epoch: int
    isr: list[int]
    elr: list[int] = []
    last_known_elr: list[int] = []
    recovering: bool = False
    recovery_pending: list[int] | None = None
    min_isr: int = 1


class FetchMetadataRequest(_Msg, tag="FetchMetadata", frozen=True):
    from_offset: int
    max_records: int = 10_000
    max_wait_ms: int = 500


class FetchedRecord(msgspec.Struct, frozen=True, array_like=True):
    offset: int
    timestamp_ms: int
    record: MetadataRecord


class MetadataSnapshot(msgspec.Struct, frozen=True):
    offset: int  # the snapshot holds the state of every record below this offset
    records: list[MetadataRecord]


class FetchMetadataResponse(_Msg, tag="FetchMetadataResponse", frozen=True):
    records: list[FetchedRecord]
    end_offset: int  # committed end offset at the time of the answer
    snapshot: MetadataSnapshot | None = None


# --- operator -> controller -------------------------------------------------------------


class TopicSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    partitions: int | None = None
    replication_factor: int | None = None
    assignments: list[list[int]] | None = None
    min_insync_replicas: int | None = None
    unclean_recovery_strategy: str | None = None


class CreateTopicsRequest(_Msg, tag="CreateTopics", frozen=True):
    topics: list[TopicSpec]


class CreateTopicResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    error_code: str | None = None
    message: str = ""
    topic_id: str | None = None
    assignments: list[list[int]] | None = None


class CreateTopicsResponse(_Msg, tag="CreateTopicsResponse", frozen=True):
    results: list[CreateTopicResult]


class ElectLeadersRequest(_Msg, tag="ElectLeaders", frozen=True):
    topic: str
    partition: int
    election_type: Literal["preferred", "unclean"]
    replica: int | None = None


class DescribeClusterRequest(_Msg, tag="DescribeCluster", frozen=True):
    topic: str | None = None


class BrokerDescription(msgspec.Struct, frozen=True, kw_only=True):
    broker_id: int
    epoch: int
    fenced: bool
    controlled_shutdown: bool
    last_registration_clean: bool
    last_heartbeat_age_ms: int | None
    endpoint: str
    rack: str | None


class DescribeClusterResponse(_Msg, tag="DescribeClusterResponse", frozen=True):
    brokers: list[BrokerDescription]
    partitions: list[PartitionState]
    end_offset: int
    committed_offset: int


# --- controller -> broker ---------------------------------------------------------------


class ReplicaRef(msgspec.Struct, frozen=True, array_like=True):
    topic: str
    partition: int


class GetReplicaLogInfoRequest(_Msg, tag="GetReplicaLogInfo", frozen=True):
    broker_id: int
    broker_epoch: int  # the epoch the controller knows; a broker at another epoch refuses
    partitions: list[ReplicaRef]


class ReplicaLogInfoEntry(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    topic: str
    partition: int
    last_leader_epoch: int = -1
    log_end_offset: int = 0
    error_code: str | None = None


class GetReplicaLogInfoResponse(_Msg, tag="GetReplicaLogInfoResponse", frozen=True):
    broker_id: int
    broker_epoch: int
    partitions: list[ReplicaLogInfoEntry]


# --- broker -> broker (simulated replication) --------------------------------------------


class ReplicaFetchRequest(_Msg, tag="ReplicaFetch", frozen=True):
    topic: str
    partition: int
    follower_id: int
    follower_broker_epoch: int
    fetch_offset: int  # the follower's log end offset
    last_fetched_epoch: int  # the leader epoch of the follower's last record (-1: empty log)


class ReplicaFetchResponse(_Msg, tag="ReplicaFetchResponse", frozen=True):
    leader_epoch: int
    log_end_offset: int
    high_watermark: int
    # Where the follower must truncate to before copying (its log diverged), if anywhere.
    truncate_to: int | None = None
    leader_epochs: list[tuple[int, int]] = []  # (epoch, start offset), oldest first


# --- common -------------------------------------------------------------------------------


class ErrorResponse(_Msg, tag="Error", frozen=True):
    code: str
    message: str = ""
    retriable: bool = False


Message = (
    BrokerRegistrationRequest
    | BrokerRegistrationResponse
    | BrokerHeartbeatRequest
    | BrokerHeartbeatResponse
    | AlterPartitionRequest
    | PartitionState
    | FetchMetadataRequest
    | FetchMetadataResponse
    | CreateTopicsRequest
    | CreateTopicsResponse
    | ElectLeadersRequest
    | DescribeClusterRequest
    | DescribeClusterResponse
    | GetReplicaLogInfoRequest
    | GetReplicaLogInfoResponse
    | ReplicaFetchRequest
    | ReplicaFetchResponse
    | ErrorResponse
)


class Frame(msgspec.Struct, frozen=True, array_like=True):
    correlation_id: int
    body: Message


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(Frame)


def encode_frame(correlation_id: int, body: Message) -> bytes:
    payload = _encoder.encode(Frame(correlation_id, body))
    return _LEN.pack(len(payload)) + payload


def decode_frame(payload: bytes) -> Frame:
    try:
        frame: Frame = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise InvalidRequestError(f"undecodable frame: {exc}") from None
    return frame


def error_response(exc: MetactlError) -> ErrorResponse:
    return ErrorResponse(code=exc.code, message=exc.message, retriable=exc.retriable)


async def read_frame(
    reader: asyncio.StreamReader, max_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes:
    """The next frame's payload. Raises IncompleteReadError at EOF (clean or truncated) and
    FrameTooLargeError for a length over `max_bytes` (the stream is then unusable)."""
    header = await reader.readexactly(_LEN.size)
    (length,) = _LEN.unpack(header)
    if length > max_bytes:
        raise FrameTooLargeError(f"frame of {length} bytes exceeds the {max_bytes}-byte limit")
    return await reader.readexactly(length)


class Connection:
    """A client connection: one request in flight at a time, answered in order."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        max_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        self.reader, self.writer, self.max_bytes = reader, writer, max_bytes
        self._next_id = 1
        self._lock = asyncio.Lock()

    @classmethod
    async def open(
        cls, host: str, port: int, max_bytes: int = DEFAULT_MAX_FRAME_BYTES
    ) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, max_bytes)

    async def request(self, body: Message) -> Message:
        """Send one request; return the response body, raising coded errors as MetactlError."""
        from metactl.errors import error_for_code

        async with self._lock:
            cid = self._next_id
            self._next_id += 1
            self.writer.write(encode_frame(cid, body))
            await self.writer.drain()
            frame = decode_frame(await read_frame(self.reader, self.max_bytes))
        if frame.correlation_id != cid:
            raise InvalidRequestError(
                f"response correlation id {frame.correlation_id} does not match {cid}"
            )
        if isinstance(frame.body, ErrorResponse):
            raise error_for_code(frame.body.code, frame.body.message)
        return frame.body

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def request_once(address: str, body: Message, timeout_s: float = 30.0) -> Message:
    """One request over a fresh connection, within `timeout_s` in all.

    asyncio.timeout rather than wait_for: on Python 3.11 wait_for can drop a result that
    arrives as the timeout fires, which would leak the just-opened connection.
    """
    host, port = parse_address(address)
    async with asyncio.timeout(timeout_s):
        conn = await Connection.open(host, port)
        try:
            return await conn.request(body)
        finally:
            await conn.close()


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise InvalidRequestError(f"not a HOST:PORT address: {address!r}")
    return host or "127.0.0.1", int(port)
