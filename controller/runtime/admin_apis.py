"""The controller's admin writes: CreateTopics, CreatePartitions, DeleteTopics,
ElectLeaders (one partition, or preferred in bulk) and AlterPartitionReassignments; and
the one read that costs seconds, the maintenance pre-flight's plans (PlanRestart,
PlanRoll), made off the event loop (`AdminApis.plan`).

Each is bounded before anything is submitted (`controller.runtime.request_caps`: an item
cap, and a bound on its answer against the frame limit), charges what it creates or
moves to the principal's mutation quota and the partitions-per-request cap
(`controller.runtime.admission`), and submits to the active controller's driver a topic,
a partition or a work budget at a time, each its own event and commit, so that heartbeats
and describes go on in between. A topic the core refuses is answered alone and not
charged; the log failing fails the whole request, which the client retries.
`controller.runtime.apis` routes to these once the listener admitted the request and
this controller is acting.

Must not: decide metadata (the core does), or answer for a controller that is not active.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controller.core import validation
from controller.core.config import ControllerConfig
from controller.core.lifecycle import ElectPreferredGroup, add_up
from controller.core.work import WORK_BUDGET, PartitionPlan
from controller.runtime.admin_views import plan_answer
from controller.runtime.admission import RequestAdmission
from controller.runtime.describe import partition_state
from controller.runtime.driver import Controller
from controller.runtime.quota import requested_partitions
from controller.runtime.request_caps import (
    MAX_REASSIGNMENT_ITEMS,
    MAX_TOPICS_PER_REQUEST,
    assignment_bytes,
    check_answer,
    check_count,
    clip,
    result_bytes,
)
from metactl.errors import (
    FatalStorageError,
    LogClosedError,
    MetactlError,
    ThrottlingQuotaExceededError,
)
from protocol.admission import Peer
from protocol.messages.admin import (
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopic,
    CreateTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopic,
    DeleteTopicResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    PartitionState,
    ReassignmentResult,
    TopicResult,
)
from protocol.messages.broker_controller import AlterPartition, PartitionView
from protocol.messages.internal import CreateTopicResponse
from protocol.messages.plan import (
    PlanRestartRequest,
    PlanRestartResponse,
    PlanRollRequest,
    PlanRollResponse,
)

__all__ = ["AdminApis"]


class AdminApis:
    """The admin writes of one controller service, against its active driver."""

    def __init__(
        self,
        controller: Callable[[], Controller],
        *,
        admission: RequestAdmission,
        config: ControllerConfig,
        max_frame_bytes: int,
        work_budget: int | None,
    ) -> None:
        self._controller = controller  # the active term's driver
        self.admission = admission
        self.config = config
        self.max_frame_bytes = max_frame_bytes
        # Partitions per controller event (controller.core.work): bulk work is sliced.
        self.work_budget = work_budget
        # One plan at a time (each is up to seconds of CPU in a thread): others wait.
        self._planning = asyncio.Semaphore(1)

    async def elect(self, body: ElectLeader, peer: Peer) -> PartitionState:
        """One partition changed: one unit of the principal's mutation quota, given back
        if the core refuses the election."""
        self.admission.quota.acquire(peer.name, 1)
        try:
            return await self.partition_request(body)
        except MetactlError:
            self.admission.quota.release(peer.name, 1)
            raise

    async def elect_preferred(self, body: ElectPreferredLeaders) -> ElectPreferredLeadersResponse:
        """A bulk preferred election, a work budget of partitions per event: each piece is
        its own event and commit, so heartbeats, AlterPartitions and describes go on in
        between (as KRaft balances leaders), and what was elected before a failover stays
        elected. Not charged to the mutation quota: it creates nothing (here the quota
        covers CreateTopics, CreatePartitions and single ElectLeaders). A named list (as
        long as a frame holds) is read a work budget at a time too, yielding between."""
        image = self._controller().committed_image
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
            piece = await self._controller().submit(ElectPreferredGroup(tuple(groups)))
            assert isinstance(piece, ElectPreferredLeadersResponse)
            total = add_up(total, piece)
        return total

    async def delete_topics(self, body: DeleteTopicsRequest) -> DeleteTopicsResponse:
        """Each topic alone, in order (Kafka's per-topic errors); the log failing fails
        the whole request, which the client retries. At most MAX_TOPICS_PER_REQUEST."""
        check_count("topics", len(body.topics), MAX_TOPICS_PER_REQUEST)
        check_answer("DeleteTopics", map(result_bytes, body.topics), self.max_frame_bytes)
        results: list[TopicResult] = []
        for name in body.topics:
            try:
                r = await self._controller().submit(DeleteTopic(name=name))
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

    async def create_partitions(
        self, body: CreatePartitionsRequest, peer: Peer
    ) -> CreatePartitionsResponse:
        """Each topic alone, in order, under the principal's mutation quota (charged the
        partitions it adds, given back if the core refuses). At most
        MAX_TOPICS_PER_REQUEST topics, adding at most the partitions-per-request cap in all
        (each topic within it alone was all Kafka asks; in all, so that one request's
        answer and work stay bounded)."""
        image = self._controller().committed_image
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
        cap = self.admission.mutation_limits.max_partitions_per_request
        self.admission.mutation_limits.check_request(sum(a for a, _ in adds if a <= cap))
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
                self.admission.mutation_limits.check_request(adding)
                self.admission.quota.acquire(peer.name, adding)
            except MetactlError as exc:
                results.append(
                    CreateTopicResult(
                        name=spec.topic, error_code=exc.code, message=clip(exc.message)
                    )
                )
                continue
            try:
                r = await self._controller().submit(spec)
            except (LogClosedError, FatalStorageError):
                self.admission.quota.release(peer.name, adding)
                raise
            except MetactlError as exc:
                self.admission.quota.release(peer.name, adding)
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

    async def create_topics(self, body: CreateTopicsRequest, peer: Peer) -> CreateTopicsResponse:
        """The partitions-per-request cap (POLICY_VIOLATION), then each topic under the
        principal's mutation quota, in order, before anything is submitted. A refusal
        before the first topic refuses the request (THROTTLING_QUOTA_EXCEEDED with a
        throttle time); a later one refuses that topic and the rest (Kafka's strict
        mode). A topic the core refuses is not charged."""
        ctl = self._controller()
        check_count("topics", len(body.topics), MAX_TOPICS_PER_REQUEST)
        counts = [requested_partitions(s, self.config.default_partitions) for s in body.topics]
        self.admission.mutation_limits.check_request(sum(counts))
        check_answer(
            "CreateTopics",
            (
                result_bytes(spec.name) + assignment_bytes(n, self.replication_factor(spec))
                for spec, n in zip(body.topics, counts, strict=True)
            ),
            self.max_frame_bytes,
        )
        results: list[CreateTopicResult] = []
        for spec, partitions in zip(body.topics, counts, strict=True):
            try:
                self.admission.quota.acquire(peer.name, partitions)
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
                self.admission.quota.release(peer.name, partitions)
                raise  # the log, not the topic: the whole request fails (and is retried)
            except MetactlError as exc:
                self.admission.quota.release(peer.name, partitions)
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

    def replication_factor(self, spec: CreateTopic) -> int:
        """The most replicas a partition of `spec` gets (for its answer's bound)."""
        if spec.assignments is not None:
            return max(map(len, spec.assignments), default=0)
        if spec.replication_factor is not None:
            return spec.replication_factor
        return self.config.default_replication_factor

    async def reassign(
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
        r = await self._controller().submit(body)
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

    async def plan(
        self, body: PlanRestartRequest | PlanRollRequest, now_ms: int
    ) -> PlanRestartResponse | PlanRollResponse:
        """A plan (`planning`) from the committed image, made in a worker thread: it steps
        a copy of the image through the core, O(the cluster's replicas), which at 100,000
        partitions takes seconds the event loop must not stall for (heartbeats go on
        meanwhile). The image is immutable, so the thread shares it safely; one plan runs
        at a time, the next waits its turn."""
        ctl = self._controller()
        image, rules = ctl.committed_image, ctl.rules
        async with self._planning:
            return await asyncio.to_thread(
                plan_answer, image, body, rules=rules, now_ms=now_ms,
                max_bytes=self.max_frame_bytes,
            )  # fmt: skip

    async def partition_request(self, request: AlterPartition | ElectLeader) -> PartitionState:
        """Submit a request answered with one partition's committed state."""
        ctl = self._controller()
        v = await ctl.submit(request)
        assert isinstance(v, PartitionView)
        return partition_state(ctl.committed_image.partitions[(v.topic, v.partition)])
