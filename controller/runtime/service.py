"""The controller service: the driver behind a TCP listener, with broker sessions.

Owns the network side of the controller: request dispatch behind the shared protocol server,
broker sessions (fence on expiry, unfence once caught up), metadata fetches (long-poll
over committed records only), and GetReplicaLogInfo calls to brokers during unclean
recovery. Every decision is still made by the pure core through `Controller.submit`;
under TLS, who may ask is decided first by `controller.core.authz` (refusals counted
and logged here, rate-limited per principal). CreateTopics and ElectLeaders are then
admitted by the partitions-per-request cap and the per-principal mutation quota
(`controller.runtime.quota`) before anything is submitted. Every request that carries a
list is bounded first (`controller.runtime.request_caps`: an item cap, and a bound on its
answer against the frame limit), and no answer leaves larger than the frame limit
(MESSAGE_TOO_LARGE instead); DescribeCluster and ListPartitionReassignments are answered
page by page (`controller.runtime.describe`, `controller.runtime.admin_views`), metadata
fetches in as many records as fit a frame, and a bulk preferred election is read and
elected a work budget at a time.

Roles. On SQLite (the default) the service is the one controller and always *active*.
On etcd (``--metadata-log etcd://...``) several services share one log and take turns:
each starts as a hot *standby* (`controller.runtime.standby`: the committed image, kept
current by tailing the log), answers reads (DescribeCluster, FetchMetadata) from it and
every write with NOT_CONTROLLER naming the active controller, and campaigns for the
log's leadership (`controller.runtime.election`). The winner opens the log for writing
under its leadership, starts the driver from its standby image and serves; it steps
down (back to standby, closing the driver) when its leadership can no longer be trusted, or
an append is fenced or its outcome unknown. docs/ha.md has the whole story. Whatever
its role, a controller answers DescribeQuorum for itself (`controller.runtime.quorum`,
`metactl quorum describe`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec
import structlog

from controller.core import validation
from controller.core.authz import AUTHORIZATION_ERRORS, authorize, operation_of
from controller.core.config import ControllerConfig
from controller.core.lifecycle import Bootstrap, ElectPreferredGroup, add_up, needs_bootstrap
from controller.core.recovery.tracker import Inspection
from controller.core.step import LogInfoAnswers
from controller.core.work import WORK_BUDGET, PartitionPlan
from controller.runtime.admin_views import describe_configs, describe_features, list_reassignments
from controller.runtime.clock import Clock, SystemClock
from controller.runtime.describe import DescribeNotes, describe_page, partition_state
from controller.runtime.driver import Controller
from controller.runtime.metrics import ControllerMetrics, MetricsServer, RoleMetrics
from controller.runtime.quorum import describe_quorum
from controller.runtime.quota import MutationLimits, MutationQuota, requested_partitions
from controller.runtime.request_caps import (
    INT_BYTES,
    MAX_ALTER_PARTITION_ITEMS,
    MAX_CONFIG_ENTRIES,
    MAX_REASSIGNMENT_ITEMS,
    MAX_TOPICS_PER_REQUEST,
    assignment_bytes,
    check_answer,
    check_count,
    clip,
    result_bytes,
)
from controller.runtime.sessions import BrokerSessions
from controller.runtime.standby import Standby
from metactl.errors import (
    FatalStorageError,
    FrameTooLargeError,
    InvalidRequestError,
    LogClosedError,
    MetactlError,
    NotControllerError,
    OffsetOutOfRangeError,
    StaleBrokerEpochError,
    ThrottlingQuotaExceededError,
)
from metadata_image.image import ClusterImage, TopicPartition
from metadata_image.snapshot import ImageSnapshot
from metadata_image.transactions import LogReplay
from metadata_log.backends import is_etcd_url, open_store
from metadata_log.etcd import DEFAULT_LEASE_TTL_S
from metadata_log.etcd.tls import EtcdTls
from metadata_log.records import ELR_FEATURE
from metadata_log.store import LogStore
from protocol.client import RetryPolicy, RpcClient
from protocol.codec import DEFAULT_MAX_FRAME_BYTES
from protocol.messages import (
    Ack,
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartition,
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    AlterPartitionResult,
    AlterPartitions,
    AlterPartitionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicResponse,
    CreateTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopic,
    DeleteTopicResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeFeaturesRequest,
    DescribeQuorumRequest,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    ErrorResponse,
    FenceBroker,
    FetchedRecord,
    FetchMetadataRequest,
    FetchMetadataResponse,
    GetReplicaLogInfoRequest,
    GetReplicaLogInfoResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    Message,
    MetadataSnapshot,
    PartitionState,
    PartitionView,
    ReassignmentResult,
    RegisterBroker,
    RegisterBrokerResponse,
    ReplicaLogInfo,
    ReplicaRef,
    TopicResult,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
from protocol.server import FrameServer, Peer, ServerLimits
from protocol.tls import TlsIdentity, broker_principal

if TYPE_CHECKING:  # the etcd client library (and gRPC) loads only for an etcd log
    from controller.runtime.election import Election
    from metadata_log.etcd.lease import Leadership

log = structlog.get_logger("metactl.controller.service")

# GetReplicaLogInfo: up to 20 attempts, backoff capped at 2 s, while the broker stays
# active at the same epoch.
INSPECTION_RETRY = RetryPolicy(attempts=20, base_s=0.1, cap_s=2.0)
# Partitions per GetReplicaLogInfo request (and per LogInfoAnswers event): a quarter of
# the work budget, as each answer may decide a recovery (two records, a WARNING line):
# about 15 ms of step per batch at 300,000 partitions, where a whole budget took 60 ms.
INSPECTION_BATCH = WORK_BUDGET // 4
# Stepping down waits this long for in-flight commits (fenced ones fail at once).
STEP_DOWN_S = 10.0
# A single controller (SQLite) whose log stopped taking writes (FATAL_STORAGE_ERROR:
# an I/O error, a read-only file) steps down and tries to reopen the log this many
# times, this far apart, before the process exits with the error (Kafka's fault handler
# ends the process; issue 21 item 7).
STORAGE_REOPEN_ATTEMPTS = 3
STORAGE_REOPEN_BACKOFF_S = 1.0


@dataclass(frozen=True)
class HaSettings:
    """How a controller takes part in an etcd log's election (docs/ha.md)."""

    lease_ttl_s: int = DEFAULT_LEASE_TTL_S
    advertised_listener: str | None = None  # HOST:PORT clients are sent to; default: bound
    node_id: str | None = None  # the name in the leadership key; default: the address
    cluster_id: str | None = None  # checked against the log's (or given to a new log)
    etcd_tls: EtcdTls | None = None  # TLS to etcd (--etcd-cacert/--etcd-cert/--etcd-key)
    # A standby that finds the active controller's listener refusing connections ends
    # its term rather than wait out the TTL (controller.runtime.dead_active).
    dead_active_detection: bool = True


# Answers not measured against the frame limit on the way out: those measured as they
# are built (pages, fetches), and the small fixed ones of the hot path (a heartbeat's
# answer encoded twice would cost every broker's heartbeat for nothing).
_UNMEASURED: Final = (
    DescribeClusterResponse,
    ListPartitionReassignmentsResponse,
    FetchMetadataResponse,
    ErrorResponse,
    BrokerHeartbeatResponse,
    RegisterBrokerResponse,
    PartitionView,
    Ack,
)
# Bytes of a frame besides its body: the length header and the correlation id.
_FRAME_OVERHEAD: Final = 16
_encoder: Final = msgspec.msgpack.Encoder()


def _item_error(item: AlterPartition, exc: MetactlError) -> AlterPartitionResult:
    return AlterPartitionResult(
        topic=item.topic, partition=item.partition, error_code=exc.code, message=clip(exc.message)
    )


def _encoded_size(body: Message) -> int:
    return len(_encoder.encode(body)) + _FRAME_OVERHEAD


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
    ) -> None:
        self.data_dir = data_dir
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
        # KIP-599 controller mutation quota per principal, and the partitions-per-request
        # cap (controller/runtime/quota.py), for CreateTopics and ElectLeaders.
        self.mutation_limits = mutation_limits if mutation_limits is not None else MutationLimits()
        self.quota = MutationQuota.of(self.mutation_limits, self.clock)
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
        # Inspections waiting for their broker's inspecting task: (broker, epoch) -> them.
        self._inspections: dict[tuple[int, int], list[Inspection]] = {}
        # Authorization refusals are logged at most once per principal per period (the
        # counter has every one): principal -> (ms of its last line, refusals held since).
        self.refusal_log_period_ms = 1000
        self._refusal_lines: dict[str, tuple[int, int]] = {}

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
                await self._activate(store)
            except BaseException:
                await store.close()
                raise
            self._spawn(self._watch_storage(), "storage")
        if self.metrics_listen is not None:
            self.metrics_server = await MetricsServer.start(
                self.role_metrics.registry, self.metrics_listen, tls=self.tls
            )
            self.metrics_address = self.metrics_server.address
        if self.tls is None:
            log.warning("TLS is off (--insecure): any client can act as any broker or as an admin")
        self.server = FrameServer(
            self._dispatch,
            log=log,
            max_frame_bytes=self.max_frame_bytes,
            ssl=self.server_ssl,
            limits=self.limits,
        )
        self.address = await self.server.start(self.listen)
        self._spawn(self._session_loop(), "sessions")
        if self.replicated:
            from controller.runtime.election import Election  # loads the etcd client

            assert self.metadata_log is not None
            self.election = await Election.start(self, self.metadata_log, verify_all=verify_all)
            self._spawn(self.election.run(), "election")
        log.info(
            "controller serving",
            listen=self.address,
            metadata_log=self.metadata_log or str(self.data_dir),
            role=self.role,
            end_offset=self.store.end_offset if self.store is not None else None,
        )

    # --- roles ---------------------------------------------------------------------------

    @property
    def advertised(self) -> str:
        """The address other controllers' NOT_CONTROLLER answers send clients to."""
        return self.ha.advertised_listener or self.address

    async def _activate(
        self,
        store: LogStore,
        replayed: LogReplay | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        """Become the active controller on `store` (open for writing): start the driver
        (from `replayed`, a standby's image, when there is one), its metrics, and fresh
        broker sessions (every registered broker gets a full session timeout of grace)."""
        ctl = await Controller.open(
            store,
            config=self.config,
            clock=self.clock,
            replayed=replayed,
            work_budget=self.work_budget,
        )
        ctl.log_every_record = True
        ctl.inspection_sinks.append(self._on_inspection)
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

    async def _deactivate(self, reason: str) -> None:
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

    async def _watch_storage(self) -> None:
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
            await self._deactivate("the metadata log stopped taking writes")
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
                    await self._activate(reopened)
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

    async def _redirect(self) -> NotControllerError:
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
        return self._not_controller(problem)

    def _not_controller(self, problem: str | None = None) -> NotControllerError:
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

    # --- connections --------------------------------------------------------------------

    async def _dispatch(self, body: Message, peer: Peer) -> Message:
        if self.tls is not None:  # without TLS (`--insecure`) there is no principal to check
            try:
                authorize(peer.principal, body)  # before anything is submitted
            except AUTHORIZATION_ERRORS as exc:
                self._refused(peer, operation_of(body), exc)
                raise
        if isinstance(body, DescribeQuorumRequest):  # any role answers, never redirects
            return await describe_quorum(self, body)
        if not self.acting:
            match body:
                case FetchMetadataRequest():
                    return await self._fetch(body)
                case DescribeClusterRequest():
                    return self.describe(body)
            if not self.replicated and self.role != "active":
                # A single controller between a storage failure and its reopen or exit.
                raise FatalStorageError("the metadata log stopped taking writes; reopening it")
            raise await self._redirect()
        try:
            answer = await self._handle(body, peer)
        except (LogClosedError, FatalStorageError) as exc:
            if not self.replicated:
                raise
            # On etcd a store that stops taking writes means this controller steps down
            # (fenced by a newer term, or an append's outcome unknown): send the client on.
            if self.leader_hint == self.advertised:
                self.leader_hint = None
            raise self._not_controller() from exc
        if not isinstance(answer, _UNMEASURED):
            # The up-front caps keep every answer inside the frame limit; should one not
            # be (a bug), the client gets a named error, not a frame it cannot read.
            size = _encoded_size(answer)
            if size > self.max_frame_bytes:
                log.error(
                    "answer over the frame limit; refused",
                    request=type(body).__name__,
                    bytes=size,
                    limit=self.max_frame_bytes,
                )
                raise FrameTooLargeError(
                    f"the {type(answer).__name__} ({size:,} bytes) exceeds the "
                    f"{self.max_frame_bytes:,}-byte frame limit"
                )
        return answer

    async def _handle(self, body: Message, peer: Peer) -> Message:
        ctl = self.controller
        match body:
            case BrokerHeartbeatRequest():
                return await self._heartbeat(body)
            case FetchMetadataRequest():
                return await self._fetch(body)
            case RegisterBroker():
                r = await ctl.submit(body)
                assert isinstance(r, RegisterBrokerResponse)
                self.sessions.touch(body.broker_id, self.clock.now_ms())
                return r
            case AlterPartition():
                return await self._partition_request(body)
            case AlterPartitions():
                return await self._alter_partitions(body)
            case CreateTopicsRequest():
                return await self._create_topics(body, peer)
            case DescribeClusterRequest():
                return self.describe(body)
            case ElectLeader():
                return await self._elect(body, peer)
            case ElectPreferredLeaders():
                return await self._elect_preferred(body)
            case DeleteTopicsRequest():
                return await self._delete_topics(body)
            case CreatePartitionsRequest():
                return await self._create_partitions(body, peer)
            case AlterPartitionReassignments():
                return await self._reassign(body)
            case AlterConfigs() | UpdateFeature():
                if isinstance(body, AlterConfigs):
                    entries = len(body.set_configs) + len(body.delete_configs)
                    check_count("config entries", entries, MAX_CONFIG_ENTRIES)
                r = await ctl.submit(body)
                assert isinstance(r, AlterConfigsResponse | UpdateFeatureResponse)
                return r
            case UnregisterBroker():
                await ctl.submit(body)
                self.sessions.forget(body.broker_id)
                return Ack()
            case DescribeConfigsRequest():
                return describe_configs(ctl.committed_image, body, self.config)
            case DescribeFeaturesRequest():
                return describe_features(ctl.committed_image, self.config)
            case ListPartitionReassignmentsRequest():
                if body.topics is not None:
                    check_count("topics", len(body.topics), MAX_TOPICS_PER_REQUEST)
                return list_reassignments(ctl.committed_image, body, max_bytes=self.max_frame_bytes)
        raise InvalidRequestError(f"the controller does not handle {type(body).__name__}")

    async def _elect_preferred(self, body: ElectPreferredLeaders) -> ElectPreferredLeadersResponse:
        """A bulk preferred election, a work budget of partitions per event: each piece is
        its own event and commit, so heartbeats, AlterPartitions and describes go on in
        between (as KRaft balances leaders), and what was elected before a failover stays
        elected. Not charged to the mutation quota: it creates nothing (here the quota
        covers CreateTopics, CreatePartitions and single ElectLeaders). A named list (as
        long as a frame holds) is read a work budget at a time too, yielding between."""
        image = self.controller.committed_image
        budget = self.work_budget or WORK_BUDGET
        if body.partitions is None:
            plan = PartitionPlan(
                tuple(
                    (name, tuple(range(t.partitions))) for name, t in sorted(image.topics.items())
                )
            )
        else:
            grouped: dict[str, list[int]] = {}
            refs = body.partitions
            for start in range(0, len(refs), budget):
                if start:
                    await asyncio.sleep(0)  # heartbeats and describes go on
                for ref in refs[start : start + budget]:
                    validation.int32(ref.partition, "partition")
                    grouped.setdefault(ref.topic, []).append(ref.partition)
            plan = PartitionPlan(tuple((t, tuple(n)) for t, n in grouped.items()))
        total = ElectPreferredLeadersResponse()
        while not plan.done:
            groups, plan = plan.take_groups(budget)
            piece = await self.controller.submit(ElectPreferredGroup(tuple(groups)))
            assert isinstance(piece, ElectPreferredLeadersResponse)
            total = add_up(total, piece)
        return total

    async def _alter_partitions(self, body: AlterPartitions) -> AlterPartitionsResponse:
        """A broker's batched AlterPartition, a work budget of items per event: each
        piece is its own event and commit (the items are independent, as in Kafka), so
        heartbeats and describes go on between pieces, and a piece committed before a
        failover stays committed. Each item is answered once its piece is durable.

        A partition named again anywhere in the request is INVALID_REQUEST for every
        mention after the first. A piece that fails (the log stopped taking writes, this
        controller stepped down) leaves its outcome unknown: it and every later item are
        answered with that error, each item on its own, while the pieces committed before
        it keep their answers, so that the broker goes on counting the ISRs it proposed
        until its metadata shows what was committed (never a whole-request error for
        items that are in fact committed)."""
        items = body.items
        check_count("AlterPartition items", len(items), MAX_ALTER_PARTITION_ITEMS)
        # Each answer: the item's names, a clipped message, and its view (the names again
        # and the ISR asked for).
        check_answer(
            "AlterPartitions",
            (2 * result_bytes(i.topic) + INT_BYTES * len(i.isr) for i in items),
            self.max_frame_bytes,
        )
        budget = self.work_budget or WORK_BUDGET
        results: list[AlterPartitionResult | None] = [None] * len(items)
        seen: set[tuple[str, int]] = set()
        send: list[int] = []
        for i, item in enumerate(items):
            key = (item.topic, item.partition)
            if key in seen:
                results[i] = _item_error(item, InvalidRequestError("named twice in one request"))
            else:
                seen.add(key)
                send.append(i)
        for start in range(0, len(send), budget):
            piece = send[start : start + budget]
            try:
                answer = await self.controller.submit(
                    AlterPartitions(items=[items[i] for i in piece])
                )
            except MetactlError as exc:
                error = (
                    self._not_controller()
                    if self.replicated and isinstance(exc, LogClosedError | FatalStorageError)
                    else exc
                )
                for i in send[start:]:
                    results[i] = _item_error(items[i], error)
                break
            assert isinstance(answer, AlterPartitionsResponse)
            for i, result in zip(piece, answer.results, strict=True):
                results[i] = (
                    msgspec.structs.replace(result, message=clip(result.message))
                    if len(result.message) > 64
                    else result
                )
        return AlterPartitionsResponse(results=[r for r in results if r is not None])

    async def _delete_topics(self, body: DeleteTopicsRequest) -> DeleteTopicsResponse:
        """Each topic alone, in order (Kafka's per-topic errors); the log failing fails
        the whole request, which the client retries. At most MAX_TOPICS_PER_REQUEST."""
        check_count("topics", len(body.topics), MAX_TOPICS_PER_REQUEST)
        check_answer("DeleteTopics", map(result_bytes, body.topics), self.max_frame_bytes)
        results: list[TopicResult] = []
        for name in body.topics:
            try:
                r = await self.controller.submit(DeleteTopic(name=name))
            except (LogClosedError, FatalStorageError):
                raise
            except MetactlError as exc:
                results.append(
                    TopicResult(name=name, error_code=exc.code, message=clip(exc.message))
                )
                continue
            assert isinstance(r, DeleteTopicResponse)
            results.append(TopicResult(name=name, topic_id=r.topic_id))
        return DeleteTopicsResponse(results=results)

    async def _create_partitions(
        self, body: CreatePartitionsRequest, peer: Peer
    ) -> CreatePartitionsResponse:
        """Each topic alone, in order, under the principal's mutation quota (charged the
        partitions it adds, given back if the core refuses). At most
        MAX_TOPICS_PER_REQUEST topics, adding at most the partitions-per-request cap in all
        (each topic within it alone was all Kafka asks; in all, so that one request's
        answer and work stay bounded)."""
        image = self.controller.committed_image
        check_count("topics", len(body.topics), MAX_TOPICS_PER_REQUEST)
        adds: list[tuple[int, int]] = []  # per topic: partitions added, replication factor
        for spec in body.topics:
            t = image.topics.get(spec.topic)
            adding = max(0, spec.count - t.partitions) if t is not None else 0
            rf = max(map(len, spec.assignments), default=0) if spec.assignments else 0
            if not rf and t is not None and t.partitions:
                p = image.partitions.get((spec.topic, 0))
                rf = len(p.replicas) if p is not None else 0
            adds.append((adding, rf))
        # A topic over the cap on its own is refused alone, below, and adds nothing.
        cap = self.mutation_limits.max_partitions_per_request
        self.mutation_limits.check_request(sum(a for a, _ in adds if a <= cap))
        check_answer(
            "CreatePartitionsBatch",
            (
                result_bytes(spec.topic) + assignment_bytes(adding, rf)
                for spec, (adding, rf) in zip(body.topics, adds, strict=True)
            ),
            self.max_frame_bytes,
        )
        results: list[CreateTopicResult] = []
        for spec in body.topics:
            t = image.topics.get(spec.topic)
            adding = max(0, spec.count - t.partitions) if t is not None else 0
            try:
                self.mutation_limits.check_request(adding)
                self.quota.acquire(peer.name, adding)
            except MetactlError as exc:
                results.append(
                    CreateTopicResult(
                        name=spec.topic, error_code=exc.code, message=clip(exc.message)
                    )
                )
                continue
            try:
                r = await self.controller.submit(spec)
            except (LogClosedError, FatalStorageError):
                self.quota.release(peer.name, adding)
                raise
            except MetactlError as exc:
                self.quota.release(peer.name, adding)
                results.append(
                    CreateTopicResult(
                        name=spec.topic, error_code=exc.code, message=clip(exc.message)
                    )
                )
                continue
            assert isinstance(r, CreateTopicResponse)
            results.append(
                CreateTopicResult(
                    name=spec.topic,
                    topic_id=r.topic_id,
                    assignments=r.assignments,  # the new partitions'
                )
            )
        return CreatePartitionsResponse(results=results)

    def _refused(self, peer: Peer, operation: str, exc: MetactlError) -> None:
        """Count an authorization refusal, and log it unless this principal already had
        a line within `refusal_log_period_ms` (an attacker cannot flood the log; the
        next line's `count` includes the refusals held back)."""
        principal = peer.principal if peer.principal is not None else "-"
        if self.metrics is not None:  # a standby logs refusals only
            self.metrics.authorization_failures.labels(
                principal=principal, operation=operation
            ).inc()
        now = self.clock.now_ms()
        last = self._refusal_lines.get(principal)
        if last is not None and now - last[0] < self.refusal_log_period_ms:
            self._refusal_lines[principal] = (last[0], last[1] + 1)
            return
        self._refusal_lines[principal] = (now, 0)
        log.warning(
            "authorization failed",
            principal=principal,
            operation=operation,
            code=exc.code,
            peer=peer.address,
            error=exc.message,
            count=1 + (last[1] if last is not None else 0),
        )

    async def _partition_request(self, request: AlterPartition | ElectLeader) -> PartitionState:
        """Submit a request answered with one partition's committed state."""
        ctl = self.controller
        v = await ctl.submit(request)
        assert isinstance(v, PartitionView)
        return partition_state(ctl.committed_image.partitions[(v.topic, v.partition)])

    async def _create_topics(self, body: CreateTopicsRequest, peer: Peer) -> CreateTopicsResponse:
        """The partitions-per-request cap (POLICY_VIOLATION), then each topic under the
        principal's mutation quota, in order, before anything is submitted. A refusal
        before the first topic refuses the request (THROTTLING_QUOTA_EXCEEDED with a
        throttle time); a later one refuses that topic and the rest (Kafka's strict
        mode). A topic the core refuses is not charged."""
        ctl = self.controller
        check_count("topics", len(body.topics), MAX_TOPICS_PER_REQUEST)
        counts = [requested_partitions(s, self.config.default_partitions) for s in body.topics]
        self.mutation_limits.check_request(sum(counts))
        check_answer(
            "CreateTopics",
            (
                result_bytes(spec.name) + assignment_bytes(n, self._replication_factor(spec))
                for spec, n in zip(body.topics, counts, strict=True)
            ),
            self.max_frame_bytes,
        )
        results: list[CreateTopicResult] = []
        for spec, partitions in zip(body.topics, counts, strict=True):
            try:
                self.quota.acquire(peer.name, partitions)
            except ThrottlingQuotaExceededError as exc:
                if not results:
                    raise
                results.append(
                    CreateTopicResult(
                        name=spec.name, error_code=exc.code, message=clip(exc.message)
                    )
                )
                continue
            try:
                r = await ctl.submit(spec)
            except (LogClosedError, FatalStorageError):
                self.quota.release(peer.name, partitions)
                raise  # the log, not the topic: the whole request fails (and is retried)
            except MetactlError as exc:
                self.quota.release(peer.name, partitions)
                results.append(
                    CreateTopicResult(
                        name=spec.name, error_code=exc.code, message=clip(exc.message)
                    )
                )
                continue
            assert isinstance(r, CreateTopicResponse)
            results.append(
                CreateTopicResult(name=spec.name, topic_id=r.topic_id, assignments=r.assignments)
            )
        return CreateTopicsResponse(results=results)

    def _replication_factor(self, spec: CreateTopic) -> int:
        """The most replicas a partition of `spec` gets (for its answer's bound)."""
        if spec.assignments is not None:
            return max(map(len, spec.assignments), default=0)
        if spec.replication_factor is not None:
            return spec.replication_factor
        return self.config.default_replication_factor

    async def _reassign(
        self, body: AlterPartitionReassignments
    ) -> AlterPartitionReassignmentsResponse:
        """At most MAX_REASSIGNMENT_ITEMS partitions, and an answer that fits the frame
        limit, checked before anything is submitted; then the core validates the request
        and reassigns a work budget per slice (`ReassignSlice`), each partition alone."""
        items = body.reassignments
        check_count("partitions to reassign", len(items), MAX_REASSIGNMENT_ITEMS)
        check_answer(
            "AlterPartitionReassignments",
            (result_bytes(r.topic) for r in items),
            self.max_frame_bytes,
        )
        r = await self.controller.submit(body)
        assert isinstance(r, AlterPartitionReassignmentsResponse)
        if any(len(x.message) > 64 for x in r.results):
            r = AlterPartitionReassignmentsResponse(
                results=[
                    x
                    if len(x.message) <= 64
                    else ReassignmentResult(
                        topic=x.topic,
                        partition=x.partition,
                        error_code=x.error_code,
                        message=clip(x.message),
                    )
                    for x in r.results
                ]
            )
        return r

    async def _elect(self, body: ElectLeader, peer: Peer) -> PartitionState:
        """One partition changed: one unit of the principal's mutation quota, given back
        if the core refuses the election."""
        self.quota.acquire(peer.name, 1)
        try:
            return await self._partition_request(body)
        except MetactlError:
            self.quota.release(peer.name, 1)
            raise

    def describe(self, request: DescribeClusterRequest | None = None) -> DescribeClusterResponse:
        """One page (v2) or the whole answer (v1), from the committed image as it is now:
        nothing is shown before it is durable, and a page never mixes two images (it is
        built without awaiting). Pages are sized to the smaller of this service's frame
        limit and the client's `max_bytes`."""
        request = request if request is not None else DescribeClusterRequest()
        max_bytes = self.max_frame_bytes
        if request.max_bytes is not None:
            max_bytes = min(max_bytes, request.max_bytes)
        if not self.acting:
            # A standby's image; just after stepping down (etcd may be unreachable, so no
            # standby yet) the last term's committed image: reads keep answering.
            if self.standby is not None:
                image, committed = self.standby.image, self.standby.store.end_offset
            elif self.last_image is not None:
                image, committed = self.last_image, self.last_image.end_offset
            else:
                raise self._not_controller()
            return describe_page(
                image,
                request,
                max_bytes=max_bytes,
                end_offset=image.end_offset,
                committed_offset=committed,
                recovery_pending=lambda tp: None,
                heartbeat_age_ms=lambda b: None,
                now_ms=self.clock.now_ms(),  # the image's last recoveries, with their age
            )
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

        return describe_page(
            ctl.committed_image,
            request,
            max_bytes=max_bytes,
            end_offset=ctl.image.end_offset,
            committed_offset=self.store.end_offset,
            recovery_pending=pending,
            heartbeat_age_ms=age,
            notes=self.notes,
            now_ms=now,
        )

    # --- broker sessions ----------------------------------------------------------------

    async def _heartbeat(self, req: BrokerHeartbeatRequest) -> BrokerHeartbeatResponse:
        """The rule (controlled shutdown, unfence once caught up) is the core's; the
        session clock is ours, touched only for a heartbeat the core accepted."""
        r = await self.controller.submit(req)
        assert isinstance(r, BrokerHeartbeatResponse)
        self.sessions.touch(req.broker_id, self.clock.now_ms())
        return r

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

    # --- metadata fetch -----------------------------------------------------------------

    async def _fetch(self, req: FetchMetadataRequest) -> FetchMetadataResponse:
        store = self.store if self.acting else (self.standby.store if self.standby else None)
        if store is None:
            raise self._not_controller()
        if req.from_offset < store.start_offset:
            snap = await store.load_snapshot(ImageSnapshot)
            if snap is None:
                raise OffsetOutOfRangeError(f"offset {req.from_offset} is no longer retained")
            answer = FetchMetadataResponse(
                records=[],
                end_offset=store.end_offset,
                snapshot=MetadataSnapshot(offset=snap[0], records=snap[1].all_records()),
            )
            size = _encoded_size(answer)
            if size > self.max_frame_bytes:
                # Not paged (yet): a named refusal rather than a frame the broker
                # cannot read.
                raise FrameTooLargeError(
                    f"the snapshot at offset {snap[0]} ({size:,} bytes) exceeds the "
                    f"{self.max_frame_bytes:,}-byte frame limit"
                )
            return answer
        if req.from_offset > store.end_offset:
            raise OffsetOutOfRangeError(
                f"offset {req.from_offset} is beyond the committed end {store.end_offset}"
            )
        if req.from_offset == store.end_offset and req.max_wait_ms > 0:
            await store.wait_for(req.from_offset, timeout=min(req.max_wait_ms, 10_000) / 1000)
        entries = await store.read(req.from_offset, max(1, min(req.max_records, 50_000)))
        records = [FetchedRecord(e.offset, e.timestamp_ms, e.record) for e in entries]
        while True:
            answer = FetchMetadataResponse(records=records, end_offset=store.end_offset)
            if len(records) <= 1 or _encoded_size(answer) <= self.max_frame_bytes:
                break
            # As many records as fit a frame (at least one): the broker fetches on.
            records = records[: len(records) // 2]
        if len(records) == 1 and _encoded_size(answer) > self.max_frame_bytes:
            raise FrameTooLargeError(
                f"the record at offset {records[0].offset} exceeds the "
                f"{self.max_frame_bytes:,}-byte frame limit on its own"
            )
        return answer

    # --- unclean recovery: GetReplicaLogInfo --------------------------------------------

    def _on_inspection(self, inspection: Inspection) -> None:
        """Queue an inspection; one task per broker incarnation asks for them in batches
        (a million partitions recovering after an outage are a thousand requests, not a
        million connections)."""
        key = (inspection.broker_id, inspection.broker_epoch)
        queued = self._inspections.get(key)
        if queued is not None:
            queued.append(inspection)
            return
        self._inspections[key] = [inspection]
        self._spawn(self._inspect_queued(key), f"inspect-{inspection.broker_id}")

    async def _inspect_queued(self, key: tuple[int, int]) -> None:
        try:
            while queued := self._inspections.get(key):
                await asyncio.sleep(0)  # inspections decided in the same turn join in
                batch = queued[:INSPECTION_BATCH]
                del queued[:INSPECTION_BATCH]
                await self._inspect(*batch)
        finally:
            self._inspections.pop(key, None)

    async def _inspect(self, *asked: Inspection) -> None:
        """Ask a broker for its replicas' log ends (one request; every inspection names
        the same broker and epoch). The client retries retriable failures with backoff
        while the broker stays active at the inspected epoch (its endpoint is fixed for
        that epoch); any other error ends the inspection. A recovery that needs the answer
        again asks again: a revert restarts pending recoveries. The answers reach the
        core as one event."""
        ctl = self.controller
        insp = asked[0]
        wanted = {(i.topic, i.partition) for i in asked}

        def still_wanted() -> bool:
            b = ctl.image.broker(insp.broker_id)
            return b is not None and b.epoch == insp.broker_epoch and b.active

        b = ctl.image.broker(insp.broker_id)
        if b is None or not b.endpoint or not still_wanted():
            return
        request = GetReplicaLogInfoRequest(
            broker_id=insp.broker_id,
            broker_epoch=insp.broker_epoch,
            partitions=[ReplicaRef(i.topic, i.partition) for i in asked],
        )
        try:
            async with RpcClient(
                b.endpoint,
                max_frame_bytes=self.max_frame_bytes,
                retry=INSPECTION_RETRY,
                ssl=self.client_ssl,
                expect_principal=broker_principal(insp.broker_id) if self.tls else None,
            ) as client:
                resp = await client.request(request, timeout_s=10, still_wanted=still_wanted)
            if not isinstance(resp, GetReplicaLogInfoResponse):
                raise InvalidRequestError(f"unexpected {type(resp).__name__}")
            if resp.broker_id != insp.broker_id:
                # The endpoint proved broker-<id> (expect_principal) but answers for
                # another broker: an answer is only ever taken for the broker asked.
                log.warning(
                    "replica log info refused: the answer names another broker",
                    broker=insp.broker_id,
                    answered_for=resp.broker_id,
                )
                return
            answers: list[ReplicaLogInfo] = []
            for entry in resp.partitions:
                if (entry.topic, entry.partition) not in wanted:
                    log.warning(
                        "replica log info refused: a partition that was not asked",
                        broker=insp.broker_id,
                        partition=f"{entry.topic}-{entry.partition}",
                    )
                    continue
                if entry.error_code is not None:
                    log.warning(
                        "replica log info error", broker=insp.broker_id, code=entry.error_code
                    )
                    continue
                answers.append(
                    ReplicaLogInfo(
                        broker_id=resp.broker_id,
                        broker_epoch=resp.broker_epoch,
                        topic=entry.topic,
                        partition=entry.partition,
                        last_leader_epoch=entry.last_leader_epoch,
                        log_end_offset=entry.log_end_offset,
                    )
                )
            if answers:
                await ctl.submit(LogInfoAnswers(tuple(answers)))
        except StaleBrokerEpochError as exc:
            log.warning("replica log info rejected: stale broker epoch", error=exc.message)
        except MetactlError as exc:
            log.warning("replica log info failed; giving up", broker=insp.broker_id, error=str(exc))
