"""The controller's API handlers: one entry every listener calls with an admitted
request (`ControllerApis.handle`), and the handlers of the brokers' APIs and the reads.

`handle` answers DescribeQuorum in any role (`controller.runtime.quorum`), and otherwise
asks the service's role (`ServingRole`): a controller that is not acting answers reads
(DescribeCluster, FetchMetadata) from its standby image (or its last term's) and every
write with NOT_CONTROLLER naming the active controller (`redirect`); a single controller
between a storage failure and its reopen answers FATAL_STORAGE_ERROR. On the acting
controller each request goes to its handler: the brokers' APIs here (registration and
heartbeats, which keep the broker's session; AlterPartition(s), a work budget of items
per event, each answered once its piece is durable; metadata fetches, long-polled over
committed records, as many as fit a frame, the last answer kept for the next tailer that
asks for the same records at the same committed end), the reads (DescribeCluster page
by page, `controller.runtime.describe`; configs, features and reassignments,
`controller.runtime.admin_views`), and the admin writes in `controller.runtime.admin_apis`.
On etcd, a write whose log stopped taking writes (this controller is stepping down) is
answered NOT_CONTROLLER, so that the client goes on to the next active controller.

Every decision is the pure core's, through `Controller.submit`. Must not: authorize (the
listener admits first: `controller.runtime.admission`), change the service's role, or
know the wire a request came in on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec

from controller.core.config import ControllerConfig
from controller.core.work import WORK_BUDGET
from controller.runtime.admin_apis import AdminApis
from controller.runtime.admin_views import describe_configs, describe_features, list_reassignments
from controller.runtime.admission import RequestAdmission, enveloped_peer
from controller.runtime.clock import Clock
from controller.runtime.describe import DescribeNotes, describe_page
from controller.runtime.driver import Controller
from controller.runtime.request_caps import (
    INT_BYTES,
    MAX_ALTER_PARTITION_ITEMS,
    MAX_CONFIG_ENTRIES,
    MAX_TOPICS_PER_REQUEST,
    check_answer,
    check_count,
    clip,
    encoded_size,
    result_bytes,
)
from controller.runtime.service_role import ServiceRole
from controller.runtime.sessions import BrokerSessions
from metactl.errors import (
    FatalStorageError,
    FrameTooLargeError,
    InvalidRequestError,
    LogClosedError,
    MetactlError,
    NotControllerError,
    OffsetOutOfRangeError,
)
from metadata_image.snapshot import ImageSnapshot
from metadata_image.state import TopicPartition
from metadata_log.store import LogStore
from protocol.admission import Peer
from protocol.messages.admin import (
    AlterConfigs,
    AlterConfigsResponse,
    AlterPartitionReassignments,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeFeaturesRequest,
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    ElectLeader,
    ElectPreferredLeaders,
    Envelope,
    ListPartitionReassignmentsRequest,
    UnregisterBroker,
    UpdateFeature,
    UpdateFeatureResponse,
)
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
    MetadataSnapshot,
    RegisterBroker,
    RegisterBrokerResponse,
)
from protocol.messages.internal import Ack
from protocol.messages.plan import PlanRestartRequest, PlanRollRequest
from protocol.messages.unions import Message

__all__ = ["ControllerApis", "ServingRole"]


class ServingRole(ServiceRole, Protocol):
    """What the API handlers read of their service's role
    (`controller.runtime.service.ControllerService` is one)."""

    @property
    def controller(self) -> Controller:
        """The active term's driver (only while active)."""
        ...

    @property
    def sessions(self) -> BrokerSessions: ...

    async def redirect(self) -> NotControllerError:
        """NOT_CONTROLLER for a write to a controller that is not acting."""
        ...

    def not_controller(self, problem: str | None = None) -> NotControllerError: ...

    def stepping_down(self) -> NotControllerError:
        """NOT_CONTROLLER for a write whose log stopped taking writes (on etcd)."""
        ...


def _item_error(item: AlterPartition, exc: MetactlError) -> AlterPartitionResult:
    return AlterPartitionResult(
        topic=item.topic, partition=item.partition, error_code=exc.code, message=clip(exc.message)
    )


class ControllerApis:
    """Every API of one controller service, whatever listener a request came in on."""

    def __init__(
        self,
        role: ServingRole,
        *,
        admission: RequestAdmission,
        describe_quorum: Callable[[DescribeQuorumRequest], Awaitable[DescribeQuorumResponse]],
        config: ControllerConfig,
        clock: Clock,
        notes: DescribeNotes,
        max_frame_bytes: int,
        work_budget: int | None,
    ) -> None:
        self.role = role
        self.describe_quorum = describe_quorum
        self.config = config
        self.clock = clock
        # What describe shows beyond the image (last unclean recoveries, fence reasons).
        self.notes = notes
        self.max_frame_bytes = max_frame_bytes
        self.work_budget = work_budget
        # The last answer to a metadata fetch, by store and (from offset, record limit,
        # committed end): every tailer asks for the same records after each commit.
        self._fetched: tuple[LogStore, tuple[int, int, int], FetchMetadataResponse] | None = None
        self.admin = AdminApis(
            lambda: role.controller,
            admission=admission,
            config=config,
            max_frame_bytes=max_frame_bytes,
            work_budget=work_budget,
        )

    async def handle(self, body: Message, peer: Peer) -> Message:
        """Answer an admitted request (any role answers DescribeQuorum; a controller that
        is not acting answers reads and redirects writes). An Envelope's inner request is
        handled as its client's (the listener admitted both); its answer goes back as is."""
        if isinstance(body, Envelope):
            return await self.handle(body.request, enveloped_peer(body, peer))
        if isinstance(body, DescribeQuorumRequest):  # any role answers, never redirects
            return await self.describe_quorum(body)
        role = self.role
        if not role.acting:
            match body:
                case FetchMetadataRequest():
                    return await self.fetch(body)
                case DescribeClusterRequest():
                    return self.describe(body)
            if not role.replicated and role.role != "active":
                # A single controller between a storage failure and its reopen or exit.
                raise FatalStorageError("the metadata log stopped taking writes; reopening it")
            raise await role.redirect()
        try:
            if type(body) is BrokerHeartbeatRequest:  # every broker's, every interval
                return await self.heartbeat(body)
            return await self._route(body, peer)
        except (LogClosedError, FatalStorageError) as exc:
            if not role.replicated:
                raise
            # On etcd a store that stops taking writes means this controller steps down
            # (fenced by a newer term, or an append's outcome unknown): send the client on.
            raise role.stepping_down() from exc

    async def _route(self, body: Message, peer: Peer) -> Message:
        """One admitted request on the acting controller, to its handler."""
        ctl = self.role.controller
        match body:
            case BrokerHeartbeatRequest():
                return await self.heartbeat(body)
            case FetchMetadataRequest():
                return await self.fetch(body)
            case RegisterBroker():
                r = await ctl.submit(body)
                assert isinstance(r, RegisterBrokerResponse)
                self.role.sessions.touch(body.broker_id, self.clock.now_ms())
                return r
            case AlterPartition():
                return await self.admin.partition_request(body)
            case AlterPartitions():
                return await self.alter_partitions(body)
            case CreateTopicsRequest():
                return await self.admin.create_topics(body, peer)
            case DescribeClusterRequest():
                return self.describe(body)
            case ElectLeader():
                return await self.admin.elect(body, peer)
            case ElectPreferredLeaders():
                return await self.admin.elect_preferred(body)
            case DeleteTopicsRequest():
                return await self.admin.delete_topics(body)
            case CreatePartitionsRequest():
                return await self.admin.create_partitions(body, peer)
            case AlterPartitionReassignments():
                return await self.admin.reassign(body)
            case AlterConfigs() | UpdateFeature():
                if isinstance(body, AlterConfigs):
                    entries = len(body.set_configs) + len(body.delete_configs)
                    check_count("config entries", entries, MAX_CONFIG_ENTRIES)
                r = await ctl.submit(body)
                assert isinstance(r, AlterConfigsResponse | UpdateFeatureResponse)
                return r
            case UnregisterBroker():
                await ctl.submit(body)
                self.role.sessions.forget(body.broker_id)
                return Ack()
            case DescribeConfigsRequest():
                return describe_configs(ctl.committed_image, body, self.config)
            case DescribeFeaturesRequest():
                return describe_features(ctl.committed_image, self.config)
            case ListPartitionReassignmentsRequest():
                if body.topics is not None:
                    check_count("topics", len(body.topics), MAX_TOPICS_PER_REQUEST)
                return list_reassignments(ctl.committed_image, body, max_bytes=self.max_frame_bytes)
            case PlanRestartRequest() | PlanRollRequest():
                return await self.admin.plan(body, self.clock.now_ms())
        raise InvalidRequestError(f"the controller does not handle {type(body).__name__}")

    async def alter_partitions(self, body: AlterPartitions) -> AlterPartitionsResponse:
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
                answer = await self.role.controller.submit(
                    AlterPartitions(items=[items[i] for i in piece])
                )
            except MetactlError as exc:
                error = (
                    self.role.not_controller()
                    if self.role.replicated and isinstance(exc, LogClosedError | FatalStorageError)
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

    def describe(self, request: DescribeClusterRequest | None = None) -> DescribeClusterResponse:
        """One page (v2) or the whole answer (v1), from the committed image as it is now:
        nothing is shown before it is durable, and a page never mixes two images (it is
        built without awaiting). Pages are sized to the smaller of this service's frame
        limit and the client's `max_bytes`."""
        request = request if request is not None else DescribeClusterRequest()
        max_bytes = self.max_frame_bytes
        if request.max_bytes is not None:
            max_bytes = min(max_bytes, request.max_bytes)
        role = self.role
        if not role.acting:
            # A standby's image; just after stepping down (etcd may be unreachable, so no
            # standby yet) the last term's committed image: reads keep answering.
            if role.standby is not None:
                image, committed = role.standby.image, role.standby.store.end_offset
            elif role.last_image is not None:
                image, committed = role.last_image, role.last_image.end_offset
            else:
                raise role.not_controller()
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
        ctl = role.controller
        assert role.store is not None
        now = self.clock.now_ms()

        def pending(tp: TopicPartition) -> list[int] | None:
            if tp not in ctl.image.partitions:
                return None
            return ctl.tracker.awaited(ctl.image, tp, ctl.policies)

        def age(broker_id: int) -> int | None:
            last = role.sessions.last_heartbeat_ms(broker_id)
            return None if last is None else now - last

        return describe_page(
            ctl.committed_image,
            request,
            max_bytes=max_bytes,
            end_offset=ctl.image.end_offset,
            committed_offset=role.store.end_offset,
            recovery_pending=pending,
            heartbeat_age_ms=age,
            notes=self.notes,
            now_ms=now,
        )

    async def heartbeat(self, req: BrokerHeartbeatRequest) -> BrokerHeartbeatResponse:
        """The rule (controlled shutdown, unfence once caught up) is the core's; the
        session clock is ours, touched only for a heartbeat the core accepted."""
        r = await self.role.controller.submit(req)
        assert isinstance(r, BrokerHeartbeatResponse)
        self.role.sessions.touch(req.broker_id, self.clock.now_ms())
        return r

    async def fetch(self, req: FetchMetadataRequest) -> FetchMetadataResponse:
        role = self.role
        store = role.store if role.acting else (role.standby.store if role.standby else None)
        if store is None:
            raise role.not_controller()
        if req.from_offset < store.start_offset:
            snap = await store.load_snapshot(ImageSnapshot)
            if snap is None:
                raise OffsetOutOfRangeError(f"offset {req.from_offset} is no longer retained")
            answer = FetchMetadataResponse(
                records=[],
                end_offset=store.end_offset,
                snapshot=MetadataSnapshot(offset=snap[0], records=snap[1].all_records()),
            )
            size = encoded_size(answer)
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
        limit = max(1, min(req.max_records, 50_000))
        key = (req.from_offset, limit, store.end_offset)
        last = self._fetched
        if last is not None and last[0] is store and last[1] == key and not store.closed:
            # The same committed records again (the next tailer after a commit): read,
            # decoded, checked and sized once. The end offset is part of the key, so an
            # answer is never older than the log it names.
            return last[2]
        entries = await store.read(req.from_offset, limit)
        records = [FetchedRecord(e.offset, e.timestamp_ms, e.record) for e in entries]
        while True:
            answer = FetchMetadataResponse(records=records, end_offset=store.end_offset)
            if len(records) <= 1 or encoded_size(answer) <= self.max_frame_bytes:
                break
            # As many records as fit a frame (at least one): the broker fetches on.
            records = records[: len(records) // 2]
        if len(records) == 1 and encoded_size(answer) > self.max_frame_bytes:
            raise FrameTooLargeError(
                f"the record at offset {records[0].offset} exceeds the "
                f"{self.max_frame_bytes:,}-byte frame limit on its own"
            )
        if records:
            self._fetched = (store, key, answer)
        return answer
