"""A scripted stand-in for the controller service, speaking the real wire protocol.

Just enough to drive one stub broker through its life: registration (epoch = offset of
the registration record it appends), heartbeats (unfence once the broker reports
metadata past its epoch; controlled shutdown answers should_shut_down at once),
long-polled FetchMetadata over its own record list, and AlterPartition accepted as
asked. Tests script refusals with `registration_errors` / `heartbeat_errors`. It keeps
every request it received, in order, for the assertions.
"""

from __future__ import annotations

import asyncio
import contextlib

from controller.core.partition_handlers import partition_view
from metactl.errors import InvalidRequestError, MetactlError
from metadata_image.image import ClusterImage
from metadata_image.replay import replay
from metadata_log.records import MetadataRecord, RegisterBrokerRecord, UnfenceBrokerRecord
from protocol.codec import decode_frame, encode_frame
from protocol.messages.admin import PartitionState
from protocol.messages.base import error_response
from protocol.messages.broker_controller import (
    AlterPartition,
    AlterPartitionResult,
    AlterPartitions,
    AlterPartitionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    FetchedRecord,
    FetchMetadataRequest,
    FetchMetadataResponse,
    PartitionView,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.unions import Message
from protocol.transport import read_frame


class FakeController:
    def __init__(self) -> None:
        self.records: list[MetadataRecord] = []
        self.requests: list[Message] = []
        self.registration_errors: list[MetactlError] = []
        self.heartbeat_errors: list[MetactlError] = []
        self.appended = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.address = ""
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        host, bound = self.server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{bound}"
        return self.address

    async def stop(self) -> None:
        """Like a SIGKILL: stop listening and drop every connection."""
        if self.server is not None:
            self.server.close()
        for w in list(self._connections):
            w.transport.abort()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await self.server.wait_closed()

    def of(self, kind: type[Message]) -> list[Message]:
        return [r for r in self.requests if isinstance(r, kind)]

    def append(self, *records: MetadataRecord) -> int:
        offset = len(self.records)
        self.records.extend(records)
        self.appended.set()
        self.appended = asyncio.Event()
        return offset

    @property
    def image(self) -> ClusterImage:
        return replay(ClusterImage(), self.records)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                frame = decode_frame(await read_frame(reader))
                self.requests.append(frame.body)
                try:
                    body = await self._answer(frame.body)
                except MetactlError as exc:
                    body = error_response(exc)
                writer.write(encode_frame(frame.correlation_id, body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _answer(self, body: Message) -> Message:
        match body:
            case RegisterBroker():
                if self.registration_errors:
                    raise self.registration_errors.pop(0)
                epoch = len(self.records)
                self.append(
                    RegisterBrokerRecord(
                        broker_id=body.broker_id,
                        incarnation_id=body.incarnation_id,
                        broker_epoch=epoch,
                        endpoint=body.endpoint,
                        previous_epoch=body.previous_epoch,
                        fenced=True,
                    )
                )
                return RegisterBrokerResponse(broker_epoch=epoch, clean=False)
            case BrokerHeartbeatRequest():
                if self.heartbeat_errors:
                    raise self.heartbeat_errors.pop(0)
                b = self.image.broker(body.broker_id)
                assert b is not None
                if b.fenced and not body.want_fence and body.metadata_offset > b.epoch:
                    self.append(UnfenceBrokerRecord(broker_id=b.broker_id, broker_epoch=b.epoch))
                now = self.image.broker(body.broker_id)
                assert now is not None
                return BrokerHeartbeatResponse(
                    is_fenced=now.fenced,
                    in_controlled_shutdown=body.want_shutdown,
                    should_shut_down=body.want_shutdown,
                )
            case FetchMetadataRequest():
                if body.from_offset >= len(self.records):
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.appended.wait(), body.max_wait_ms / 1000)
                return FetchMetadataResponse(
                    records=[
                        FetchedRecord(i, 0, r)
                        for i, r in enumerate(self.records)
                        if i >= body.from_offset
                    ],
                    end_offset=len(self.records),
                )
            case AlterPartitions():
                return AlterPartitionsResponse(
                    results=[
                        AlterPartitionResult(
                            topic=i.topic,
                            partition=i.partition,
                            view=self._view(i.topic, i.partition),
                        )
                        for i in body.items
                    ]
                )
            case AlterPartition():
                p = self.image.partitions[(body.topic, body.partition)]
                return PartitionState(
                    topic=p.topic,
                    partition=p.partition,
                    replicas=list(p.replicas),
                    leader=p.leader,
                    leader_epoch=p.leader_epoch,
                    partition_epoch=p.partition_epoch,
                    isr=sorted(p.isr),
                )
        raise InvalidRequestError(f"the fake controller does not handle {type(body).__name__}")

    def _view(self, topic: str, partition: int) -> PartitionView:
        """The partition as it stands: the fake accepts a change without applying it."""
        return partition_view(self.image.partitions[(topic, partition)])
