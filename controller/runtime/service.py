"""The controller service: its role and leadership, and the composition of its parts.

A `ControllerService` opens the metadata log, binds its listener and `/metrics`, and
puts together what answers requests: the frame listener (`controller.runtime.
frame_listener`, metactl's wire), the admission policy (`controller.runtime.admission`:
authorization, the mutation quota and the partitions-per-request cap), the API handlers
(`controller.runtime.apis`, `controller.runtime.admin_apis`), unclean recovery's
GetReplicaLogInfo calls to brokers (`controller.runtime.inspections`) and broker sessions
(fence on expiry, `controller.runtime.sessions`). Every decision is still made by the
pure core through `Controller.submit`.

What it owns itself is its role. On SQLite (the default) the service is the one
controller and always *active*; a log that stops taking writes (FATAL_STORAGE_ERROR: an
I/O error, a read-only file) makes it step down and try to reopen the log a bounded
number of times before the process exits with the error (`watch_storage`). On etcd
(``--metadata-log etcd://...``) several services share one log and take turns: each
starts as a hot *standby* (`controller.runtime.standby`: the committed image, kept
current by tailing the log), answers reads from it and every write with NOT_CONTROLLER
naming the active controller (`redirect`), and campaigns for the log's leadership
(`controller.runtime.election`, which changes this role through its `RoleChanges`
methods: `stand_by`, `activate`, `deactivate`). The winner opens the log for writing
under its leadership, starts the driver from its standby image and serves; it steps down
(back to standby, closing the driver) when its leadership can no longer be trusted, or an
append is fenced or its outcome unknown. docs/ha.md has the whole story. Whatever its
role, a controller answers DescribeQuorum for itself (`controller.runtime.quorum`,
`metactl quorum describe`).

Its parts read the role through interfaces (`controller.runtime.service_role`) and
import no service: the service imports them. Must not: decide anything about metadata,
or handle a request itself (the listener and the API handlers do).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog

from controller.core.config import ControllerConfig
from controller.core.controller_change import ControllerActivated
from controller.core.lifecycle import Bootstrap, needs_bootstrap
from controller.core.work import WORK_BUDGET
from controller.runtime.admission import RequestAdmission
from controller.runtime.apis import ControllerApis
from controller.runtime.clock import Clock, SystemClock
from controller.runtime.describe import DescribeNotes
from controller.runtime.driver import Controller
from controller.runtime.frame_listener import FrameListener
from controller.runtime.ha_settings import HaSettings
from controller.runtime.inspections import Inspections
from controller.runtime.kafka_apis import ControllerKafkaApis
from controller.runtime.metrics import ControllerMetrics
from controller.runtime.metrics_server import MetricsServer, RoleMetrics
from controller.runtime.quorum import describe_quorum
from controller.runtime.quota import MutationLimits, MutationQuota
from controller.runtime.sessions import BrokerSessions
from controller.runtime.standby import Standby
from metactl.errors import FatalStorageError, MetactlError, NotControllerError
from metadata_image.image import ClusterImage
from metadata_image.transactions import LogReplay
from metadata_log.backends import is_etcd_url, open_store
from metadata_log.records import ELR_FEATURE
from metadata_log.store import LogStore
from protocol.codec import DEFAULT_MAX_FRAME_BYTES
from protocol.kafka.listener import KafkaListener
from protocol.limits import ServerLimits
from protocol.messages.admin import DescribeQuorumRequest, DescribeQuorumResponse
from protocol.messages.internal import FenceBroker
from protocol.server import FrameServer
from protocol.tls import TlsIdentity

if TYPE_CHECKING:  # the etcd client library (and gRPC) loads only for an etcd log
    from controller.runtime.election import Election
    from metadata_log.etcd.lease import Leadership

__all__ = ["ControllerService"]

log = structlog.get_logger("metactl.controller.service")

# Stepping down waits this long for in-flight commits (fenced ones fail at once).
STEP_DOWN_S = 10.0
# A single controller (SQLite) whose log stopped taking writes (FATAL_STORAGE_ERROR:
# an I/O error, a read-only file) steps down and tries to reopen the log this many
# times, this far apart, before the process exits with the error (Kafka's fault handler
# ends the process; issue 21 item 7).
STORAGE_REOPEN_ATTEMPTS = 3
STORAGE_REOPEN_BACKOFF_S = 1.0


def activation(leadership: Leadership) -> ControllerActivated:
    """The event that records a won term (`controller.core.controller_change`): the
    leadership's holder and token, and how the term before it ended (`previous`, read in
    the winning campaign; None: not known)."""
    previous = leadership.previous
    if previous is None:
        return ControllerActivated(
            node=leadership.info.node, term=leadership.token, address=leadership.info.address
        )
    return ControllerActivated(
        node=leadership.info.node,
        term=leadership.token,
        address=leadership.info.address,
        previous_node=previous.node,
        previous_term=previous.token,
        previous_reason=previous.reason,
        previous_by=previous.by,
        previous_detail=previous.detail,
    )


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
        tls: TlsIdentity | None = None,
        limits: ServerLimits | None = None,
        mutation_limits: MutationLimits | None = None,
        verify_log: Literal["tail", "full"] = "tail",
        metadata_log: str | None = None,
        ha: HaSettings | None = None,
        work_budget: int | None = WORK_BUDGET,
        kafka_listen: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        # HOST:PORT of the Kafka listener for --bootstrap-controller clients (KIP-919);
        # None: not served.
        self.kafka_listen = kafka_listen
        self.kafka: KafkaListener | None = None
        self.kafka_address = ""
        # Partitions per controller event (controller.core.work): bulk work is sliced.
        self.work_budget = work_budget
        # Where the log is: None, a path or sqlite: URL (one controller, always active),
        # or etcd://... (controllers take turns: `ha`).
        self.metadata_log = metadata_log
        self.ha = ha if ha is not None else HaSettings()
        self.role: Literal["starting", "standby", "active"] = "starting"
        self.standby: Standby | None = None
        # The last term's committed image, after stepping down: reads answer from it
        # until a standby, which replays the log on from it, replaces it.
        self.last_image: ClusterImage | None = None
        # Set when the log could not be written and reopening it failed: the process
        # exits with it (`controller.runtime.serve`).
        self.storage_failure: MetactlError | None = None
        self.failed = asyncio.Event()
        self.leadership: Leadership | None = None
        self.leader_hint: str | None = None  # the active controller's address, if known
        self.active_since_ms: int | None = None  # when this controller last became active
        self.election: Election | None = None
        self.role_metrics = RoleMetrics()
        # What start() checks of the log before serving: the last batches' CRCs (what
        # replay does not read again is then checked on first read), or every batch.
        self.verify_log = verify_log
        self.metrics_listen = metrics  # HOST:PORT for /metrics; None: not served
        self.listen = listen
        self.config = config or ControllerConfig()
        self.max_frame_bytes = max_frame_bytes
        # Mutual TLS (None: plaintext, `--insecure`): the controller's identity for its
        # listener and for the GetReplicaLogInfo calls it makes to brokers.
        self.tls = tls
        self.server_ssl = tls.server_context() if tls is not None else None
        self.client_ssl = tls.client_context() if tls is not None else None
        self.limits = limits if limits is not None else ServerLimits()
        self.clock: Clock = clock or SystemClock()
        self.sessions = BrokerSessions(self.config.broker_session_timeout_ms)
        self.store: LogStore | None = None  # the writer's store while active
        self.ctl: Controller | None = None
        self.server: FrameServer | None = None
        self.address = ""
        self.metrics: ControllerMetrics | None = None
        # What describe shows beyond the image (last unclean recoveries, fence reasons),
        # from what this process committed.
        self.notes = DescribeNotes()
        self.metrics_server: MetricsServer | None = None
        self.metrics_address = ""
        self._tasks: set[asyncio.Task[None]] = set()
        # Who may ask and how much (authorization under TLS; the KIP-599 mutation quota
        # per principal and the partitions-per-request cap, controller/runtime/quota.py).
        self.admission = RequestAdmission(
            authorizing=tls is not None,
            clock=self.clock,
            mutation_limits=mutation_limits if mutation_limits is not None else MutationLimits(),
            metrics=lambda: self.metrics,
        )
        self.quota: MutationQuota = self.admission.quota
        self.apis = ControllerApis(
            self,
            admission=self.admission,
            describe_quorum=self._describe_quorum,
            config=self.config,
            clock=self.clock,
            notes=self.notes,
            max_frame_bytes=max_frame_bytes,
            work_budget=work_budget,
        )
        self.listener = FrameListener(self.admission, self.apis)
        # Kafka's wire for admin clients (--kafka-listen): the same admission and handlers.
        self.kafka_apis = ControllerKafkaApis(
            self.admission,
            self.apis,
            image=self._read_image,
            describe_quorum=self._describe_quorum,
        )
        self.inspections = Inspections(
            lambda: self.controller,
            max_frame_bytes=max_frame_bytes,
            client_ssl=self.client_ssl,
            spawn=self._spawn,
        )

    @property
    def controller(self) -> Controller:
        assert self.ctl is not None
        return self.ctl

    async def start(self) -> None:
        """Open the log, replay it and listen. If any step fails, whatever was opened is
        closed again before the error propagates: an open store holds non-daemon threads
        (aiosqlite's), and a process that kept them could not exit."""
        try:
            await self._start()
        except BaseException:
            await self._release()
            raise

    @property
    def replicated(self) -> bool:
        """Whether the log is on etcd (several controllers take turns)."""
        return self.metadata_log is not None and is_etcd_url(self.metadata_log)

    async def _start(self) -> None:
        verify_all = self.verify_log == "full"
        # Storage identity (docs/operations.md): the data directory's meta.properties
        # against the log, before the log is opened; from here on the etcd log is checked
        # against the cluster id it returns.
        from dataclasses import replace

        from metadata_log.identity_check import check_storage

        cluster_id = await check_storage(
            self.data_dir,
            self.metadata_log,
            cluster_id=self.ha.cluster_id,
            node_id=self.ha.node_id,
            etcd_tls=self.ha.etcd_tls,
        )
        self.ha = replace(self.ha, cluster_id=cluster_id)
        if not self.replicated:
            where = self.metadata_log if self.metadata_log is not None else self.data_dir
            store = await open_store(where, verify_all=verify_all)
            try:
                await self.activate(store)
            except BaseException:
                await store.close()
                raise
            self._spawn(self.watch_storage(), "storage")
        if self.metrics_listen is not None:
            self.metrics_server = await MetricsServer.start(
                self.role_metrics.registry, self.metrics_listen, tls=self.tls
            )
            self.metrics_address = self.metrics_server.address
        if self.tls is None:
            log.warning("TLS is off (--insecure): any client can act as any broker or as an admin")
        self.server = FrameServer(
            self.listener.dispatch,
            log=log,
            max_frame_bytes=self.max_frame_bytes,
            ssl=self.server_ssl,
            limits=self.limits,
        )
        self.address = await self.server.start(self.listen)
        if self.kafka_listen is not None:
            self.kafka = KafkaListener(
                self.kafka_apis.served,
                self.kafka_apis.answer,
                log=log,
                ssl=self.server_ssl,
                limits=self.limits,
            )
            self.kafka_address = await self.kafka.start(self.kafka_listen)
            self.kafka_apis.address = self.kafka_address
        self._spawn(self._session_loop(), "sessions")
        if self.replicated:
            from controller.runtime.election import Election  # loads the etcd client

            assert self.metadata_log is not None
            self.election = await Election.start(
                self,
                self.metadata_log,
                self.ha,
                client_ssl=self.client_ssl,
                metrics=self.role_metrics,
                verify_all=verify_all,
            )
            self._spawn(self.election.run(), "election")
        log.info(
            "controller serving",
            listen=self.address,
            kafka=self.kafka_address or None,
            metadata_log=self.metadata_log or str(self.data_dir),
            role=self.role,
            end_offset=self.store.end_offset if self.store is not None else None,
        )

    # --- roles ---------------------------------------------------------------------------

    @property
    def advertised(self) -> str:
        """The address other controllers' NOT_CONTROLLER answers send clients to."""
        return self.ha.advertised_listener or self.address

    async def activate(
        self,
        store: LogStore,
        replayed: LogReplay | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        """Become the active controller on `store` (open for writing): start the driver
        (from `replayed`, a standby's image, when there is one), record the term under
        `leadership` (on etcd: a ControllerChangeRecord, the term's first record), start
        its metrics and fresh broker sessions (every registered broker gets a full
        session timeout of grace)."""
        ctl = await Controller.open(
            store,
            config=self.config,
            clock=self.clock,
            replayed=replayed,
            work_budget=self.work_budget,
        )
        ctl.log_every_record = True
        ctl.inspection_sinks.append(self.inspections.queue)
        if leadership is not None:
            # The term's first record (after the abort `Controller.open` appended, if
            # the last term left a transaction open): who is active now, and how the
            # term before ended. On SQLite there are no terms: nothing is written.
            try:
                await ctl.submit(activation(leadership))
            except BaseException:
                await ctl.close()
                raise
        if needs_bootstrap(ctl.image):
            # Pin what the static flags seed (the ELR feature level, the cluster-default
            # min.insync.replicas): a later restart with other flags does not change them.
            await ctl.submit(Bootstrap())
        elif ctl.image.elr_enabled(self.config.eligible_leader_replicas) != (
            self.config.eligible_leader_replicas
        ):
            log.warning(
                "--eligible-leader-replicas differs from the cluster's finalized level, "
                "which applies (change it with metactl features)",
                finalized=ctl.image.features.get(ELR_FEATURE),
            )
        self.sessions = BrokerSessions(self.config.broker_session_timeout_ms)
        self.store, self.ctl, self.leadership = store, ctl, leadership
        self.metrics = ControllerMetrics.attach(ctl)
        ctl.commit_listeners.append(self.notes.on_commit)  # describe's recoveries, fences
        self.role_metrics.active(self.metrics)
        self.role = "active"
        self.leader_hint = self.advertised
        self.active_since_ms = self.clock.now_ms()

    async def deactivate(self, reason: str) -> None:
        """Stop acting as the active controller: refuse writes at once, then close the
        driver (in-flight commits finish or fail) and the writer's store."""
        if self.role != "active":
            return
        self.role = "standby"
        self.leader_hint = None
        ctl, store, metrics = self.ctl, self.store, self.metrics
        if ctl is not None:
            self.last_image = ctl.committed_image
        self.role_metrics.inactive()
        log.warning("stepping down: no longer the active controller", reason=reason)
        if metrics is not None:
            metrics.detach()
        try:
            if ctl is not None:
                with contextlib.suppress(TimeoutError, MetactlError):
                    async with asyncio.timeout(STEP_DOWN_S):
                        await ctl.close()
        finally:
            self.ctl = self.store = self.metrics = self.leadership = None
            if store is not None:
                with contextlib.suppress(MetactlError):
                    await store.close()

    async def watch_storage(self) -> None:
        """A single controller whose log stops taking writes steps down at once (no
        request is accepted that cannot be made durable), logs it once, and tries to
        reopen the log a bounded number of times; if that fails the service is marked
        failed and the process exits non-zero with the error."""
        while True:
            store = self.store
            if store is None:
                return
            await store.write_failed.wait()
            failure = store.failure
            log.error(
                "the metadata log stopped taking writes: stepping down",
                location=store.location,
                code=failure.code if failure is not None else None,
                error=failure.message if failure is not None else None,
            )
            await self.deactivate("the metadata log stopped taking writes")
            error: MetactlError | None = failure
            for attempt in range(1, STORAGE_REOPEN_ATTEMPTS + 1):
                await asyncio.sleep(STORAGE_REOPEN_BACKOFF_S)
                where = self.metadata_log if self.metadata_log is not None else self.data_dir
                try:
                    reopened = await open_store(where, create=False)  # a log gone is not a new one
                except MetactlError as exc:
                    error = exc
                    log.warning(
                        "reopening the metadata log failed",
                        attempt=attempt,
                        of=STORAGE_REOPEN_ATTEMPTS,
                        code=exc.code,
                        error=exc.message,
                    )
                    continue
                try:
                    await self.activate(reopened)
                except MetactlError as exc:
                    await reopened.close()
                    error = exc
                    continue
                log.warning("metadata log reopened: active again", attempt=attempt)
                break
            else:
                self.storage_failure = error or FatalStorageError(
                    "the metadata log stopped taking writes"
                )
                self.failed.set()
                return

    async def redirect(self) -> NotControllerError:
        """NOT_CONTROLLER for a write to a standby, naming the active controller as the
        leadership key names it now (a bounded look). A
        controller never names itself (it may still think it is active after a pause
        longer than its TTL); when no controller is known to be active the error says
        so, and why (no holder, or etcd not answering: its reachable members)."""
        problem = None
        if self.leader_hint == self.advertised and not self.acting:
            self.leader_hint = None
        if self.election is not None:
            # The hint is checked against etcd each time (bounded by a second): a standby's
            # last campaign may have seen a holder that is gone since, and with etcd out of
            # quorum nobody is active, whatever it saw.
            address, problem = await self.election.leader_or_problem()
            if address == self.advertised:
                address, problem = None, "this controller's leadership ran out; an election is due"
            self.leader_hint = address
        return self.not_controller(problem)

    def not_controller(self, problem: str | None = None) -> NotControllerError:
        leader = self.leader_hint
        if leader is not None and leader != self.advertised:
            return NotControllerError(
                f"this controller is a standby: the active controller is {leader}",
                leader=leader,
            )
        why = f": {problem}" if problem else ""
        return NotControllerError(f"no controller is active{why}", leader=None)

    @property
    def acting(self) -> bool:
        """Active, and (on etcd) still sure of its leadership: checked per request, so a
        controller resumed after a pause longer than its TTL serves no write."""
        return self.role == "active" and (self.leadership is None or self.leadership.valid)

    def stepping_down(self) -> NotControllerError:
        """NOT_CONTROLLER for a write whose store stopped taking writes on etcd (fenced by
        a newer term, or an append's outcome unknown: this controller steps down), never
        naming this controller."""
        if self.leader_hint == self.advertised:
            self.leader_hint = None
        return self.not_controller()

    # --- what the election changes (controller.runtime.election.RoleChanges) -----------

    def stand_by(self, standby: Standby) -> None:
        self.standby = standby
        self.last_image = None  # the standby's image answers reads now
        if self.role == "starting":
            self.role = "standby"

    def release_standby(self) -> Standby | None:
        standby, self.standby = self.standby, None
        return standby

    def leader_seen(self, address: str | None) -> None:
        self.leader_hint = address

    async def _describe_quorum(self, request: DescribeQuorumRequest) -> DescribeQuorumResponse:
        return await describe_quorum(self, request)

    def _read_image(self) -> ClusterImage | None:
        """The image reads answer from: the committed one while acting, else the
        standby's, else the last term's (None before any)."""
        if self.acting and self.ctl is not None:
            return self.ctl.committed_image
        if self.standby is not None:
            return self.standby.image
        return self.last_image

    async def stop(self) -> None:
        """Stop accepting, finish in-flight commits, close the log cleanly."""
        await self._release()
        log.info("controller stopped")

    async def _release(self) -> None:
        # On etcd the listener stays bound (accepting nothing) until the leadership is
        # resigned: a standby watching this controller would take a refused port for a
        # death and end the term under the draining log (`dead_active`).
        keep = self.election is not None
        try:
            if self.server is not None:
                self.server.close(keep_bound=keep)
            if self.kafka is not None:
                await self.kafka.stop()
            if self.metrics_server is not None:
                await self.metrics_server.close()
            if self.server is not None:
                # Ends open connections and their in-flight requests.
                await self.server.stop(keep_bound=keep)
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self.ctl is not None:
                await self.ctl.close()
            if self.store is not None:
                await self.store.close()
            if self.election is not None:
                await self.election.close()  # resigns, closes the standby and its client
        finally:
            if self.server is not None:
                self.server.release_listeners()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- broker sessions ----------------------------------------------------------------

    async def _session_loop(self) -> None:
        period = max(0.05, min(self.config.broker_heartbeat_interval_ms, 1000) / 2000)
        paused = False
        while True:
            await asyncio.sleep(period)  # a timer, not synchronisation
            if not self.acting:
                paused = True
                continue
            if paused:
                # Acting again after a pause (a leadership suspended through an etcd
                # election, or a new term): heartbeats were refused meanwhile, so every
                # session starts over, as at a takeover.
                self.sessions = BrokerSessions(self.config.broker_session_timeout_ms)
                paused = False
            ctl = self.controller
            live = [b.broker_id for b in ctl.image.brokers.values() if not b.fenced]
            for broker_id in self.sessions.expired(live, self.clock.now_ms()):
                log.warning("broker session expired; fencing", broker=broker_id)
                with contextlib.suppress(MetactlError):
                    await ctl.submit(FenceBroker(broker_id=broker_id, reason="session_timeout"))
