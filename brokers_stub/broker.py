"""The broker process: start-up, registration, heartbeats, request dispatch, shutdown.

Start: take (read and delete) `clean_shutdown`, load the replicas (dropping unflushed
data with --lose-unflushed), listen, register with the previous epoch (None after an
unclean stop) and print the READY line. Run: heartbeat every interval (asking to stay
fenced until the metadata image has caught up), tail the metadata log, replicate, and
serve Produce and ReadLog (see `produce.py`) beside the replication requests.
Re-register with the current epoch when the controller answers STALE_BROKER_EPOCH or
BROKER_ID_NOT_REGISTERED. Stop (SIGTERM/SIGINT): controlled shutdown through
heartbeats, stop replicating, fsync every replica, then write `clean_shutdown`.

This module orchestrates tasks and owns broker-level state (epoch, incarnation). It
must not make replication decisions (replica_manager / replication do) and must not
frame bytes (server / rpc do).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Coroutine
from typing import Any, Final, TextIO

from brokers_stub.config import BrokerConfig
from brokers_stub.kafka.apis import BrokerKafkaApis
from brokers_stub.kafka.data import MESSAGE_MAX_BYTES, KafkaData
from brokers_stub.kafka.forward import AdminForwarder
from brokers_stub.leader_side import fetch_bytes_budget
from brokers_stub.logctx import BrokerLog
from brokers_stub.metadata import MetadataFollower
from brokers_stub.metrics import start_metrics
from brokers_stub.replica_manager import ReplicaManager
from brokers_stub.storage import take_clean_shutdown_epoch, write_clean_shutdown
from metactl.errors import (
    BrokerIdNotRegisteredError,
    ClusterAuthorizationFailedError,
    DuplicateBrokerRegistrationError,
    InvalidRequestError,
    MetactlError,
    NetworkError,
    StaleBrokerEpochError,
    TopicAuthorizationFailedError,
)
from metadata_image.delta import MetadataDelta
from metadata_image.image import ClusterImage
from protocol.admission import Peer
from protocol.client import Endpoints, FailoverPolicy, RpcClient
from protocol.kafka.listener import KafkaListener
from protocol.messages.broker_controller import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.data import ProduceRequest, ReadLogRequest
from protocol.messages.replication import ReplicaFetchRequest
from protocol.messages.unions import Message
from protocol.server import FrameServer
from protocol.tls import ADMIN, CONTROLLER, VIEWER, broker_id_of

EXIT_OK: Final = 0
EXIT_STARTUP_FAILED: Final = 1
EXIT_INTERNAL: Final = 70


def ready_line(
    broker_id: int, epoch: int, endpoint: str, metrics: str | None = None, kafka: str = ""
) -> str:
    line = f"READY broker={broker_id} epoch={epoch} endpoint={endpoint}"
    line = line if metrics is None else f"{line} metrics={metrics}"
    return f"{line} kafka={kafka}" if kafka else line


class Broker:
    def __init__(self, config: BrokerConfig, *, stdout: TextIO | None = None) -> None:
        self.config = config
        self.stdout = stdout if stdout is not None else sys.stdout
        self.log = BrokerLog(config.broker_id)
        self.incarnation_id = str(uuid.uuid4())
        self.epoch: int | None = None
        self.endpoint = ""
        self.is_fenced = True
        self.shutdown_requested = asyncio.Event()
        self._signals = 0
        self._hurry = asyncio.Event()  # a second signal: stop waiting for the controller
        # Heartbeat now rather than at the next interval (the metadata just caught up).
        self._heartbeat_now = asyncio.Event()
        self._was_caught_up = False
        self.controller_hb = self._controller_client()
        self.controller_md = self._controller_client()
        self.controller_ap = self._controller_client()
        self.replicas = ReplicaManager(
            config, self.log, broker_epoch=lambda: self.epoch, controller=self.controller_ap
        )
        self.metadata = MetadataFollower(
            self.controller_md,
            config.data_dir,
            self.log,
            max_wait_ms=config.metadata_max_wait_ms,
            request_timeout_ms=config.request_timeout_ms,
        )
        self.metadata.listeners.append(self.replicas.on_metadata)
        self.metadata.listeners.append(self._on_metadata)
        self.server = FrameServer(
            self.handle,
            log=self.log,
            max_frame_bytes=config.max_frame_bytes,
            ssl=config.server_ssl,
            limits=config.limits,
        )
        # Kafka's wire protocol for Kafka clients (--kafka-listen), from the metadata image.
        self.kafka: KafkaListener | None = None
        self.kafka_endpoint = ""
        self.controller_admin: RpcClient | None = None
        if config.kafka_listen is not None:
            data = KafkaData(
                self.replicas,
                broker_epoch=lambda: self.epoch,
                tls=config.tls is not None,
                refused=self._refused,
                # Kafka's message.max.bytes, and never more than a follower can copy in
                # one ReplicaFetch answer (a smaller --max-frame-bytes lowers it).
                max_batch_bytes=min(
                    MESSAGE_MAX_BYTES, fetch_bytes_budget(config, MESSAGE_MAX_BYTES)
                ),
            )
            # Admin APIs forwarded to the controller over a client of their own, so that
            # they never queue behind heartbeats or metadata fetches.
            self.controller_admin = self._controller_client()
            admin = AdminForwarder(
                config.broker_id,
                lambda: self.metadata.image,
                self.controller_admin,
                cluster_id=config.cluster_id,
            )
            apis = BrokerKafkaApis(
                config.broker_id,
                lambda: self.metadata.image,
                parts=(data, admin),
                cluster_id=config.cluster_id,
            )
            self.kafka = KafkaListener(
                apis.served,
                apis.answer,
                log=self.log,
                ssl=config.server_ssl,
                limits=config.limits,
            )
        self._tasks: list[asyncio.Task[None]] = []
        self._metrics_stop: object | None = None
        self.metrics_address: str | None = None  # where /metrics is served, once it is
        # Authorization refusals, (principal, operation) -> count, for /metrics; a WARNING
        # at most once per principal per period: principal -> (its last line, held since).
        self.authorization_failures: Counter[tuple[str, str]] = Counter()
        self.refusal_log_period_s = 1.0
        self._refusal_lines: dict[str, tuple[float, int]] = {}

    def _controller_client(self) -> RpcClient:
        """A client to the controller, or to the active one of several: a NOT_CONTROLLER
        or an unreachable controller is tried again at once elsewhere (the hinted active
        controller, else the next address), a few times, within the request."""
        c = self.config
        endpoints = Endpoints.parse(c.controller)
        return RpcClient(
            endpoints,
            max_frame_bytes=c.max_frame_bytes,
            ssl=c.client_ssl,
            expect_principal=CONTROLLER if c.tls is not None else None,
            retry=FailoverPolicy.over(endpoints),
        )

    # --- requests from the network ------------------------------------------------------

    async def handle(self, body: Message, peer: Peer) -> Message:
        if self.config.tls is not None:  # without TLS (--insecure) there is no principal
            self._authorize(body, peer)
        match body:
            case GetReplicaLogInfoRequest():
                return self.replica_log_info(body)
            case ReplicaFetchRequest():
                return await self.replicas.fetch(body)  # long-polled
            case ProduceRequest():
                return await self.replicas.data.produce(body)
            case ReadLogRequest():
                return self.replicas.data.read_log(body)
        raise InvalidRequestError(f"a broker does not handle {type(body).__name__}")

    def _authorize(self, body: Message, peer: Peer) -> None:
        """Who may ask a broker what (docs/protocol.md, "Authorization"): GetReplicaLogInfo
        only the controller; ReplicaFetch only the follower it names; Produce `admin`;
        ReadLog `admin` or `viewer`; nothing else. Topic operations are refused with
        TOPIC_AUTHORIZATION_FAILED, the others with CLUSTER_AUTHORIZATION_FAILED."""
        principal = peer.principal
        on_topic = isinstance(body, ProduceRequest | ReadLogRequest)
        match body:
            case GetReplicaLogInfoRequest():
                operation, allowed = "get_replica_log_info", principal == CONTROLLER
            case ReplicaFetchRequest():
                operation, allowed = "replica_fetch", broker_id_of(principal) == body.follower_id
            case ProduceRequest():
                operation, allowed = "produce", principal == ADMIN
            case ReadLogRequest():
                operation, allowed = "read_log", principal in (ADMIN, VIEWER)
            case _:
                operation, allowed = "unsupported", False
        if allowed:
            return
        who = "no principal" if principal is None else f"principal {principal!r}"
        what = (
            f"send {type(body).__name__} to broker"  # not "may not unsupported on broker"
            if operation == "unsupported"
            else f"{operation} on broker"
        )
        error = (TopicAuthorizationFailedError if on_topic else ClusterAuthorizationFailedError)(
            f"{who} may not {what} {self.config.broker_id}"
        )
        self._refused(principal if principal is not None else "-", operation, error)
        raise error

    def _refused(self, principal: str, operation: str, error: MetactlError) -> None:
        """Count a refusal; log it unless this principal had a line within the period
        (the next line's `count` includes the refusals held back)."""
        self.authorization_failures[(principal, operation)] += 1
        now = time.monotonic()
        last = self._refusal_lines.get(principal)
        if last is not None and now - last[0] < self.refusal_log_period_s:
            self._refusal_lines[principal] = (last[0], last[1] + 1)
            return
        self._refusal_lines[principal] = (now, 0)
        self.log.warning(
            "authorization failed",
            principal=principal,
            operation=operation,
            code=error.code,
            error=error.message,
            count=1 + (last[1] if last is not None else 0),
        )

    def replica_log_info(self, req: GetReplicaLogInfoRequest) -> GetReplicaLogInfoResponse:
        if req.broker_id != self.config.broker_id:
            raise InvalidRequestError(
                f"this is broker {self.config.broker_id}, not broker {req.broker_id}"
            )
        if self.epoch is None or req.broker_epoch != self.epoch:
            raise StaleBrokerEpochError(
                f"broker {self.config.broker_id} is at epoch {self.epoch}, not {req.broker_epoch}"
            )
        entries = self.replicas.log_info(req.partitions)
        self.log.info(
            "replica log info",
            partitions=[
                [e.topic, e.partition, e.last_leader_epoch, e.log_end_offset] for e in entries
            ],
        )
        return GetReplicaLogInfoResponse(
            broker_id=self.config.broker_id, broker_epoch=self.epoch, partitions=entries
        )

    # --- the process ----------------------------------------------------------------------

    def request_shutdown(self) -> None:
        self._signals += 1
        if self._signals > 1:
            self.log.warning("second stop signal: not waiting for the controller any longer")
            self._hurry.set()
        self.shutdown_requested.set()

    async def run(self, *, install_signals: bool = True) -> int:
        """Run until stopped; return the exit status. SIGTERM and SIGINT request the
        stop (tests embedding a broker call `request_shutdown` instead)."""
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT) if install_signals else ():
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_shutdown)
                installed.append(sig)
        try:
            return await self._run()
        except Exception:
            self.log.exception("broker failed")
            return EXIT_INTERNAL
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await self._stop_tasks()
            await self.server.stop()
            if self.kafka is not None:
                await self.kafka.stop()
            self._stop_metrics()
            for client in (self.controller_hb, self.controller_md, self.controller_ap):
                await client.close()
            if self.controller_admin is not None:
                await self.controller_admin.close()

    async def _run(self) -> int:
        cfg = self.config
        previous_epoch: int | None = None
        try:
            cfg.data_dir.mkdir(parents=True, exist_ok=True)
            previous_epoch, problem = take_clean_shutdown_epoch(cfg.data_dir)
            if problem is not None:
                self.log.warning("clean shutdown file unusable; starting unclean", problem=problem)
            self.log.info(
                "starting",
                incarnation_id=self.incarnation_id,
                previous_broker_epoch=previous_epoch,
                clean=previous_epoch is not None,
                data_dir=str(cfg.data_dir),
            )
            self.replicas.load(lose_unflushed=cfg.lose_unflushed)
            self.endpoint = await self.server.start(cfg.listen)
            if self.kafka is not None and cfg.kafka_listen is not None:
                self.kafka_endpoint = await self.kafka.start(cfg.kafka_listen)
            # A busy --metrics port fails the start as a busy --listen does (LISTEN_FAILED,
            # as the controller's): a broker never runs without the metrics it was given.
            self._start_metrics()
        except (OSError, MetactlError) as exc:
            self.log.error("broker start-up failed", error=str(exc))
            print(f"error: {exc}", file=sys.stderr)
            if previous_epoch is not None:
                # Nothing ran: the proof of the last clean shutdown still holds.
                with contextlib.suppress(OSError):
                    write_clean_shutdown(cfg.data_dir, previous_epoch)
            return EXIT_STARTUP_FAILED
        self.log.info("listening", endpoint=self.endpoint, kafka=self.kafka_endpoint or None)

        if not await self._register(previous_epoch):
            # Stopped before the controller ever answered: nothing new was written, so the
            # old proof of a clean shutdown (if any) still holds.
            self.replicas.flush_all()
            if previous_epoch is not None:
                write_clean_shutdown(cfg.data_dir, previous_epoch)
            self.log.info("stopped before registering")
            return EXIT_OK
        assert self.epoch is not None
        print(
            ready_line(
                cfg.broker_id,
                self.epoch,
                self.endpoint,
                self.metrics_address,
                kafka=self.kafka_endpoint,
            ),
            file=self.stdout,
            flush=True,
        )

        self.replicas.start()
        self._spawn(self.metadata.run(), "metadata")
        heartbeats = self._spawn(self._heartbeat_loop(), "heartbeats")
        await self.shutdown_requested.wait()

        self.log.info("controlled shutdown starting")
        heartbeats.cancel()
        await asyncio.wait({heartbeats}, timeout=5)  # it stops itself too, see the loop
        await self._controlled_shutdown()
        await self.replicas.stop()
        await self._stop_tasks()
        await self.server.stop()
        if self.kafka is not None:
            await self.kafka.stop()
        self.replicas.flush_all()
        write_clean_shutdown(cfg.data_dir, self.epoch)
        self.log.info("stopped cleanly", broker_epoch=self.epoch)
        return EXIT_OK

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.append(task)
        return task

    async def _stop_tasks(self) -> None:
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.replicas.stop()

    async def _wait_or_stop(self, seconds: float, event: asyncio.Event) -> bool:
        """Wait `seconds` (a timer) or until `event` is set; True if it was.

        asyncio.timeout rather than wait_for: on 3.11 wait_for can swallow a cancellation
        that arrives as the event fires, and a heartbeat task would then never stop.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await event.wait()
        return event.is_set()

    # --- registration and heartbeats ------------------------------------------------------

    async def _register(self, previous_epoch: int | None) -> bool:
        """Register until the controller accepts; False if a stop was requested first."""
        cfg = self.config
        interval = cfg.heartbeat_interval_ms / 1000
        failures = 0
        while not self.shutdown_requested.is_set():
            req = RegisterBroker(
                broker_id=cfg.broker_id,
                incarnation_id=self.incarnation_id,
                previous_epoch=previous_epoch,
                rack=cfg.rack,
                endpoint=self.endpoint,
                kafka_endpoint=self.kafka_endpoint,
            )
            delay = interval
            try:
                resp = await self.controller_hb.request(req, cfg.request_timeout_ms / 1000)
                if not isinstance(resp, RegisterBrokerResponse):
                    raise InvalidRequestError(f"unexpected {type(resp).__name__}")
            except DuplicateBrokerRegistrationError as exc:
                self.log.info("registration refused: old session still active", error=exc.message)
            except NetworkError as exc:
                if failures == 0:
                    self.log.warning("controller unreachable; will retry", error=exc.message)
                delay = min(0.1 * 2 ** min(failures, 5), interval)
                failures += 1
            except MetactlError as exc:
                self.log.error("registration failed; will retry", code=exc.code, error=exc.message)
            else:
                self.epoch = resp.broker_epoch
                self.is_fenced = True
                self.log.set_epoch(resp.broker_epoch)
                self.log.info(
                    "registered",
                    broker_epoch=resp.broker_epoch,
                    clean=resp.clean,
                    previous_broker_epoch=previous_epoch,
                    endpoint=self.endpoint,
                )
                return True
            if await self._wait_or_stop(delay, self.shutdown_requested):
                break
        return False

    def _on_metadata(
        self, image: ClusterImage, delta: MetadataDelta | None, caught_up: bool
    ) -> None:
        if caught_up and not self._was_caught_up:
            self._heartbeat_now.set()  # ask to be unfenced without waiting an interval
        self._was_caught_up = caught_up

    def _heartbeat_request(self, *, want_shutdown: bool) -> BrokerHeartbeatRequest:
        assert self.epoch is not None
        return BrokerHeartbeatRequest(
            broker_id=self.config.broker_id,
            broker_epoch=self.epoch,
            metadata_offset=self.metadata.applied_offset,
            want_fence=not self.metadata.caught_up,
            want_shutdown=want_shutdown,
        )

    def _heartbeat_timeout(self) -> float:
        cfg = self.config
        return min(cfg.session_timeout_ms / 2, max(2 * cfg.heartbeat_interval_ms, 1000)) / 1000

    async def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval_ms / 1000
        failures = 0
        while not self.shutdown_requested.is_set():  # then _controlled_shutdown takes over
            try:
                resp = await self.controller_hb.request(
                    self._heartbeat_request(want_shutdown=False), self._heartbeat_timeout()
                )
                if not isinstance(resp, BrokerHeartbeatResponse):
                    raise InvalidRequestError(f"unexpected {type(resp).__name__}")
            except (StaleBrokerEpochError, BrokerIdNotRegisteredError) as exc:
                self.log.warning(
                    "controller no longer knows this registration; re-registering",
                    code=exc.code,
                    error=exc.message,
                )
                await self._register(self.epoch)
                continue
            except NetworkError as exc:
                if failures == 0:
                    self.log.warning("heartbeat failed; will retry", error=exc.message)
                failures += 1
            except MetactlError as exc:
                self.log.warning("heartbeat refused", code=exc.code, error=exc.message)
                failures += 1
            except Exception:
                self.log.exception("heartbeat: unexpected error")
                failures += 1
            else:
                if failures:
                    self.log.info("heartbeats resumed", failed=failures)
                failures = 0
                if resp.is_fenced != self.is_fenced:
                    self.log.info(
                        "fenced" if resp.is_fenced else "unfenced",
                        metadata_offset=self.metadata.applied_offset,
                    )
                self.is_fenced = resp.is_fenced
            await self._wait_or_stop(interval, self._heartbeat_now)  # the heartbeat timer
            self._heartbeat_now.clear()

    async def _controlled_shutdown(self) -> None:
        """Heartbeat with want_shutdown until the controller lets us stop, the controller
        has been unreachable for a session timeout, or a second signal says hurry."""
        cfg = self.config
        period = min(cfg.heartbeat_interval_ms, 1000) / 1000
        last_contact = time.monotonic()
        while not self._hurry.is_set():
            try:
                resp = await self.controller_hb.request(
                    self._heartbeat_request(want_shutdown=True), self._heartbeat_timeout()
                )
                if not isinstance(resp, BrokerHeartbeatResponse):
                    raise InvalidRequestError(f"unexpected {type(resp).__name__}")
            except (StaleBrokerEpochError, BrokerIdNotRegisteredError) as exc:
                self.log.warning("controlled shutdown: registration gone", code=exc.code)
                return
            except MetactlError as exc:
                unreachable_s = time.monotonic() - last_contact
                if unreachable_s * 1000 > cfg.session_timeout_ms:
                    self.log.warning(
                        "controller unreachable for a session timeout; stopping anyway",
                        error=str(exc),
                    )
                    return
            else:
                last_contact = time.monotonic()
                if resp.should_shut_down:
                    self.log.info("controlled shutdown complete")
                    return
            if await self._wait_or_stop(period, self._hurry):
                return

    # --- metrics ------------------------------------------------------------------------

    def _start_metrics(self) -> None:
        if self.config.metrics is None:
            return
        self._metrics_stop, self.metrics_address = start_metrics(self, self.config.metrics)
        self.log.info("metrics endpoint", address=self.metrics_address)

    def _stop_metrics(self) -> None:
        stop, self._metrics_stop = self._metrics_stop, None
        if callable(stop):
            with contextlib.suppress(Exception):
                stop()
