"""Kafka's APIs that move partition leaders and replicas, in metactl's admin messages
and back (pure: no IO): ElectLeaders (PREFERRED, and UNCLEAN with the replica Kafka's
request leaves to the server chosen from the image) and the partition reassignments
(AlterPartitionReassignments; ListPartitionReassignments, every page of the native list).

It must not do IO (the caller's `Call` does) or decide an election or a reassignment:
the controller does; an UNCLEAN election here only names the replica.
"""

from __future__ import annotations

from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from metactl.errors import (
    ElectionNotNeededError,
    EligibleLeadersNotAvailableError,
    InvalidReplicationFactorError,
    InvalidRequestError,
    MetactlError,
)
from metadata_image.image import ClusterImage
from protocol.kafka import framing as k
from protocol.kafka.admin.common import (
    Call,
    ask,
    coded,
    error_code,
    error_message,
    throttle_for,
)
from protocol.kafka.framing import Request
from protocol.kafka.metadata import NO_THROTTLE, make, nested
from protocol.messages.admin import (
    AlterPartitionReassignments,
    AlterPartitionReassignmentsResponse,
    ElectLeader,
    ElectPreferredLeaders,
    ElectPreferredLeadersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
    OngoingReassignment,
    Reassignment,
)
from protocol.messages.broker_controller import ReplicaRef

PREFERRED, UNCLEAN = 0, 1  # ElectLeaders' election types


# --- ElectLeaders -------------------------------------------------------------------------


def unclean_replica(image: ClusterImage | None, topic: str, partition: int) -> int | None:
    """The replica an UNCLEAN election of Kafka's (which names none) elects: a live ISR
    member, else a live eligible replica (ELR), else the first live replica in assignment
    order; None if the image does not know the partition or it has a leader (the
    controller answers those). Raises ELIGIBLE_LEADERS_NOT_AVAILABLE with no live replica."""
    p = image.partition((topic, partition)) if image is not None else None
    if p is None or p.has_leader:
        return None
    assert image is not None
    for group in (
        [r for r in p.replicas if r in p.isr],
        [r for r in p.replicas if r in p.elr],
        list(p.replicas),
    ):
        for r in group:
            if image.is_active(r):
                return r
    raise EligibleLeadersNotAvailableError(
        f"no live replica of {topic}-{partition} to elect: replicas {list(p.replicas)}"
    )


async def elect_leaders(request: Request, call: Call, image: ClusterImage | None) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.ELECT_LEADERS, version)
    topic_cls = nested(response_cls, "ReplicaElectionResult")
    partition_cls = nested(response_cls, "PartitionResult")
    kind = int(body.election_type) if version >= 1 else PREFERRED
    outcome: dict[str, dict[int, MetactlError | None]] = {}
    top: MetactlError | None = None
    if kind not in (PREFERRED, UNCLEAN):
        top = InvalidRequestError(f"unknown election type {kind}")
    elif body.topic_partitions is None:
        if kind == UNCLEAN:
            top = InvalidRequestError("an UNCLEAN election of every partition is not served")
        else:
            try:
                outcome = await _elect_all_preferred(call, image)
            except MetactlError as exc:
                top = exc
    else:
        for t in body.topic_partitions:
            for p in t.partitions:
                outcome.setdefault(str(t.topic), {})[int(p)] = await _elect_one(
                    call, image, str(t.topic), int(p), kind
                )
        codes = {
            error_code(e) for parts in outcome.values() for e in parts.values() if e is not None
        }
        # A refusal of the principal is the request's too, as Kafka answers it.
        if ErrorCode.cluster_authorization_failed in codes:
            top = next(
                e
                for parts in outcome.values()
                for e in parts.values()
                if e is not None and error_code(e) == ErrorCode.cluster_authorization_failed
            )
    results = tuple(
        topic_cls(
            topic=topic,
            partition_result=tuple(
                make(
                    partition_cls,
                    partition_id=p,
                    error_code=error_code(e),
                    error_message=error_message(e),
                )
                for p, e in sorted(parts.items())
            ),
        )
        for topic, parts in sorted(outcome.items())
    )
    if top is not None and version == 0 and not results and body.topic_partitions:
        # v0 has no top-level error: every partition named carries it.
        results = tuple(
            topic_cls(
                topic=t.topic,
                partition_result=tuple(
                    make(
                        partition_cls,
                        partition_id=p,
                        error_code=error_code(top),
                        error_message=error_message(top),
                    )
                    for p in t.partitions
                ),
            )
            for t in body.topic_partitions
        )
    return make(
        response_cls,
        throttle_time=throttle_for(top),
        error_code=error_code(top),
        replica_election_results=results,
    )


async def _elect_one(
    call: Call, image: ClusterImage | None, topic: str, partition: int, kind: int
) -> MetactlError | None:
    try:
        if kind == PREFERRED:
            await call(ElectLeader(topic=topic, partition=partition, election_type="preferred"))
        else:
            replica = unclean_replica(image, topic, partition)
            if replica is None and image is not None:
                p = image.partition((topic, partition))
                if p is not None and p.has_leader:
                    raise ElectionNotNeededError(f"{topic}-{partition} has leader {p.leader}")
            # The same request as `metactl elect --election-type unclean`: the same
            # UncleanRecoveryRecord, metric and log line (a potential data-loss event).
            await call(
                ElectLeader(topic=topic, partition=partition, election_type="unclean",
                            replica=replica)
            )  # fmt: skip
    except MetactlError as exc:
        return exc
    return None


async def _elect_all_preferred(
    call: Call, image: ClusterImage | None
) -> dict[str, dict[int, MetactlError | None]]:
    """Every partition not led by its preferred replica (Kafka leaves out those that
    need no election): one bulk ElectPreferredLeaders, its failures by partition."""
    targets: list[ReplicaRef] = []
    if image is not None:
        for name in sorted(image.topics):
            for i in range(image.topics[name].partitions):
                p = image.partition((name, i))
                if p is not None and p.replicas and p.leader != p.replicas[0]:
                    targets.append(ReplicaRef(topic=name, partition=i))
    if image is not None and not targets:
        return {}
    answer = await ask(
        call,
        ElectPreferredLeaders(partitions=targets if image is not None else None),
        ElectPreferredLeadersResponse,
    )
    failed = {
        (f.topic, f.partition): coded(f.error_code, f"{f.topic}-{f.partition}: {f.error_code}")
        for f in answer.failures
    }
    out: dict[str, dict[int, MetactlError | None]] = {}
    for ref in targets:
        out.setdefault(ref.topic, {})[ref.partition] = failed.get((ref.topic, ref.partition))
    for (topic, partition), error in failed.items():
        out.setdefault(topic, {})[partition] = error
    return out


# --- reassignments ------------------------------------------------------------------------


async def alter_reassignments(request: Request, call: Call, image: ClusterImage | None) -> Any:
    version, body = request.api_version, request.body
    response_cls: Any = load_response_schema(k.ALTER_PARTITION_REASSIGNMENTS, version)
    topic_cls = nested(response_cls, "ReassignableTopicResponse")
    partition_cls = nested(response_cls, "ReassignablePartitionResponse")
    allow_rf_change = bool(getattr(body, "allow_replication_factor_change", True))
    errors: dict[tuple[str, int], MetactlError | None] = {}
    send: list[Reassignment] = []
    for t in body.topics:
        for p in t.partitions:
            tp = (str(t.name), int(p.partition_index))
            replicas = None if p.replicas is None else [int(b) for b in p.replicas]
            state = image.partition(tp) if image is not None else None
            if tp in errors or any((r.topic, r.partition) == tp for r in send):
                errors[tp] = InvalidRequestError("the request names this partition more than once")
                continue
            if not allow_rf_change and replicas is not None and state is not None:
                original = len(state.replicas) - len(state.adding)
                if len(replicas) != original:
                    errors[tp] = InvalidReplicationFactorError(
                        f"the replication factor would change from {original} to {len(replicas)}"
                        " and allow_replication_factor_change is false"
                    )
                    continue
            send.append(Reassignment(topic=tp[0], partition=tp[1], replicas=replicas))
    top: MetactlError | None = None
    if send:
        try:
            answer = await ask(
                call, AlterPartitionReassignments(reassignments=send),
                AlterPartitionReassignmentsResponse,
            )  # fmt: skip
            for r in answer.results:
                errors.setdefault(
                    (r.topic, r.partition),
                    None if r.error_code is None else coded(r.error_code, r.message),
                )
        except MetactlError as exc:
            top = exc
            for r in send:
                errors.setdefault((r.topic, r.partition), exc)
    by_topic: dict[str, list[Any]] = {}
    for t in body.topics:
        for p in t.partitions:
            e = errors.get((str(t.name), int(p.partition_index)))
            by_topic.setdefault(str(t.name), []).append(
                partition_cls(
                    partition_index=p.partition_index,
                    error_code=error_code(e),
                    error_message=error_message(e),
                )
            )
    return make(
        response_cls,
        throttle_time=throttle_for(top),
        allow_replication_factor_change=allow_rf_change,
        error_code=error_code(top),
        error_message=error_message(top),
        responses=tuple(
            topic_cls(name=name, partitions=tuple(parts)) for name, parts in by_topic.items()
        ),
    )


async def list_reassignments(request: Request, call: Call) -> Any:
    body = request.body
    response_cls: Any = load_response_schema(k.LIST_PARTITION_REASSIGNMENTS, request.api_version)
    topic_cls = nested(response_cls, "OngoingTopicReassignment")
    partition_cls = nested(response_cls, "OngoingPartitionReassignment")
    wanted: dict[str, set[int]] | None = (
        None
        if body.topics is None
        else {str(t.name): {int(i) for i in t.partition_indexes} for t in body.topics}
    )
    found: list[OngoingReassignment] = []
    native = ListPartitionReassignmentsRequest(
        v=2, topics=None if wanted is None else sorted(wanted)
    )
    error: MetactlError | None = None
    try:
        last: tuple[str, int] | None = None
        while True:
            answer = await ask(call, native, ListPartitionReassignmentsResponse)
            found.extend(answer.reassignments)
            cursor = answer.next_cursor
            if cursor is None:
                break
            if last is not None and (cursor.topic, cursor.partition) <= last:
                raise InvalidRequestError("the controller's list went back")
            last = (cursor.topic, cursor.partition)
            native = ListPartitionReassignmentsRequest(v=2, topics=native.topics, cursor=cursor)
    except MetactlError as exc:
        error, found = exc, []
    by_topic: dict[str, list[Any]] = {}
    for o in found:
        if wanted is not None and o.partition not in wanted.get(o.topic, set()):
            continue
        by_topic.setdefault(o.topic, []).append(
            partition_cls(
                partition_index=o.partition,
                replicas=tuple(o.replicas),
                adding_replicas=tuple(o.adding_replicas),
                removing_replicas=tuple(o.removing_replicas),
            )
        )
    return make(
        response_cls,
        throttle_time=NO_THROTTLE,
        error_code=error_code(error),
        error_message=error_message(error),
        topics=tuple(topic_cls(name=n, partitions=tuple(ps)) for n, ps in by_topic.items()),
    )
