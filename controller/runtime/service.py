"""The controller service: the driver behind a TCP listener, with broker sessions.

Owns the network side of the controller: framing, per-connection request handling,
broker sessions (fence on expiry, unfence once caught up), metadata fetches (long-poll
over committed records only), and GetReplicaLogInfo calls to brokers during unclean
recovery. Every decision is still made by the pure core through `Controller.submit`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import structlog

from controller.core.config import ControllerConfig
from controller.core.recovery.tracker import Inspection
from controller.runtime.clock import Clock, SystemClock
from controller.runtime.describe import describe_image, partition_state
from controller.runtime.driver import Controller
from controller.runtime.metrics import ControllerMetrics, MetricsServer
from controller.runtime.sessions import BrokerSessions
from metactl.errors import (
    BrokerIdNotRegisteredError,
    InvalidRequestError,
    MetactlError,
    OffsetOutOfRangeError,
    StaleBrokerEpochError,
)
from metadata_image.image import TopicPartition
from metadata_image.snapshot import ImageSnapshot
from metadata_log.sqlite_store import SqliteLogStore
from protocol.codec import (
    DEFAULT_MAX_FRAME_BYTES,
    AlterPartitionRequest,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    BrokerRegistrationRequest,
    BrokerRegistrationResponse,
    CreateTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ElectLeadersRequest,
    FetchedRecord,
    FetchMetadataRequest,
    FetchMetadataResponse,
    FrameTooLargeError,
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    Message,
    MetadataSnapshot,
    PartitionState,
    ReplicaRef,
    decode_frame,
    encode_frame,
    error_response,
    parse_address,
    read_frame,
    request_once,
)
from protocol.requests import (
    AlterPartition,
    ControlledShutdown,
    ControlledShutdownResponse,
    CreateTopic,
    CreateTopicResponse,
    ElectLeader,
    FenceBroker,
    PartitionView,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaLogInfo,
    UnfenceBroker,
)

log = structlog.get_logger("metactl.controller.service")

R = TypeVar("R", bound=msgspec.Struct)

INSPECTION_RETRIES = 20


def same_fields(message: msgspec.Struct, request: type[R]) -> R:
    """Build a controller request from a wire message that carries its fields under the
    same names (the wire adds only its tag and version)."""
    return request(**{f: getattr(message, f) for f in request.__struct_fields__ if f != "v"})


class ControllerService:
    def __init__(
        self,
        data_dir: Path,
        listen: str,
        *,
        config: ControllerConfig | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        clock: Clock | None = None,
        metrics: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.metrics_listen = metrics  # HOST:PORT for /metrics; None: not served
        self.listen = listen
        self.config = config or ControllerConfig()
        self.max_frame_bytes = max_frame_bytes
        self.clock: Clock = clock or SystemClock()
        self.sessions = BrokerSessions(self.config.broker_session_timeout_ms)
        self.store: SqliteLogStore | None = None
        self.ctl: Controller | None = None
        self.server: asyncio.Server | None = None
        self.address = ""
        self.metrics: ControllerMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        self.metrics_address = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[asyncio.StreamWriter] = set()
        self._stopping = asyncio.Event()

    @property
    def controller(self) -> Controller:
        assert self.ctl is not None
        return self.ctl

    async def start(self) -> None:
        self.store = await SqliteLogStore.open(self.data_dir)
        self.ctl = await Controller.open(self.store, config=self.config, clock=self.clock)
        self.ctl.log_every_record = True
        self.ctl.inspection_sinks.append(self._on_inspection)
        self.metrics = ControllerMetrics.attach(self.ctl)
        if self.metrics_listen is not None:
            self.metrics_server = await MetricsServer.start(
                self.metrics.registry, self.metrics_listen
            )
            self.metrics_address = self.metrics_server.address
        host, port = parse_address(self.listen)
        self.server = await asyncio.start_server(self._serve_connection, host, port)
        sock = self.server.sockets[0].getsockname()
        self.address = f"{sock[0]}:{sock[1]}"
        self._spawn(self._session_loop(), "sessions")
        log.info(
            "controller serving",
            listen=self.address,
            data_dir=str(self.data_dir),
            end_offset=self.store.end_offset,
        )

    async def stop(self) -> None:
        """Stop accepting, finish in-flight commits, close the log cleanly."""
        self._stopping.set()
        if self.server is not None:
            self.server.close()
        if self.metrics_server is not None:
            await self.metrics_server.close()
        for w in list(self._connections):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ctl is not None:
            await self.ctl.close()
        if self.store is not None:
            await self.store.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
        log.info("controller stopped")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- connections --------------------------------------------------------------------

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        peer = writer.get_extra_info("peername")
        self._connections.add(writer)
        try:
            while not self._stopping.is_set():
                try:
                    payload = await read_frame(reader, self.max_frame_bytes)
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        log.warning("truncated frame; closing", peer=str(peer))
                    return
                except FrameTooLargeError as exc:
                    log.warning("oversized frame; closing", peer=str(peer), error=exc.message)
                    writer.write(encode_frame(0, error_response(exc)))
                    await writer.drain()
                    return
                try:
                    frame = decode_frame(payload)
                except InvalidRequestError as exc:
                    log.warning("undecodable frame", peer=str(peer), error=exc.message)
                    writer.write(encode_frame(0, error_response(exc)))
                    await writer.drain()
                    continue
                try:
                    body = await self._dispatch(frame.body)
                except MetactlError as exc:
                    body = error_response(exc)
                writer.write(encode_frame(frame.correlation_id, body))
                await writer.drain()
        except (ConnectionError, OSError):
            return
        except asyncio.CancelledError:
            return
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _dispatch(self, body: Message) -> Message:
        ctl = self.controller
        match body:
            case BrokerHeartbeatRequest():
                return await self._heartbeat(body)
            case FetchMetadataRequest():
                return await self._fetch(body)
            case BrokerRegistrationRequest():
                r = await ctl.submit(
                    RegisterBroker(
                        broker_id=body.broker_id,
                        incarnation_id=body.incarnation_id,
                        previous_epoch=body.previous_broker_epoch,
                        endpoint=body.endpoint,
                        rack=body.rack,
                    )
                )
                assert isinstance(r, RegisterBrokerResponse)
                self.sessions.touch(body.broker_id, self.clock.now_ms())
                return BrokerRegistrationResponse(broker_epoch=r.broker_epoch, clean=r.clean)
            case AlterPartitionRequest():
                return await self._partition_request(same_fields(body, AlterPartition))
            case CreateTopicsRequest():
                results = []
                for spec in body.topics:
                    try:
                        r = await ctl.submit(
                            CreateTopic(
                                name=spec.name,
                                partitions=spec.partitions,
                                replication_factor=spec.replication_factor,
                                assignments=spec.assignments,
                                min_isr=spec.min_insync_replicas,
                                recovery_strategy=spec.unclean_recovery_strategy,
                            )
                        )
                        assert isinstance(r, CreateTopicResponse)
                        results.append(
                            CreateTopicResult(
                                name=spec.name, topic_id=r.topic_id, assignments=r.assignments
                            )
                        )
                    except MetactlError as exc:
                        results.append(
                            CreateTopicResult(
                                name=spec.name, error_code=exc.code, message=exc.message
                            )
                        )
                return CreateTopicsResponse(results=results)
            case DescribeClusterRequest():
                return self.describe(body.topic)
            case ElectLeadersRequest():
                return await self._partition_request(same_fields(body, ElectLeader))
        raise InvalidRequestError(f"the controller does not handle {type(body).__name__}")

    async def _partition_request(self, request: AlterPartition | ElectLeader) -> PartitionState:
        """Submit a request answered with one partition's committed state."""
        ctl = self.controller
        v = await ctl.submit(request)
        assert isinstance(v, PartitionView)
        return partition_state(ctl.committed_image.partitions[(v.topic, v.partition)])

    def describe(self, topic: str | None = None) -> DescribeClusterResponse:
        """Committed state only: nothing is shown before it is durable."""
        ctl = self.controller
        assert self.store is not None
        now = self.clock.now_ms()

        def pending(tp: TopicPartition) -> list[int] | None:
            if tp not in ctl.image.partitions:
                return None
            return ctl.tracker.awaited(ctl.image, tp, ctl.policies)

        def age(broker_id: int) -> int | None:
            last = self.sessions.last_heartbeat_ms(broker_id)
            return None if last is None else now - last

        return describe_image(
            ctl.committed_image,
            topic=topic,
            end_offset=ctl.image.end_offset,
            committed_offset=self.store.end_offset,
            recovery_pending=pending,
            heartbeat_age_ms=age,
        )

    # --- broker sessions ----------------------------------------------------------------

    async def _heartbeat(self, req: BrokerHeartbeatRequest) -> BrokerHeartbeatResponse:
        ctl = self.controller
        b = ctl.image.broker(req.broker_id)
        if b is None:
            raise BrokerIdNotRegisteredError(f"broker {req.broker_id} is not registered")
        if b.epoch != req.broker_epoch:
            raise StaleBrokerEpochError(
                f"heartbeat from broker {req.broker_id} at epoch {req.broker_epoch}, "
                f"current epoch is {b.epoch}"
            )
        self.sessions.touch(req.broker_id, self.clock.now_ms())
        should_stop = False
        if req.want_shutdown:
            r = await ctl.submit(ControlledShutdown(broker_id=b.broker_id, broker_epoch=b.epoch))
            assert isinstance(r, ControlledShutdownResponse)
            should_stop = r.can_stop
        elif b.fenced and not req.want_fence and req.metadata_offset > b.epoch:
            await ctl.submit(UnfenceBroker(broker_id=b.broker_id, broker_epoch=b.epoch))
        now = ctl.committed_image.broker(req.broker_id)
        assert now is not None
        return BrokerHeartbeatResponse(
            is_fenced=now.fenced,
            in_controlled_shutdown=now.in_controlled_shutdown,
            should_shut_down=should_stop,
        )

    async def _session_loop(self) -> None:
        period = max(0.05, min(self.config.broker_heartbeat_interval_ms, 1000) / 2000)
        while True:
            await asyncio.sleep(period)  # a timer, not synchronisation
            ctl = self.controller
            live = [b.broker_id for b in ctl.image.brokers.values() if not b.fenced]
            for broker_id in self.sessions.expired(live, self.clock.now_ms()):
                log.warning("broker session expired; fencing", broker=broker_id)
                with contextlib.suppress(MetactlError):
                    await ctl.submit(FenceBroker(broker_id=broker_id, reason="session_timeout"))

    # --- metadata fetch -----------------------------------------------------------------

    async def _fetch(self, req: FetchMetadataRequest) -> FetchMetadataResponse:
        store = self.store
        assert store is not None
        if req.from_offset < store.start_offset:
            snap = await store.load_snapshot(ImageSnapshot)
            if snap is None:
                raise OffsetOutOfRangeError(f"offset {req.from_offset} is no longer retained")
            return FetchMetadataResponse(
                records=[],
                end_offset=store.end_offset,
                snapshot=MetadataSnapshot(offset=snap[0], records=snap[1].records),
            )
        if req.from_offset > store.end_offset:
            raise OffsetOutOfRangeError(
                f"offset {req.from_offset} is beyond the committed end {store.end_offset}"
            )
        if req.from_offset == store.end_offset and req.max_wait_ms > 0:
            await store.wait_for(req.from_offset, timeout=min(req.max_wait_ms, 10_000) / 1000)
        entries = await store.read(req.from_offset, max(1, min(req.max_records, 50_000)))
        return FetchMetadataResponse(
            records=[FetchedRecord(e.offset, e.timestamp_ms, e.record) for e in entries],
            end_offset=store.end_offset,
        )

    # --- unclean recovery: GetReplicaLogInfo --------------------------------------------

    def _on_inspection(self, inspection: Inspection) -> None:
        self._spawn(self._inspect(inspection), f"inspect-{inspection.broker_id}")

    async def _inspect(self, insp: Inspection) -> None:
        ctl = self.controller
        for attempt in range(INSPECTION_RETRIES):
            b = ctl.image.broker(insp.broker_id)
            if b is None or b.epoch != insp.broker_epoch or not b.active or not b.endpoint:
                return
            try:
                resp = await request_once(
                    b.endpoint,
                    GetReplicaLogInfoRequest(
                        broker_id=insp.broker_id,
                        broker_epoch=insp.broker_epoch,
                        partitions=[ReplicaRef(insp.topic, insp.partition)],
                    ),
                    timeout_s=10,
                )
                if not isinstance(resp, GetReplicaLogInfoResponse):
                    raise InvalidRequestError(f"unexpected {type(resp).__name__}")
                for entry in resp.partitions:
                    if entry.error_code is not None:
                        log.warning(
                            "replica log info error", broker=insp.broker_id, code=entry.error_code
                        )
                        continue
                    await ctl.submit(
                        ReplicaLogInfo(
                            broker_id=resp.broker_id,
                            broker_epoch=resp.broker_epoch,
                            topic=entry.topic,
                            partition=entry.partition,
                            last_leader_epoch=entry.last_leader_epoch,
                            log_end_offset=entry.log_end_offset,
                        )
                    )
                return
            except StaleBrokerEpochError as exc:
                log.warning("replica log info rejected: stale broker epoch", error=exc.message)
                return
            except (MetactlError, OSError, TimeoutError) as exc:
                log.info(
                    "replica log info failed; will retry",
                    broker=insp.broker_id,
                    attempt=attempt,
                    error=str(exc),
                )
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))  # retry backoff
