"""Pure handlers of topic creation and replica placement: CreateTopic (rule 9), in
slices of a work budget of partitions when it is large (`create_topic_slice`, inside one
transaction), the striped, rack-alternating placement over the active brokers
(`broker_order`), and the checks of an explicit assignment (`check_explicit`). Adding
partitions (`controller.core.lifecycle`) places them the same way.

Every field is first checked against the range Kafka gives it
(`controller.core.validation`); a refusal raises a coded `MetactlError` before any record
exists. A topic id comes in on the event (the driver draws it); a caller without
randomness gets one derived from the name and the offset.

Must not: read a clock, draw randomness, do IO, or change an image.
"""

from __future__ import annotations

import uuid
from typing import Final

import msgspec

from controller.core import validation
from controller.core.config import ControllerConfig
from controller.core.handler_result import CreateTopicSlice, HandlerResult
from metactl.errors import (
    InvalidReplicaAssignmentError,
    InvalidRequestError,
    TopicAlreadyExistsError,
    UnknownRecoveryPolicyError,
)
from metadata_image.image import ClusterImage
from metadata_log.records import MetadataRecord, PartitionRecord, TopicRecord
from protocol.messages.admin import CreateTopic
from protocol.messages.internal import Ack, CreateTopicResponse

# Topic ids are random UUIDs the driver draws for each CreateTopic (the event carries it,
# so handlers stay pure); callers without randomness get one derived from name and offset.
_TOPIC_ID_NAMESPACE: Final = uuid.UUID("5f1b2a3c-0966-4e6d-8a11-6d657461637c")


def _striped(order: tuple[int, ...], start: int, end: int, rf: int) -> list[list[int]]:
    """Partitions [start, end) of the striped round-robin placement over `order`.

    The placement repeats every `len(order)` partitions, so each of its rotations is made
    once and shared by the partitions it places: treat the lists as read-only."""
    n = len(order)
    if end - start <= n:
        # Fewer partitions than brokers (a topic on a large cluster): only their own
        # rotations, not all n of them.
        return [[order[(p + j) % n] for j in range(rf)] for p in range(start, end)]
    rotations = [[order[(p + j) % n] for j in range(rf)] for p in range(n)]
    first = start % n
    period = rotations[first:] + rotations[:first]  # from partition `start` on
    return (period * ((end - start) // n + 1))[: end - start]  # repeated in C


def broker_order(image: ClusterImage) -> tuple[int, ...]:
    """The active brokers in placement order: with racks, the list alternates racks so
    that consecutive replicas land in different racks where possible."""
    active = sorted(image.active)
    racks: dict[str, list[int]] = {}
    for bid in active:
        racks.setdefault(image.brokers[bid].rack or "", []).append(bid)
    if len(racks) > 1:
        ordered: list[int] = []
        columns = [racks[r] for r in sorted(racks)]
        for i in range(max(len(c) for c in columns)):
            ordered.extend(c[i] for c in columns if i < len(c))
        active = ordered
    return tuple(active)


def check_explicit(image: ClusterImage, assignments: list[list[int]], first: int = 0) -> None:
    """Explicit assignments of partitions `first` on: valid broker ids, each list
    non-empty and distinct, every broker registered, at least one active per partition."""
    validation.check_assignment_ids(assignments)
    for i, a in enumerate(assignments, first):
        if not a or len(set(a)) != len(a):
            raise InvalidReplicaAssignmentError(
                f"partition {i}: replicas must be non-empty and distinct, got {a}"
            )
        unknown = [r for r in a if r not in image.brokers]
        if unknown:
            raise InvalidReplicaAssignmentError(f"partition {i}: unknown broker(s) {unknown}")
        if not any(image.is_active(r) for r in a):
            raise InvalidReplicaAssignmentError(f"partition {i}: no active replica in {a}")


def create_topic(
    image: ClusterImage,
    req: CreateTopic,
    now_ms: int,
    config: ControllerConfig,
    known_strategies: frozenset[str] = frozenset(),
    *,
    slice_partitions: int | None = None,
) -> HandlerResult:
    """Rule 9.

    With `slice_partitions`, a topic of more partitions is created in slices of that many
    (the step wraps them in one transaction): this call validates the whole request and
    writes the TopicRecord and the first slice, and its result's `follow_up` is the rest
    (`create_topic_slice`). Striped placement is then computed slice by slice.
    """
    validation.check_topic_name(req.name)
    if req.name in image.topics:
        raise TopicAlreadyExistsError(f"topic {req.name} already exists")
    if req.recovery_strategy is not None and req.recovery_strategy not in known_strategies:
        raise UnknownRecoveryPolicyError(
            f"unknown unclean recovery strategy {req.recovery_strategy!r}; "
            f"known: {', '.join(sorted(known_strategies))}"
        )
    min_isr = (
        req.min_isr
        if req.min_isr is not None
        else image.cluster_min_isr(config.default_min_insync_replicas)
    )
    validation.check_min_isr(min_isr)
    order: tuple[int, ...] = ()
    rf = 0
    explicit: list[list[int]] | None = None
    if req.assignments is not None:
        assignments = explicit = [list(a) for a in req.assignments]
        partitions = len(assignments)
        if not assignments:
            raise InvalidReplicaAssignmentError("an explicit assignment needs a partition")
        if req.partitions is not None and req.partitions != len(assignments):
            raise InvalidRequestError("partitions does not match the explicit assignment")
        check_explicit(image, assignments)
    else:
        partitions = req.partitions if req.partitions is not None else config.default_partitions
        validation.check_partition_count(partitions)
        rf = (
            req.replication_factor
            if req.replication_factor is not None
            else config.default_replication_factor
        )
        validation.check_replication_factor(rf, len(image.active))
        order = broker_order(image)
        # The first slice: every striped assignment has the same length (for the checks).
        assignments = _striped(order, 0, min(partitions, slice_partitions or partitions), rf)
    # A min.insync.replicas above the replication factor is accepted, as in Kafka: each
    # partition's effective MinISR is capped at its replication factor.
    if req.topic_id is not None:
        validation.check_topic_id(req.topic_id)
        topic_id = req.topic_id
        if topic_id in image.topic_ids:
            raise TopicAlreadyExistsError(f"topic id {topic_id} is taken; retry the create")
    else:
        # A caller without randomness (a seeded simulation): derived from the name and
        # offset, so unique within this log. The controller's driver always draws one.
        topic_id = str(uuid.uuid5(_TOPIC_ID_NAMESPACE, f"{req.name}@{image.end_offset}"))
    plan = CreateTopicSlice(
        name=req.name,
        topic_id=topic_id,
        partitions=partitions,
        min_isr=min_isr,
        start=0,
        assignments=explicit,
        brokers=order,
        replication_factor=rf,
    )
    topic = TopicRecord(
        name=req.name,
        topic_id=topic_id,
        partitions=plan.partitions,
        min_isr=req.min_isr,
        recovery_strategy=req.recovery_strategy,
    )
    first = create_topic_slice(image, plan, slice_partitions, placed=assignments)
    return HandlerResult([topic, *first.records], first.response, first.follow_up)


def create_topic_slice(
    image: ClusterImage,
    s: CreateTopicSlice,
    slice_partitions: int | None = None,
    *,
    placed: list[list[int]] | None = None,
) -> HandlerResult:
    """The PartitionRecords of partitions [s.start, s.start + slice_partitions) of a topic
    `create_topic` validated, and the next slice, if any partitions remain; the last slice
    answers with the whole topic's placement. `placed` is this slice's striped placement
    when the caller already computed it."""
    end = s.partitions
    if slice_partitions is not None:
        end = min(end, s.start + slice_partitions)
    if s.assignments is not None:
        part = s.assignments[s.start - s.first : end - s.first]
    elif placed is not None:
        part = placed
    else:
        part = _striped(s.brokers, s.start, end, s.replication_factor)
    records: list[MetadataRecord] = []
    append = records.append
    replace = msgspec.structs.replace
    live = image.active
    # Placement repeats a few assignments (striped placement shares one list per
    # rotation): each one's record is made once and restamped with the partition number.
    shapes: dict[object, PartitionRecord] = {}
    for i, a in enumerate(part, s.start):
        key = id(a) if s.assignments is None else tuple(a)
        proto = shapes.get(key)
        if proto is None:
            isr = [r for r in a if r in live]
            proto = shapes[key] = PartitionRecord(
                topic=s.name,
                partition=i,
                replicas=a,
                isr=sorted(isr),
                leader=isr[0],
                min_isr=min(s.min_isr, len(a)),
            )
            append(proto)
        else:
            append(replace(proto, partition=i))
    done = s.placed if s.assignments is not None else (*s.placed, part)
    if end < s.partitions:
        rest = msgspec.structs.replace(s, start=end, placed=done)
        return HandlerResult(records, Ack(), rest)
    assignments = (
        s.assignments if s.assignments is not None else [a for chunk in done for a in chunk]
    )
    return HandlerResult(
        records, CreateTopicResponse(name=s.name, topic_id=s.topic_id, assignments=assignments)
    )
